"""The CPU-testable parts of the tensor-parallel GPU run (issue 17): the plugin's per-rank selection
trace (BASE_SELECTION_TRACE) and its comparison, bench_tp.py's arguments, budgets, result merge and
report, the TP summary schema, the profile's all-reduce class and per-rank byte floors, and
run_tp2_h200.sh's guards. What needs two GPUs runs on the device (run_tp2_h200.sh)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from base_sglang.core import Predictor, PredictorMeta
from base_sglang.plugin import selection_trace as trace_mod
from base_sglang.plugin.config import PluginConfig
from base_sglang.plugin.selection_trace import (
    compare_traces,
    read_trace,
    selection_digest,
    trace_path,
)
from base_sglang.plugin.state import PluginState

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))
common = importlib.import_module("common")
bench_tp = importlib.import_module("bench_tp")
step_profile = importlib.import_module("step_profile")
summary_schema = importlib.import_module("summary_schema")


# ---- digests ------------------------------------------------------------------------------------
def test_digest_is_equal_iff_the_bytes_are():
    ids = torch.tensor([[3, 1], [-1, -1]], dtype=torch.int32)
    w = torch.tensor([[0.75, 0.25], [0.0, 0.0]])
    a = selection_digest(ids, w)
    assert a == selection_digest(ids.clone(), w.clone())
    assert all(len(d) == 16 and int(d, 16) >= 0 for d in a)
    flipped = w.clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # one ulp
    assert selection_digest(ids, flipped)[0] == a[0] and selection_digest(ids, flipped)[1] != a[1]
    assert selection_digest(ids, -w)[1] != a[1]  # -0.0 is not 0.0 in bits
    assert selection_digest(ids.long(), w)[0] != a[0]  # dtype is part of the digest
    assert selection_digest(ids.flip(0), w)[0] != a[0]


# ---- the trace inside the plugin's state -----------------------------------------------------------
def _state(monkeypatch, prefix=None, rows=8):
    if prefix is None:
        monkeypatch.delenv(trace_mod.ENV, raising=False)
    else:
        monkeypatch.setenv(trace_mod.ENV, str(prefix))
    meta = PredictorMeta(architecture="qwen3_moe", model_id="t", num_layers=2, moe_layers=[0, 1],
                         hidden_size=4, num_experts=8, top_k=2)
    st = PluginState()
    st.enable(Predictor(meta, torch.zeros(2, 8, 4), torch.zeros(2, 8)),
              PluginConfig(predictor="x", stats_interval=0), "cpu")
    st.ensure_buffer(rows, "cpu")
    return st


def _sel(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 8, (n, 2), generator=g, dtype=torch.int32), torch.rand(n, 2, generator=g)


def test_trace_is_off_by_default(monkeypatch):
    assert _state(monkeypatch).sel_trace is None


def test_eager_steps_write_one_line_each_with_the_real_rows_digested(tmp_path, monkeypatch):
    st = _state(monkeypatch, tmp_path / "t" / "sel")
    assert st.sel_trace.path == tmp_path / "t" / "sel.rank0.jsonl"  # no process group: rank 0
    sels = []
    for step, budgets in enumerate(([3, 5], [2, 2, 7])):
        with st.decode_step(budgets):
            pair = [_sel(4, 10 * step + slot) for slot in range(2)]  # 4 rows: padded
            for slot, (ids, w) in enumerate(pair):
                st.sel_trace.keep(slot, ids, w)
        sels.append((budgets, pair))
    recs = read_trace(st.sel_trace.path)
    assert [r["step"] for r in recs] == [0, 1] and [r["mode"] for r in recs] == ["eager"] * 2
    for rec, (budgets, pair) in zip(recs, sels):
        n = len(budgets)
        assert rec["rows"] == n and rec["budgets"] == budgets
        want = [selection_digest(ids[:n], w[:n]) for ids, w in pair]
        assert rec["ids"] == [d[0] for d in want] and rec["weights"] == [d[1] for d in want]


def test_paused_trace_writes_nothing_and_a_new_process_starts_a_fresh_file(tmp_path, monkeypatch):
    prefix = tmp_path / "sel"
    trace_path(str(prefix), 0).write_text("old line\n")
    st = _state(monkeypatch, prefix)
    assert trace_path(str(prefix), 0).read_text() == ""
    st.sel_trace.writing = False
    with st.decode_step([1]):
        st.sel_trace.keep(0, *_sel(1, 0))
    assert trace_path(str(prefix), 0).read_text() == ""


def test_graph_replays_read_the_tensors_of_the_graph_that_ran(tmp_path, monkeypatch):
    """Captured graphs: the hook runs once per captured size; a replay writes new values into the
    same tensors without running Python. Emulated: keep() under a capturing stream, then in-place
    writes and decode steps in which the hook does not run."""
    st = _state(monkeypatch, tmp_path / "sel", rows=32)
    captured = {}
    monkeypatch.setattr(trace_mod, "_capturing", lambda t: True)
    for n in (16, 8):  # SGLang captures the sizes in some order; each is kept
        for slot in range(2):
            captured[(n, slot)] = _sel(n, n + slot)
            st.sel_trace.keep(slot, *captured[(n, slot)])
    monkeypatch.setattr(trace_mod, "_capturing", lambda t: False)
    for rows, n in ((5, 8), (8, 8), (11, 16)):  # replays pad to the smallest captured size >= rows
        for slot in range(2):
            ids, w = captured[(n, slot)]
            ids.copy_(_sel(n, 100 + rows + slot)[0])  # what this replay wrote
            w.copy_(_sel(n, 100 + rows + slot)[1])
        with st.decode_step([4] * rows):
            pass  # graph replay: no hook call
        rec = read_trace(st.sel_trace.path)[-1]
        assert rec["mode"] == "graph" and rec["rows"] == rows
        assert rec["ids"] == [selection_digest(*[t[:rows] for t in captured[(n, s)]])[0]
                              for s in range(2)]
    with st.decode_step([4] * 17):  # larger than any captured graph: nothing to read
        pass
    assert read_trace(st.sel_trace.path)[-1]["ids"] == [None, None]


# ---- comparing the ranks' files ------------------------------------------------------------------
def _rec(step, rows=4, ids=("a", "b"), weights=("c", "d"), budgets=None, mode="graph"):
    return {"step": step, "rows": rows, "budgets": budgets or [8] * rows, "mode": mode,
            "ids": list(ids), "weights": list(weights)}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _varying(n):
    return [_rec(s, ids=(f"i{s}", f"j{s}"), weights=(f"w{s}", f"v{s}")) for s in range(n)]


def test_identical_traces_agree(tmp_path):
    recs = _varying(12)
    res = compare_traces([_write(tmp_path / "a", recs), _write(tmp_path / "b", recs)])
    assert res["ranks_agree"] is True and res["steps_compared"] == 12 and res["layers"] == 2
    assert res["first_mismatch"] is None and res["modes"] == {"graph": 12}


def test_one_differing_weight_digest_is_found(tmp_path):
    a, b = _varying(12), _varying(12)
    b[7]["weights"][1] = "zz"
    b[9]["ids"][0] = "yy"
    res = compare_traces([_write(tmp_path / "a", a), _write(tmp_path / "b", b)])
    assert res["ranks_agree"] is False and res["mismatched_steps"] == 2
    assert res["first_mismatch"] == {"step": 7, "field": "weights", "layer": 1,
                                     "values": ["v7", "zz"]}
    assert res["mismatch_counts"]["weights"] == 1 and res["mismatch_counts"]["ids"] == 1


@pytest.mark.parametrize("change, problem", [
    (lambda b: b.pop(), "different numbers of steps"),
    (lambda b: b[0].__setitem__("ids", [None, "x"]), "recorded no selection"),
])
def test_broken_traces_never_agree(tmp_path, change, problem):
    a, b = _varying(12), _varying(12)
    change(b)
    res = compare_traces([_write(tmp_path / "a", a), _write(tmp_path / "b", b)])
    assert res["ranks_agree"] is False
    assert any(problem in p for p in res["problems"]), res["problems"]


def test_budgets_rows_or_mode_that_differ_are_mismatches(tmp_path):
    for key, val in (("budgets", [8, 8, 8, 4]), ("rows", 3), ("mode", "eager")):
        a, b = _varying(3), _varying(3)
        b[1][key] = val
        res = compare_traces([_write(tmp_path / "a", a), _write(tmp_path / "b", b)])
        assert res["first_mismatch"]["field"] == key and res["mismatch_counts"][key] == 1


def test_digests_that_never_change_are_stale_not_agreement(tmp_path):
    recs = [_rec(s) for s in range(12)]  # same digests in every step of the same batch
    res = compare_traces([_write(tmp_path / "a", recs), _write(tmp_path / "b", recs)])
    assert res["ranks_agree"] is False and "stale" in res["problems"][0]


def test_bad_trace_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="at least 2 ranks"):
        compare_traces([tmp_path / "a"])
    (tmp_path / "bad").write_text(json.dumps(_rec(0)) + "\n{nope\n")
    with pytest.raises(ValueError, match="bad:2: not JSON"):
        read_trace(tmp_path / "bad")
    (tmp_path / "short").write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="short:1: record lacks"):
        read_trace(tmp_path / "short")


# ---- bench_tp.py ----------------------------------------------------------------------------------
def test_bench_tp_defaults(tmp_path):
    args = bench_tp.parse_args(["--out", str(tmp_path)])
    assert (args.tp, args.batches, args.budgets) == (2, [16, 32, 64], ["dense", 8, 10, 16])
    assert args.profile_batch == 16 and args.profile_budgets == ["dense", 16, 10]
    assert args.agree_batches == [11, 27, 50] and args.agree_budgets == [4, 8, 10, 16, 32]
    assert args.plugin == "on" and args.time_budget == 240
    argv = bench_tp.bench_decode.sglang_argv(bench_tp.with_tp_args(args, 4242))
    assert argv[-5:] == ["--tp-size", "2", "--nccl-port", "4242",
                         "--enforce-disable-flashinfer-allreduce-fusion"]
    one = bench_tp.parse_args(["--out", "x", "--tp", "1", "--batches", "8", "--profile-batch", "0"])
    assert one.batches == [8] and "--enforce-disable-flashinfer-allreduce-fusion" not in \
        bench_tp.bench_decode.sglang_argv(bench_tp.with_tp_args(one, 1))
    assert bench_tp.parse_args(["--out", "x", "--agree-budgets", "dense", "3"]).agree_budgets \
        == [128, 3]


@pytest.mark.parametrize("argv, message", [
    (["--tp", "0"], "--tp"),
    (["--agree-batches", "65"], "--agree-batches"),
    (["--agree-budgets", "0"], "--agree-budgets"),
    (["--agree-dense-rate", "1.5"], "--agree-dense-rate"),
    (["--agree-steps", "-1"], "--agree-steps"),
    (["--rank-timeout", "0"], "--rank-timeout"),
    (["--plugin", "off"], "--plugin"),
    (["--report"], "--finalize"),
    (["--budgets", "banana"], "--budgets"),
    (["--", "--enable-symm-mem"], "multicast"),
    (["--", "--flashinfer-allreduce-fusion-backend=mnnvl"], "multicast"),
])
def test_bench_tp_bad_arguments_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_tp.parse_args(["--out", "x", *argv])
    assert message in capsys.readouterr().err


def test_step_budgets_are_the_same_on_every_rank_and_mixed(tmp_path):
    args = bench_tp.parse_args(["--out", str(tmp_path)])
    a = [bench_tp.step_budgets(args, 27, s, 128) for s in range(50)]
    assert a == [bench_tp.step_budgets(args, 27, s, 128) for s in range(50)]
    assert all(len(x) == 27 and set(x) <= {4, 8, 10, 16, 32, 128} for x in a)
    assert len({b for x in a for b in x}) == 6 and len({tuple(x) for x in a}) == 50
    script = (f"import sys; sys.path.insert(0, {str(GPU_DIR)!r}); import bench_tp; "
              "a = bench_tp.parse_args(['--out', 'x']); print(bench_tp.step_budgets(a, 27, 3, 128))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, cwd=REPO, env={"PYTHONHASHSEED": "7", "PATH": ""})
    assert json.loads(other.stdout) == a[3]  # another process (another hash seed) draws the same
    args.agree_dense_rate = 1.0
    assert set(bench_tp.step_budgets(args, 5, 0, 128)) == {128}


def test_bench_tp_dry_run_and_no_gpu(tmp_path, capsys):
    base = ["--out", str(tmp_path / "out"), "--model-dir", str(tmp_path / "m"),
            "--predictor", str(tmp_path / "p.safetensors"), "--nccl-port", "4321"]
    assert bench_tp.main([*base, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("--tp-size 2 --nccl-port 4321") == 2 and "rank 1 (gpu 1, tp_rank 1)" in out
    assert "trace/sel.rank<R>.jsonl" in out and (tmp_path / "p.safetensors").is_file()
    if not torch.cuda.is_available():
        assert bench_tp.main(base) == 2
        assert "no CUDA device" in capsys.readouterr().out


# ---- summary schema, finalize, report ----------------------------------------------------------------
def _summary(rows, tp=None, **extra):
    obj = {"gpu": "NVIDIA H200", "sglang_version": "0.5.17", "torch": "2.11.0", "commit": "abc",
           "model_shape": "qwen3-30b-a3b", "weights": "dummy", "cuda_graph": True,
           "routing": "uniform-random", "rows": rows, **extra}
    if tp is not None:
        obj["tp"] = tp
    return obj


def _row(batch, budget, tok_s, epl, union=83.0):
    return {"batch": batch, "budget": budget, "decode_tok_s": tok_s, "experts_per_layer": epl,
            "union_dense": union}


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o.pop("tp"), "missing field 'tp'"),
    (lambda o: o.update(tp=1), "tp: must be >= 2"),
    (lambda o: o.update(ranks_agree=1), "ranks_agree: must be bool"),
    (lambda o: o.update(steps_compared=True), "steps_compared: must be int"),
    (lambda o: o.update(steps_compared=0), "nothing was compared"),
    (lambda o: o.update(cuda_graph=False), "cuda_graph"),
])
def test_tp_schema_violations_name_the_field(mutate, message):
    obj = _summary([_row(16, "dense", 1500.0, 83.0)], tp=2, ranks_agree=True, steps_compared=312)
    summary_schema.validate_tp_summary(obj)
    mutate(obj)
    with pytest.raises(ValueError, match=message):
        summary_schema.validate_tp_summary(obj)


def _profile(moe, base, ar, busy_rest=1.0, step=None):
    cats = dict.fromkeys(step_profile.CATEGORIES, 0.0)
    cats.update(moe_experts=moe, base_select=base, allreduce=ar, attention=busy_rest)
    return {"batch": 16, "graph_step_ms": step or sum(cats.values()) + 0.3,
            "graph_kernels": {"gpu_ms_per_step": cats}, "byte_floor": {"total_floor_ms": 1.0}}


def test_finalize_adds_the_single_gpu_comparison_and_validates(tmp_path, capsys):
    # made-up numbers in the files' format: what finalize computes from them is checked
    tp_rows = [_row(16, "dense", 2000.0, 83.0), _row(16, 16, 3000.0, 16.0)]
    common.write_json(tmp_path / "summary.json", _summary(
        tp_rows, tp=2, ranks_agree=True, steps_compared=312,
        agreement={"layers": 48, "modes": {"graph": 300, "eager": 12}, "mismatched_steps": 0}))
    common.write_json(tmp_path / "summary_tp1.json", _summary(
        [_row(16, "dense", 1250.0, 83.0), _row(16, 16, 2500.0, 16.0)], tp=1))
    common.write_json(tmp_path / "profile_b16_tp2.json", {
        "uniform-random/dense": _profile(5.0, 0.9, 1.2), "uniform-random/16": _profile(1.4, 0.9, 1.2),
        "_run_info": {}})
    common.write_json(tmp_path / "profile_b16_tp1.json", {"uniform-random/dense": _profile(9.5, 0.9, 0)})
    assert bench_tp.finalize(tmp_path) == 0
    obj = json.loads((tmp_path / "summary.json").read_text())
    assert "schema_error" not in obj
    cmp = {(c["batch"], c["budget"]): c for c in obj["single_gpu"]["comparison"]}
    assert cmp[(16, 16)] == {"batch": 16, "budget": 16, "tp_tok_s": 3000.0, "tp1_tok_s": 2500.0,
                             "tp_over_tp1": 1.2, "tp_x_dense": 1.5, "tp1_x_dense": 2.0,
                             "experts_per_layer": 16.0, "union_dense": 83.0}
    out = capsys.readouterr().out
    assert "ranks agree: True over 312 decode steps x 48 MoE layers" in out
    assert "all-reduce" in out and "TP2 dense" in out and "TP1 dense" in out
    split = bench_tp.profile_split(_profile(5.0, 0.9, 1.2))
    assert split["MoE experts"] == 5.0 and split["all-reduce"] == 1.2
    assert split["GPU busy"] == 8.1 and split["MoE share"] == round(5.0 / 8.1, 3)


def test_finalize_fails_without_agreement_or_results(tmp_path):
    assert bench_tp.finalize(tmp_path) == 1  # nothing written
    common.write_json(tmp_path / "summary.json", _summary(
        [_row(16, "dense", 2000.0, 83.0)], tp=2, ranks_agree=False, steps_compared=312))
    assert bench_tp.finalize(tmp_path) == 1
    assert json.loads((tmp_path / "summary.json").read_text())["single_gpu"]["file"] is None


def test_collect_compares_the_rank_traces_and_merges_other_ranks_profiles(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(bench_tp, "SCRATCH", tmp_path / "scratch")
    args = bench_tp.parse_args(["--out", str(out)])
    prefix = bench_tp.trace_prefix(out)
    prefix.parent.mkdir(parents=True)
    recs = _varying(12)
    for r in range(2):
        _write(trace_path(str(prefix), r), recs)
    common.write_json(out / "summary.json", {"tp": 2, "ranks_agree": False, "steps_compared": 0,
                                             "agreement": {"seconds": 3.5}})
    common.write_json(out / "profile_b16_tp2.json", {"uniform-random/dense": _profile(5, 1, 1)})
    common.write_json(tmp_path / "scratch" / "rank1" / "profile_b16_tp2.json",
                      {"uniform-random/dense": _profile(5.1, 1, 1), "_note": "x"})
    bench_tp._collect(args)
    obj = json.loads((out / "summary.json").read_text())
    assert obj["ranks_agree"] is True and obj["steps_compared"] == 12
    assert obj["agreement"]["seconds"] == 3.5  # what rank 0 recorded stays
    prof = json.loads((out / "profile_b16_tp2.json").read_text())
    assert prof["_other_ranks"]["rank1"]["uniform-random/dense"]["gpu_ms_per_step"][
        "moe_experts"] == 5.1


# ---- profile categories and per-rank byte floors -------------------------------------------------------
@pytest.mark.parametrize("name, cat", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
    ("void cross_device_reduce_1stage<__nv_bfloat16, 2>(RankData*, RankSignals, Signal*)",
     "allreduce"),
    ("void all_reduce_kernel<2>(AllReduceParams<2>)", "allreduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
    ("moe_sum_reduce_kernel", "moe_experts"), ("fused_moe_kernel", "moe_experts"),
])
def test_collectives_have_their_own_profile_category(name, cat):
    assert step_profile.classify(name) == cat


def test_byte_floors_per_rank_under_tp2():
    one = step_profile.byte_floors(common.QWEN3_30B_A3B, batch=16, context_len=300,
                                   experts_per_layer=16.0, union=82.0)
    two = step_profile.byte_floors(common.QWEN3_30B_A3B, batch=16, context_len=300,
                                   experts_per_layer=16.0, union=82.0, tp=2)
    per = {k: (one["per_category"][k]["bytes"], two["per_category"][k]["bytes"])
           for k in one["per_category"]}
    assert per["moe_experts"][1] * 2 == per["moe_experts"][0]  # half of every kept expert
    assert per["attention"][1] * 2 == per["attention"][0]  # 2 of the 4 KV heads
    assert per["base_select"][1] == per["base_select"][0]  # replicated selection
    assert per["norm"][1] == per["norm"][0]
    router = 48 * 128 * 2048 * 2  # the router is replicated, projections and lm_head are split
    assert per["gemm"][1] == (per["gemm"][0] - router) // 2 + router
    assert two["tp"] == 2 and two["bytes_per_expert_per_layer"] == 3 * 2048 * 768
    with pytest.raises(ValueError, match="tp"):
        step_profile.byte_floors(common.QWEN3_30B_A3B, 16, 300, 16.0, 82.0, tp=0)


# ---- run_tp2_h200.sh ---------------------------------------------------------------------------------
SCRIPT = GPU_DIR / "run_tp2_h200.sh"


def test_run_script_parses_and_keeps_nvlink_multicast_off():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" \
        in text
    assert "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=0" in text
    assert bench_tp.NO_MULTICAST == {"NCCL_NVLS_ENABLE": "0",
                                     "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                     "NVSHMEM_DISABLE_NVLS": "1"}


def test_run_script_stops_without_two_gpus(tmp_path):
    if subprocess.run(["bash", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("a machine with nvidia-smi: the GPU count guard is not what runs here")
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                         env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert res.returncode == 2
    assert "needs 2 GPUs" in (tmp_path / "run_tp2_h200.log").read_text()


def test_collect_records_a_trace_cut_mid_line_as_no_agreement(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(bench_tp, "SCRATCH", tmp_path / "scratch")
    args = bench_tp.parse_args(["--out", str(out)])
    prefix = bench_tp.trace_prefix(out)
    prefix.parent.mkdir(parents=True)
    _write(trace_path(str(prefix), 0), _varying(3))
    trace_path(str(prefix), 1).write_text(json.dumps(_varying(1)[0]) + '\n{"step": 1, "ro')
    common.write_json(out / "summary.json", {"tp": 2, "ranks_agree": False, "steps_compared": 0})
    bench_tp._collect(args)
    obj = json.loads((out / "summary.json").read_text())
    assert obj["ranks_agree"] is False and obj["steps_compared"] == 0
    assert "not JSON" in obj["agreement"]["problems"][0]
