"""Two tensor-parallel ranks on CPU (torch.distributed gloo, two spawned processes): each computes
its shard of a row-parallel projection, the partial sums are all-reduced into the router input, and
BASE's core selection runs on every rank for a few hundred decode steps with mixed per-request
budgets and padded rows. Every step and MoE layer the ranks all-gather digests of the router input
and of the kept ids and weights: they must agree bit for bit. The fault runs show the check fails
when one rank's input differs (one ulp, or a reduction whose order depends on the rank).
Harness: base_sglang/testing/tp_sim.py; the real plugin hook: tests/plugin/test_tp_hook_agreement.py.
"""

from __future__ import annotations

import pytest

from base_sglang.testing.tp_sim import TPSimConfig, run


def test_two_ranks_keep_the_same_experts_and_weights_bit_for_bit(tmp_path):
    ranks = run(TPSimConfig(steps=300), tmp_path, timeout=90)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["steps"] == 300 and r["layers"] == 4
        assert r["steps_differing"] == {"router_input": 0, "ids": 0, "weights": 0}
        assert r["agree"] is True and r["first_mismatch"] is None
    r0 = ranks[0]
    assert r0["max_abs_err_vs_tp1"] < 1e-4  # the shards really are a split of the TP=1 layer
    assert r0["padded_rows"] > 0  # padded rows (rank-local garbage in them) were in the batches
    assert r0["mean_kept"] < r0["mean_union"] - 3  # budgets dropped experts: not a vacuous check
    assert r0["select_fn"] == "base_sglang.core.select_experts"


@pytest.mark.parametrize("fault", ["last_bit", "rank_order_reduce"])
def test_the_check_fails_when_one_rank_sees_different_bits(tmp_path, fault):
    ranks = run(TPSimConfig(steps=40, fault=fault), tmp_path, timeout=90)
    for r in ranks:  # every rank reaches the same verdict from the all-gathered digests
        assert r["agree"] is False
        assert r["steps_differing"]["router_input"] > 0
        assert r["steps_differing"]["weights"] > 0  # the kept weights differ: the TP sum mixes them
    first = ranks[0]["first_mismatch"]
    assert first == ranks[1]["first_mismatch"]
    assert first["field"] == "router_input" and first["values"][0] != first["values"][1]


def test_bad_simulation_settings_are_named():
    with pytest.raises(ValueError, match="selector"):
        TPSimConfig(selector="triton")
    with pytest.raises(ValueError, match="fault"):
        TPSimConfig(fault="flip")
    with pytest.raises(ValueError, match="inter"):
        TPSimConfig(inter=6)
