"""No host synchronisation or data-dependent shapes: every policy that must be CUDA-graph safe runs
on the meta device, where any .item(), nonzero or unique raises."""

import pytest
import torch
from core_helpers import make_predictor

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 8, 12, 4, 16


def _select_on_meta(config: SelectionConfig, norm: bool = True):
    """One selection call on meta tensors: anything data-dependent on the host raises."""
    meta = torch.device("meta")
    pred = make_predictor(E, H, K).to(meta)
    return select_experts(
        torch.empty(T, E, device=meta), torch.empty(T, K, dtype=torch.int32, device=meta),
        torch.empty(T, K, device=meta), torch.empty(T, H, device=meta),
        torch.empty(T, dtype=torch.int64, device=meta), 0, config, pred,
        norm_topk_prob=norm, routed_norms=torch.empty(T, K, device=meta))


@pytest.mark.parametrize("kw", [{}, dict(renorm="never"),
                                dict(fold_max_loss=0.9, fold_fallback="backfill")])
def test_base_fold_runs_on_meta_tensors(kw):
    sel = _select_on_meta(SelectionConfig(policy="base_fold", **kw))
    assert sel.ids.shape == (T, K) and sel.ids.dtype == torch.int32
    assert sel.stats.num_kept.shape == ()


@pytest.mark.parametrize("policy", ["dense", "base_plus", "base", "oracle", "oea", "gate_sum",
                                    "frequency", "lynx", "exfold"])
@pytest.mark.parametrize("backfill", [True, False])
@pytest.mark.parametrize("renorm, alpha, norm", [("native", 0.5, True), ("partial", 0.0, False),
                                                 ("partial", 0.5, False), ("partial", 1.0, True)])
def test_policy_runs_on_meta_tensors(policy, backfill, renorm, alpha, norm):
    sel = _select_on_meta(SelectionConfig(policy=policy, backfill=backfill, renorm=renorm,
                                          renorm_alpha=alpha), norm)
    assert sel.ids.shape == (T, K) and sel.ids.dtype == torch.int32
    assert sel.weights.shape == (T, K)
    assert sel.stats.num_kept.shape == ()
