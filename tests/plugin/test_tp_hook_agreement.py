"""Two tensor-parallel ranks on CPU (gloo), each an SGLang-like TP worker process that loads the
installed plugins and runs the real TopK of sglang with BASE's hook (`hooks.around_topk`) inside the
plugin's decode step (harness: base_sglang/testing/tp_sim.py): 300 decode steps of mixed
per-request budgets and padded rows, then 40 in which rank 1's router input differs in one bit.
Besides the in-process all-gather check, each rank's plugin writes BASE_SELECTION_TRACE, and
`compare_traces` (what bench_tp.py runs on the GPUs) reads the two files back.
"""

from __future__ import annotations

from base_sglang.plugin.selection_trace import compare_traces, trace_path
from base_sglang.testing.tp_sim import TPSimConfig, run

CLEAN, FAULTY = 300, 40


def test_hook_ranks_agree_bit_for_bit_and_the_trace_files_show_when_they_stop(tmp_path):
    prefix = tmp_path / "trace" / "sel"
    cfg = TPSimConfig(steps=CLEAN + FAULTY, selector="hook", fault="last_bit",
                      fault_from_step=CLEAN, trace_prefix=str(prefix))
    ranks = run(cfg, tmp_path / "run", timeout=150)
    r0 = ranks[0]
    assert r0["select_fn"].startswith("plugin hook on sglang TopK")
    assert r0["mean_kept"] < r0["mean_union"] - 3  # budgets dropped experts: not vacuous
    assert r0["padded_rows"] > 0
    for r in ranks:  # bit-for-bit agreement in every clean step, divergence after
        assert r["first_mismatch"]["step"] >= CLEAN, r["first_mismatch"]
        assert r["steps_differing"]["weights"] > 0
    files = [trace_path(str(prefix), r) for r in range(2)]
    for f in files:  # the clean part of each rank's file on its own
        (tmp_path / f"clean.{f.name}").write_text(
            "".join(f.read_text().splitlines(keepends=True)[:CLEAN]))
    clean = compare_traces([tmp_path / f"clean.{f.name}" for f in files])
    assert clean["ranks_agree"] is True, clean
    assert (clean["steps_compared"], clean["layers"], clean["modes"]) == (CLEAN, 4, {"eager": CLEAN})
    assert clean["problems"] == []
    full = compare_traces(files)
    assert full["ranks_agree"] is False and full["steps_compared"] == CLEAN + FAULTY
    assert full["first_mismatch"]["step"] >= CLEAN
    assert full["first_mismatch"]["field"] in ("ids", "weights")
    # the files tell the same story as the in-process all-gather of the digests
    assert full["mismatch_counts"]["weights"] == r0["steps_differing"]["weights"]
    assert full["mismatch_counts"]["ids"] == r0["steps_differing"]["ids"]
    assert full["mismatch_counts"]["budgets"] == full["mismatch_counts"]["rows"] == 0


def test_bench_tp_sglang_flags_exist_in_this_sglang():
    """bench_tp.py's --tp-size/--nccl-port/--enforce-disable-flashinfer-allreduce-fusion argv
    parses with this sglang's own ServerArgs parser, and SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 (the
    switch run_tp2_h200.sh turns off) is one of its environment variables."""
    import argparse
    import importlib
    import sys
    from pathlib import Path

    from sglang.srt import environ
    from sglang.srt.server_args import ServerArgs

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    bench_tp = importlib.import_module("bench_tp")
    bench_decode = importlib.import_module("bench_decode")
    args = bench_tp.parse_args(["--out", "unused"])
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(bench_decode.sglang_argv(bench_tp.with_tp_args(args, 29512)))
    assert (ns.tp_size, ns.nccl_port, ns.enforce_disable_flashinfer_allreduce_fusion) == \
        (2, 29512, True)
    for name in bench_tp.SGLANG_ENV:
        assert hasattr(environ.envs, name), name


def test_bench_tp_agreement_phase_end_to_end_on_cpu(base_state, tmp_path, monkeypatch):
    """bench_tp.agreement_phase as the GPU ranks run it, minus the GPU model: sglang's own synthetic
    requests, bench_tp's per-request budgets in their custom_params, the real ForwardBatch hooks,
    the plugin's decode step and a real TopK per MoE layer with the hook, the per-rank trace and
    its comparison. The model forward is a stand-in (a real one needs a GPU): random router
    inputs, seeded by the step, the same for both "ranks" (run one after the other here)."""
    import importlib
    import sys
    from contextlib import nullcontext
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from plugin_helpers import NUM_LAYERS, E, H, K, forward_batch, model_runner
    from sglang.srt.layers.moe.topk import TopK
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from base_sglang.plugin import hooks, selection_trace, state

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    bench_tp = importlib.import_module("bench_tp")
    try:
        import sglang.benchmark.one_batch as ob
    except ImportError:
        import sglang.bench_one_batch as ob
    out = tmp_path / "out"
    args = bench_tp.parse_args(["--out", str(out), "--agree-batches", "3", "6", "--agree-steps",
                                "5", "--agree-eager-steps", "2", "--agree-budgets", "1", "2", "3",
                                "--agree-dense-rate", "0.1", "--input-len", "4"])
    monkeypatch.setenv(selection_trace.ENV, str(bench_tp.trace_prefix(out)))
    topks = [TopK(top_k=K, layer_id=layer, renormalize=True) for layer in range(NUM_LAYERS)]
    seen = []

    class Runner:  # one_batch's runner interface; decode goes through the real hooks
        def clear(self):
            self.step = 0

        def extend(self, reqs):
            return torch.zeros(len(reqs), dtype=torch.int64), None, SimpleNamespace(reqs=reqs)

        def decode(self, next_ids, batch):
            n = len(batch.reqs)
            fb = forward_batch(ForwardMode.DECODE, n)
            hooks.after_forward_batch_init(fb, None, batch, model_runner())
            seen.append(list(fb.base_budgets))
            g = torch.Generator().manual_seed(1000 * n + self.step)
            self.step += 1

            def forward(_runner, _fb):
                for topk in topks:
                    topk(torch.randn(n, H, generator=g), torch.randn(n, E, generator=g))

            hooks.around_forward_raw(forward, model_runner(), fb)
            return next_ids, None

    runner = Runner()
    bench = SimpleNamespace(runner=runner, ob=ob, state=state, eager=nullcontext,
                            sync=lambda: None, decode=lambda ids, b: runner.decode(ids, b)[0])
    results = {}
    for rank in (1, 0):  # rank 0 compares, after the barrier, once both files are complete
        monkeypatch.setattr(selection_trace, "_rank", lambda rank=rank: rank)
        base_state.sel_trace = selection_trace.SelectionTrace.from_env(NUM_LAYERS)
        seen.clear()
        results[rank] = bench_tp.agreement_phase(bench, args, rank, config={})
        assert base_state.sel_trace.writing is False  # paused for the timed sweep
    assert results[1] is None
    res = results[0]
    assert res["ranks_agree"] is True, res
    assert res["steps_compared"] == 2 * (5 + 2) and res["layers"] == NUM_LAYERS
    want = [bench_tp.step_budgets(args, B, s, E) for B in (3, 6) for s in range(7)]
    assert seen == want  # every request's own budget reached the plugin, every step
    assert len({b for x in want for b in x}) >= 3  # mixed
    recs = selection_trace.read_trace(selection_trace.trace_path(str(bench_tp.trace_prefix(out)), 0))
    assert [r["budgets"] for r in recs] == want
