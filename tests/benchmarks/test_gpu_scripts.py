"""The CPU-testable parts of benchmarks/gpu/ (the SGLang-on-H200 scripts of issue 11): argument
handling, the dummy model dir, the synthetic predictor, the skew transform, result files and their
schema, the profile's kernel classes and byte floors, the proxy check's verdict logic, the
plugin's per-step trace. What needs a GPU and SGLang runs on the device (run_sglang_h200.sh)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

common = importlib.import_module("common")
summary_schema = importlib.import_module("summary_schema")
skew = importlib.import_module("skew")
step_profile = importlib.import_module("step_profile")
bench_decode = importlib.import_module("bench_decode")
check_proxy = importlib.import_module("check_proxy_sglang")
serving_sweep = importlib.import_module("serving_sweep")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return common.write_dummy_model_dir(tmp_path_factory.mktemp("qwen3") / "m")


# ---- the dummy model dir and the synthetic predictor ----------------------------------------------
def test_dummy_model_dir_has_the_qwen3_30b_a3b_shape_and_a_full_vocab_tokenizer(model_dir):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim) == (2048, 48, 32, 4, 128)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.vocab_size, cfg.norm_topk_prob) == (128, 8, 768, 151936, True)
    assert cfg.architectures == ["Qwen3MoeForCausalLM"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [0, 5, 8191, 100000, 151935]
    assert tok.encode(tok.decode(ids)) == ids  # every id a dummy model samples round-trips
    assert tok.num_special_tokens_to_add() == 0
    text = tok.apply_chat_template([{"role": "user", "content": "t3 t4"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "user: t3 t4\nassistant:"


def test_dummy_model_dir_is_idempotent(model_dir):
    before = (model_dir / "tokenizer.json").stat().st_mtime_ns
    common.write_dummy_model_dir(model_dir)
    assert (model_dir / "tokenizer.json").stat().st_mtime_ns == before


def test_synthetic_predictor_matches_the_model_and_routes_base(tmp_path, model_dir):
    from transformers import AutoConfig

    from base_sglang.core import Predictor, SelectionConfig, select_experts

    config = json.loads((model_dir / "config.json").read_text())
    path = common.make_synthetic_predictor(config, tmp_path / "p.safetensors", seed=3)
    pred = Predictor.load(path)
    pred.validate(AutoConfig.from_pretrained(model_dir))
    assert tuple(pred.weight.shape) == (48, 128, 2048) and pred.meta.moe_layers == list(range(48))
    assert pred.meta.calibration["synthetic"] is True
    T, E, K = 16, 128, 8
    logits = torch.randn(T, E)
    w, ids = logits.softmax(-1).topk(K, dim=1)
    sel = select_experts(logits, ids, w / w.sum(1, keepdim=True), torch.randn(T, 2048),
                         torch.full((T,), 16), 5, SelectionConfig(), pred)
    assert int(sel.stats.num_kept) == 16 < int(sel.stats.num_union)


def test_synthetic_predictor_refuses_a_dense_model(tmp_path):
    with pytest.raises(ValueError, match="not a MoE model"):
        common.make_synthetic_predictor({"hidden_size": 8, "num_hidden_layers": 2},
                                        tmp_path / "p.safetensors")


# ---- skewed routing ---------------------------------------------------------------------------------
class _Block(torch.nn.Module):  # the attribute layout of SGLang's Qwen3MoeSparseMoeBlock
    def __init__(self, H, E):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.experts = torch.nn.Identity()


def _union(block, h, k):
    return block.gate(h).topk(k, dim=1).indices.unique().numel()


def test_skew_shrinks_the_routed_union_and_more_gamma_shrinks_it_more():
    torch.manual_seed(0)
    H, E, K, B = 256, 128, 8, 16
    model = torch.nn.ModuleList([_Block(H, E) for _ in range(4)])
    h = torch.randn(64, B, H)
    base = [sum(_union(b, x, K) for x in h) / len(h) for b in model]
    info = skew.skew_router(model, gamma=2.5, seed=1)
    assert info["routers"] == 4 and info["num_experts"] == E
    skewed = [sum(_union(b, x, K) for x in h) / len(h) for b in model]
    assert all(s < 0.75 * u for s, u in zip(skewed, base))  # ~83 -> ~51 of 128 at B=16
    assert all(40 < s < 62 for s in skewed)
    skew.skew_router(model, gamma=2.0, seed=1)  # gamma adds up: 4.5 in all
    assert all(s2 < s for s2, s in zip([sum(_union(b, x, K) for x in h) / len(h)
                                        for b in model], skewed))


def test_skew_finds_the_routers_of_a_transformers_qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, num_experts=8, num_experts_per_tok=2)
    model = Qwen3MoeForCausalLM(cfg)
    gates = skew.moe_gates(model)
    assert len(gates) == 3 and all(w.shape == (8, 32) for _, w in gates)
    before = gates[0][1].detach().clone()
    skew.skew_router(model, gamma=1.0)
    ratio = gates[0][1].detach() / before  # one factor per row (expert)
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), atol=1e-5)
    assert ratio.max() <= 1.0 + 1e-6 and ratio.min() < 0.95


def test_skew_refuses_bad_input():
    with pytest.raises(ValueError, match="gamma"):
        skew.skew_router(torch.nn.ModuleList([_Block(4, 4)]), gamma=-1.0)
    with pytest.raises(ValueError, match="no MoE router"):
        skew.skew_router(torch.nn.Linear(4, 4), gamma=1.0)


# ---- bench_decode: arguments, result files, merge, report ------------------------------------------
def test_bench_decode_defaults_and_sglang_argv():
    args = bench_decode.parse_args(["--out", "/tmp/x", "--", "--log-level", "warning"])
    assert args.batches == [1, 4, 8, 16, 32, 64, 128]
    assert args.budgets == ["dense", 8, 10, 12, 16, 24, 32, 128]
    argv = bench_decode.sglang_argv(args)
    i = argv.index("--cuda-graph-bs-decode")
    assert argv[i + 1:i + 8] == ["1", "4", "8", "16", "32", "64", "128"]
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "128"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    assert argv[-2:] == ["--log-level", "warning"]
    off = bench_decode.parse_args(["--out", "/tmp/x", "--plugin", "off", "--batches", "16", "4"])
    assert off.budgets == ["off"] and off.batches == [4, 16]


def test_bench_decode_memory_share_leaves_a_kv_cache_on_h100_and_keeps_0_7_on_h200():
    # H100 80 GB: SGLang refused 0.7 (the loaded weights need 0.727); H200 141 GB keeps the old 0.7
    h100, h200 = bench_decode.mem_fraction(85_520_000_000), bench_decode.mem_fraction(143_770_000_000)
    assert h200 == 0.7
    assert 61.1e9 / 85.52e9 + 0.1 < h100 <= 0.9
    assert bench_decode.mem_fraction(40_000_000_000) == 0.9
    args = bench_decode.parse_args(["--out", "/tmp/x"])
    assert args.mem_fraction_static is None
    argv = bench_decode.sglang_argv(args)
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"


@pytest.mark.parametrize("argv, message", [
    (["--budgets", "0"], "--budgets"), (["--budgets", "abc"], "--budgets"),
    (["--budgets", "129"], "--budgets"), (["--batches", "4", "4"], "--batches"),
    (["--batches", "8"], "--profile-batch"), (["--steps", "0"], "--steps"),
])
def test_bench_decode_bad_arguments_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--out", "/tmp/x", *argv])
    assert message in capsys.readouterr().err


def test_bench_decode_dry_run_writes_model_dir_and_predictor(tmp_path, capsys):
    rc = bench_decode.main(["--out", str(tmp_path), "--dry-run", "--model-dir",
                            str(tmp_path / "m"), "--predictor", str(tmp_path / "p.safetensors")])
    assert rc == 0 and (tmp_path / "m" / "tokenizer.json").is_file()
    assert (tmp_path / "p.safetensors").stat().st_size > 48 * 128 * 2048 * 4
    assert "--load-format dummy" in capsys.readouterr().out


INFO = {"gpu": "NVIDIA H200", "sglang_version": "0.5.17", "torch": "2.11.0+cu130",
        "commit": "abc1234"}


def _rows(budgets, batch=16, tok=1000.0):
    rows, stats = [], []
    for b in budgets:
        epl = 82.0 if b in ("dense", "off", 128) else float(b)
        rows.append({"batch": batch, "budget": b, "decode_tok_s": tok * (82.0 / epl) ** 0.5,
                     "experts_per_layer": epl, "union_dense": 82.0})
        stats.append({"batch": batch, "budget": b, "median_step_ms": 1.0})
    return rows, stats


def _write(path, mode, rows, stats, routing="uniform-random"):
    args = bench_decode.parse_args(["--out", str(path.parent), "--routing", routing])
    bench_decode.write_results(path, path.parent / bench_decode.PROFILE_FILE, INFO, args, mode,
                               rows, stats, {"k": mode}, {"t": 1}, {}, [])


def test_on_and_off_processes_share_one_valid_summary(tmp_path, capsys):
    path = tmp_path / "summary.json"
    _write(path, "plugin_on", *_rows(["dense", 16, 10, 128]))
    _write(path, "plugin_off", *_rows(["off"]))
    _write(path, "plugin_on", *_rows(["dense", 16, 10, 128], tok=1100.0))  # a rerun replaces
    obj = json.loads(path.read_text())
    summary_schema.validate_summary(obj)
    assert [r["budget"] for r in obj["rows"]] == ["off", "dense", 10, 16, 128]
    assert obj["rows"][1]["decode_tok_s"] == pytest.approx(1100.0)
    assert set(obj["settings"]) == {"plugin_on", "plugin_off"} and "schema_error" not in obj
    assert bench_decode.report(tmp_path) == 0
    out = capsys.readouterr().out
    assert "x dense" in out and "x off" in out


def test_a_row_that_breaks_the_budget_is_kept_and_flagged(tmp_path):
    rows, stats = _rows([16])
    rows[0]["experts_per_layer"] = 20.0  # the hook did not apply the budget
    _write(tmp_path / "summary.json", "plugin_on", rows, stats)
    obj = json.loads((tmp_path / "summary.json").read_text())
    assert "exceeds the budget 16" in obj["schema_error"]


def test_merge_of_two_device_calls(tmp_path):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    _write(a / "summary.json", "plugin_on", *_rows(["dense", 16]))
    _write(b / "summary.json", "plugin_off", *_rows(["off"]))
    _write(b / "summary_skewed.json", "plugin_on", *_rows(["dense", 10]), routing="skewed")
    assert bench_decode.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    merged = json.loads((out / "summary.json").read_text())
    summary_schema.validate_summary(merged)
    assert [r["budget"] for r in merged["rows"]] == ["off", "dense", 16]
    assert json.loads((out / "summary_skewed.json").read_text())["routing"] == "skewed"


def test_expert_stats_flag_hooks_that_did_not_run_or_ignored_the_budget():
    kept, union = torch.tensor([64.0, 64.0]), torch.tensor([160.0, 164.0])
    epl, uni, per_layer, problem = bench_decode._expert_stats(kept, union, 4, 16, 4)
    assert (epl, uni, per_layer, problem) == (16.0, 40.5, [16.0, 16.0], None)
    assert "did not reach the hook" in bench_decode._expert_stats(kept, union, 2, 16, 2)[3]
    assert "did not run inside" in bench_decode._expert_stats(kept, 0 * union, 4, 16, 4)[3]
    assert "no BASE counters" in bench_decode._expert_stats(None, None, 0, 16, 4)[3]


# ---- the schema --------------------------------------------------------------------------------------
def _summary():
    rows, _ = _rows(["dense", 16, "off"])
    return {**INFO, "model_shape": "qwen3-30b-a3b", "weights": "dummy", "cuda_graph": True,
            "routing": "uniform-random", "rows": rows}


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.pop("gpu"), "missing field 'gpu'"),
    (lambda s: s.update(routing="zipf"), "routing"),
    (lambda s: s.update(cuda_graph=False), "cuda_graph"),
    (lambda s: s["rows"][0].update(extra=1), "keys must be exactly"),
    (lambda s: s["rows"][1].update(budget=0), "budget"),
    (lambda s: s["rows"][1].update(budget="16"), "budget"),
    (lambda s: s["rows"][0].update(decode_tok_s=float("nan")), "decode_tok_s"),
    (lambda s: s["rows"][0].update(union_dense=50.0), "exceeds the dense union"),
    (lambda s: s["rows"].append(dict(s["rows"][0])), "duplicate"),
    (lambda s: s["rows"][0].update(batch=True), "batch"),
])
def test_schema_violations_name_the_field(mutate, message):
    s = _summary()
    summary_schema.validate_summary(s)
    mutate(s)
    with pytest.raises(ValueError, match=message):
        summary_schema.validate_summary(s)


def test_committed_summaries_validate():
    results = GPU_DIR.parents[0] / "results"
    paths = sorted(results.glob("sglang_h200/summary*.json")) + \
        sorted(results.glob("base_plus_h200/**/summary.json"))
    assert len(paths) >= 5  # sglang_h200 uniform + skewed, base_plus_h200 decode + the A/B pair
    for path in paths:
        summary_schema.validate_summary(json.loads(path.read_text()))
    ab = {p.parent.name: json.loads(p.read_text()) for p in paths if p.parent.name.startswith("ab_")}
    assert {k: v["settings"]["plugin_on"]["policy"] for k, v in ab.items()} == \
        {"ab_base": "base", "ab_base_plus": "base_plus"}


def test_shell_scripts_parse_and_base_plus_script_refuses_unknown_parts(tmp_path):
    import subprocess

    for script in sorted(GPU_DIR.parents[0].glob("**/*.sh")):
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, f"{script}: {r.stderr}"
    r = subprocess.run(["bash", str(GPU_DIR / "run_base_plus_h200.sh"), "bogus"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)}, timeout=60)
    assert r.returncode == 2 and "unknown part 'bogus'" in r.stderr


def test_table_e2e_script_refuses_a_missing_table_and_a_bad_order_before_any_work(tmp_path):
    import subprocess

    script = str(GPU_DIR / "run_table_e2e_h200.sh")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o")}
    r = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "OLD_TABLE" in r.stderr
    r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60,
                       env={**env, "OLD_TABLE": str(tmp_path / "absent.json")})
    assert r.returncode == 2 and "no such file" in r.stderr
    old = tmp_path / "old.json"
    old.write_text("{}")
    r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60,
                       env={**env, "OLD_TABLE": str(old), "ORDER": "new bogus"})
    assert r.returncode == 2 and "ORDER: new or old, got bogus" in r.stderr
    assert not (tmp_path / "o").exists()  # refused before it touched anything


# ---- the step profile ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name, cat", [
    ("fused_moe_kernel", "moe_experts"), ("_moe_align_small_numel_kernel", "moe_experts"),
    ("act_and_mul_kernel", "moe_experts"), ("_moe_sum_reduce_kernel", "moe_experts"),
    ("_base_score_kernel", "base_select"), ("_base_select_kernel", "base_select"),
    ("void topk_softmax<8>(float const*)", "router"),
    ("_fwd_grouped_kernel_stage1", "attention"), ("_fwd_kernel_stage2", "attention"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "gemm"), ("sm90_xmma_gemm_bf16bf16", "gemm"),
    ("void FusedAddRMSNormKernel<bf16>", "norm"), ("elementwise_kernel", "other"),
])
def test_kernel_names_fall_into_their_category(name, cat):
    assert step_profile.classify(name) == cat


class _Ev:
    def __init__(self, key, us, count, dev="DeviceType.CUDA"):
        self.key, self.device_time_total, self.count, self.device_type = key, us, count, dev


def test_kernel_table_sums_per_category_and_step():
    evs = [_Ev("fused_moe_kernel", 8000.0, 192), _Ev("_fwd_kernel_stage2", 1000.0, 96),
           _Ev("_base_select_kernel", 400.0, 96), _Ev("aten::mm", 5000.0, 4, "DeviceType.CPU")]
    t = step_profile.kernel_table(evs, steps=2)
    assert t["gpu_ms_per_step"]["moe_experts"] == 4.0
    assert t["gpu_ms_per_step"]["attention"] == 0.5
    assert t["gpu_ms_per_step"]["base_select"] == 0.2
    assert t["gpu_busy_ms_per_step"] == 4.7  # the CPU event is not a kernel
    assert t["top_kernels"][0] == {"name": "fused_moe_kernel", "category": "moe_experts",
                                   "ms_per_step": 4.0, "launches_per_step": 96.0}


def test_byte_floors_of_qwen3_30b_a3b():
    f = step_profile.byte_floors(common.QWEN3_30B_A3B, batch=16, context_len=300,
                                 experts_per_layer=16.0, union=82.0)
    per_expert = 3 * 2048 * 768 * 2
    assert f["bytes_per_expert_per_layer"] == per_expert
    assert f["per_category"]["moe_experts"]["bytes"] == 16 * per_expert * 48
    assert f["dense_union_expert_bytes"] == 82 * per_expert * 48
    assert f["per_category"]["attention"]["bytes"] == 16 * 300 * 48 * 2 * 4 * 128 * 2
    gemm = 48 * (2048 * 5120 + 4096 * 2048) * 2 + 48 * 128 * 2048 * 2 + 151936 * 2048 * 2
    assert f["per_category"]["gemm"]["bytes"] == gemm
    assert f["per_category"]["moe_experts"]["floor_ms"] == pytest.approx(
        16 * per_expert * 48 / 4.8e12 * 1000, abs=1e-4)


# ---- the proxy check's verdict --------------------------------------------------------------------------
def _s1(trace, n_out=4):
    return {"trace": trace, "outputs": {k: [{"ids": [1] * n_out}] for k in ("2", "4", "dense")}}


def test_budget_checks_pass_and_fail():
    DENSE = 64  # budgets reach the plugin resolved: dense = E (the proxy's 64 experts)
    ok = [{"max_budget": 2, "kept": [2, 1], "union": [5, 3]}] * 3 + \
         [{"max_budget": 4, "kept": [4, 3], "union": [5, 3]}] * 3 + \
         [{"max_budget": DENSE, "kept": [5, 3], "union": [5, 3]}] * 3
    r = check_proxy.budget_checks(_s1(ok), [4, 2])
    assert all(v["pass"] for v in r.values()) and r["2"]["max_kept"] == 2
    over = ok[:2] + [{"max_budget": 2, "kept": [3, 1], "union": [5, 3]}] + ok[3:]
    r = check_proxy.budget_checks(_s1(over), [4, 2])
    assert not r["2"]["pass"] and r["2"]["steps_over_budget"] == 1 and r["4"]["pass"]
    not_union = ok[:6] + [{"max_budget": DENSE, "kept": [4, 3], "union": [5, 3]}] * 3
    assert not check_proxy.budget_checks(_s1(not_union), [4, 2])["dense"]["pass"]
    too_few = ok[:1] + ok[3:]  # 1 step recorded for 4 tokens generated under budget 2
    assert not check_proxy.budget_checks(_s1(too_few), [4, 2])["2"]["pass"]


def test_prefix_match_and_teacher_forced_gap():
    assert check_proxy.prefix_match([1, 2, 3], [1, 2, 4]) == 2
    assert check_proxy.prefix_match([1, 2], [1, 2, 3]) == 2

    class _LM(torch.nn.Module):  # next token = (last + 1) mod V, confidently
        def forward(self, ids):
            logits = torch.nn.functional.one_hot((ids + 1) % 10, 10).float() * 5.0
            return type("O", (), {"logits": logits})()

    tf = check_proxy.teacher_forced(_LM(), [3, 4], [5, 7], "cpu")
    assert tf["gap"][0] == pytest.approx(0.0) and tf["gap"][1] == pytest.approx(5.0)
    assert check_proxy.greedy(_LM(), [3], 3, "cpu") == [4, 5, 6]


def test_heldout_prompts_are_distinct_and_sized():
    prompts = check_proxy.heldout_prompts(8, 48, common.PROXY_DIR / "tokenizer.json")
    assert len(prompts) == 8 and all(len(p) == 48 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 8


def test_check_proxy_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        check_proxy.parse_args(["sglang", "--out", "x", "--model-dir", str(tmp_path)])
    assert "no config.json" in capsys.readouterr().err
    args = check_proxy.parse_args(["sglang", "--out", "x"])
    argv = check_proxy.engine_argv(args)
    assert argv[argv.index("--cuda-graph-bs-decode") + 1:][:4] == ["1", "2", "4", "8"]


# ---- serving sweep ------------------------------------------------------------------------------------
def test_serving_sweep_budget_bodies_and_dataset(tmp_path):
    assert serving_sweep.extra_body("base-serve", "16") == '{"expert_budget": 16}'
    assert serving_sweep.extra_body("sglang", "10") == '{"custom_params": {"expert_budget": 10}}'
    assert serving_sweep.extra_body("sglang", "dense") is None
    data = json.loads(serving_sweep.write_dataset(tmp_path / "d.json", vocab=1000, n=20).read_text())
    prompts = [c["conversations"][0]["value"] for c in data]
    assert len(set(prompts)) == 20 and all(len(p.split()) == 400 for p in prompts)


def test_serving_summary_computes_the_speedup(tmp_path):
    recs = [{"tag": "base-serve/dense/c16", "output_throughput": 1000.0, "completed": 32},
            {"tag": "base-serve/16/c16", "output_throughput": 1500.0, "completed": 32}]
    (tmp_path / serving_sweep.JSONL).write_text("\n".join(json.dumps(r) for r in recs))
    rows = serving_sweep.summarize(tmp_path)["rows"]
    assert [r["x_dense"] for r in rows] == [1.0, 1.5]
    assert json.loads((tmp_path / serving_sweep.SUMMARY).read_text())["rows"][1]["budget"] == "16"


def test_serving_sweep_arguments(capsys):
    with pytest.raises(SystemExit):
        serving_sweep.parse_args(["--out", "x", "--flavor", "sglang"])
    assert "--base-url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serving_sweep.parse_args(["--out", "x", "--base-url", "u", "--flavor", "sglang",
                                  "--model", "m", "--tokenizer", "t", "--budgets", "0"])


def test_serving_sweep_warm_up_is_dense_small_and_unrecorded(tmp_path):
    args = serving_sweep.parse_args(["--out", str(tmp_path), "--base-url", "u", "--flavor", "sglang",
                                     "--model", "m", "--tokenizer", "t", "--budgets", "16"])
    argv = serving_sweep.warm_argv(args, 32, tmp_path / "d.json", tmp_path / "_warmup.jsonl")
    val = {k: argv[i + 1] for i, k in enumerate(argv) if k.startswith("--") and i + 1 < len(argv)}
    assert val["--num-prompts"] == "32" and val["--max-concurrency"] == "32"
    assert val["--output-file"] == str(tmp_path / "_warmup.jsonl")  # never the recorded JSONL
    assert val["--tag"] == "warmup/c32"
    assert "--extra-request-body" not in argv  # dense
    measured = serving_sweep.bench_argv(args, "sglang", "16", 32, tmp_path / "d.json")
    assert "--extra-request-body" in measured
    assert measured[measured.index("--output-file") + 1].endswith(serving_sweep.JSONL)


# ---- the plugin's per-step trace (BASE_STEP_TRACE) ------------------------------------------------------
def test_plugin_step_trace_writes_one_line_per_decode_step(tmp_path, monkeypatch):
    from base_sglang.plugin.config import PluginConfig
    from base_sglang.plugin.state import PluginState
    from base_sglang.testing.predictors import random_predictor

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("BASE_STEP_TRACE", str(trace))
    st = PluginState()
    st.enable(random_predictor(8, 4, 2, (0, 1), scale=0.0, bias_scale=0.0),
              PluginConfig(predictor="x", stats_interval=0), "cpu")
    st.ensure_buffer(4, "cpu")
    for kept in (3, 2):
        with st.decode_step([kept, 5]):
            st.record(0, torch.tensor(6), torch.tensor(kept))
            st.record(1, torch.tensor(4), torch.tensor(kept - 1))
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert lines == [{"rows": 2, "max_budget": 5, "kept": [3, 2], "union": [6, 4]},
                     {"rows": 2, "max_budget": 5, "kept": [2, 1], "union": [6, 4]}]
    assert st.num_kept.tolist() == [0, 0] and st.num_steps == 0


def test_targets_line_reports_met_and_missing_targets():
    ref = {(16, "dense"): 1000.0, (16, 16): 1700.0, (16, 10): 1500.0}
    line = bench_decode.targets_line(ref)
    assert "M=16 / dense = 1.700 (target >= 1.6: met)" in line
    assert "M=10 / dense = 1.500 (target >= 1.73: NOT met)" in line
    assert "M=128 / off: not measured" in line


# ---- trace_moe_one: the one-launch MoE's timeline ---------------------------------------------------
def test_trace_moe_one_variants_layout_and_summary():
    trace_moe = importlib.import_module("trace_moe_one")
    from base_sglang.kernels.fused_moe import MoeConfig
    from base_sglang.kernels.moe_gemm import GemmConfig

    cfg = MoeConfig(up=GemmConfig(64, 128), down=GemmConfig(128, 64), one_launch=True, ctas_per_sm=3)
    assert trace_moe.parse_variant("shipped", cfg) == cfg
    c = trace_moe.parse_variant("up=32:256:8:2/dn=64:128/c=2", cfg)
    assert c.up == GemmConfig(32, 256, 8, 2) and (c.down.block_n, c.down.block_k) == (64, 128)
    assert c.ctas_per_sm == 2 and c.down.num_warps == cfg.down.num_warps
    for bad in ("x", "up=1:2", "zz=3", "shipped/c=2", "r=8", "r=300", "r=1:2"):
        with pytest.raises(SystemExit):
            trace_moe.parse_variant(bad, cfg)
    kw = trace_moe.one_kwargs(c, 264)
    assert kw["up"] == (32, 256) and kw["num_warps"] == 8 and kw["programs"] == 264
    assert kw["maxnreg"] is None  # the row's (none): ptxas's choice
    assert trace_moe.one_kwargs(trace_moe.parse_variant("r=168/c=3", cfg), 396)["maxnreg"] == 168
    u48 = trace_moe.parse_variant("u=48", cfg)
    assert trace_moe.one_kwargs(u48, 264)["up_cols"] == 48 and kw["up_cols"] is None
    assert trace_moe.layout(8, 2048, 768, u48) == (128, 256)  # 16 up units per expert
    for bad in ("u=12", "u=0", "w=100", "i=2", "p=1"):
        with pytest.raises(SystemExit):
            trace_moe.parse_variant(bad, cfg)
    idle = trace_moe.parse_variant("i=1", cfg)  # fewer units than programs: the lowest ids idle
    assert idle.idle_low == 1 and cfg.idle_low == 0
    assert trace_moe.one_kwargs(idle, 264)["idle_low"] is True and kw["idle_low"] is False
    # Qwen3 (H 2048, I 768): 12 up and 16 down tiles per expert
    assert trace_moe.layout(8, 2048, 768, cfg) == (96, 224)
    # 2 up + 1 down unit ran on 2 programs of a 4-row unit block; stamps in ns
    tr = torch.zeros(4 + 3, 4, dtype=torch.int64)
    tr[0] = torch.tensor([1_500, 9_000, 9_000, 7])
    tr[1] = torch.tensor([1_600, 10_000, 10_000, 8])
    tr[2] = torch.tensor([1_700, 10_200, 14_000, 7])
    tr[4] = torch.tensor([1_000, 1_400, 14_500, 7])
    tr[5] = torch.tensor([1_100, 1_500, 10_100, 8])
    g = trace_moe.summarise(tr, 4, 2, 3)
    assert (g["programs"], g["up_units"], g["units"], g["sms_used"]) == (2, 2, 3, 2)
    assert (g["start_spread_us"], g["align_done_us"], g["up_last_end_us"]) == (0.1, 0.5, 9.0)
    assert (g["down_last_go_us"], g["down_compute_mean_us"], g["span_us"]) == (9.2, 3.8, 13.5)
    assert g["up_mean_us"] == round(((9_000 - 1_500) + (10_000 - 1_600)) / 2 / 1e3, 2)
    assert (g["up_units_per_sm_max"], g["sms_with_up"], g["sms_with_2_up"]) == (1, 2, 0)
    tr[1, 3] = 7  # both up units on SM 7
    g = trace_moe.summarise(tr, 4, 2, 3)
    assert (g["up_units_per_sm_max"], g["sms_with_up"], g["sms_with_2_up"]) == (2, 1, 1)


# ---- sweep_moe: the one-launch register-cap stage ---------------------------------------------------
def test_sweep_moe_register_stage_pairs_caps_with_programs():
    sweep = importlib.import_module("sweep_moe")
    from base_sglang.kernels.fused_moe import MoeConfig
    from base_sglang.kernels.moe_gemm import GemmConfig

    one = MoeConfig(up=GemmConfig(64, 128, 4, 3), one_launch=True, ctas_per_sm=3)
    got = {(c.maxnreg, c.ctas_per_sm) for c in sweep.candidates("regs", one, 128, 16)}
    assert got == {(0, 2), (168, 3), (128, 4)}  # (0, 3) is the start: uncapped, clamped to 2
    capped = sweep.candidates("regs", one, 128, 16)[1]
    assert {(c.maxnreg, c.ctas_per_sm) for c in sweep.candidates("regs", capped, 128, 16)} == \
        {(0, 2), (128, 4)}
    assert sweep.candidates("regs", MoeConfig(), 128, 16) == []  # grouped launches: no stage
    assert "O3R168/" in sweep.short(dataclasses.asdict(capped))
    assert "R" not in sweep.short(dataclasses.asdict(one)).split("/")[0]


def test_sweep_moe_row_blocks_follow_the_busiest_expert():
    sweep = importlib.import_module("sweep_moe")
    from base_sglang.kernels.fused_moe import MoeConfig

    def bms(pairs, n_read, max_rows=0, cfg=None):
        return sorted(c.block_m for c in sweep.candidates("bm", cfg or MoeConfig(), pairs, n_read, max_rows))

    assert bms(512, 59) == []  # Qwen3 T = 64, skewed: 8 pairs per expert on average
    assert bms(512, 59, max_rows=44) == [32, 64]  # but the busiest has 44: 3 blocks of 16
    assert bms(256, 59, max_rows=20) == [32]
    assert bms(256, 59, max_rows=9) == []  # one block of 16 holds it
    assert bms(128, 8) == [32]  # the mean rule alone, as before
    assert bms(512, 59, 44, MoeConfig(pair_major=True)) == []


def _sweep_file(path, us, block_n):
    from base_sglang.kernels.fused_moe import MoeConfig
    from base_sglang.kernels.moe_gemm import GemmConfig

    cfg = dataclasses.asdict(MoeConfig(up=GemmConfig(block_n, 256, 4, 3)))
    cell = dict(shape="qwen3-30b-a3b", T=32, routing="dense", experts_read=59, floor_us=132.0,
                structures={"grouped": us + 5}, best_structure="grouped", tuned=cfg, tuned_us=us)
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "abc", "cells": [cell]}))
    return str(path)


def test_tuned_configs_replace_overrides_the_faster_row(tmp_path, monkeypatch):
    tc = importlib.import_module("tuned_configs")
    a = _sweep_file(tmp_path / "a.json", 150.0, 32)
    b = _sweep_file(tmp_path / "b.json", 152.0, 64)  # slower on its own machine
    key = "E=128,H=2048,I=768,K=8"

    def run(*argv):
        monkeypatch.setattr(sys, "argv", ["tuned_configs.py", *argv, "--out", str(tmp_path / "o")])
        assert tc.main() == 0
        return json.loads((tmp_path / "o" / "NVIDIA_H200.json").read_text())

    assert run("--keep-faster", a, b)["shapes"][key]["dense"]["32"]["up"]["block_n"] == 32
    t = run("--keep-faster", a, "--replace", b)
    assert t["shapes"][key]["dense"]["32"]["up"]["block_n"] == 64
    assert t["shapes"][key]["dense"]["32"]["us"] == 152.0
    assert [s.get("replace", False) for s in t["provenance"]["sweeps"]] == [False, True]
    monkeypatch.setattr(sys, "argv", ["tuned_configs.py", a, "--replace", str(tmp_path / "o" / "NVIDIA_H200.json"),
                                      "--out", str(tmp_path / "o2")])
    assert tc.main() == 2  # a table is not a sweep (no cells): refused


def test_tuned_configs_keeps_the_gpus_route_rule(tmp_path, monkeypatch):
    """A GPU file's route_split_min_t comes from end-to-end runs, not a tile sweep: a new table for
    that GPU keeps it, with the provenance entries naming its runs."""
    tc = importlib.import_module("tuned_configs")
    from base_sglang.kernels.moe_configs import route_split_min_t

    a = _sweep_file(tmp_path / "a.json", 150.0, 32)
    out = tmp_path / "o"
    out.mkdir()
    runs = {"file": "benchmarks/results/route_x", "commit": "abc", "what": "an A/B"}
    (out / "NVIDIA_H200.json").write_text(json.dumps({
        "provenance": {"gpu": "NVIDIA H200", "measured_here": [{"file": "f", "what": "a hook check"}],
                       "route_split_min_t_runs": [runs]},
        "same_as": "NVIDIA H100", "route_split_min_t": 8}))
    monkeypatch.setattr(sys, "argv", ["tuned_configs.py", a, "--out", str(out)])
    assert tc.main() == 0
    t = json.loads((out / "NVIDIA_H200.json").read_text())
    assert t["route_split_min_t"] == 8 and "same_as" not in t and t["shapes"]
    assert t["provenance"]["route_split_min_t_runs"] == [runs] and "measured_here" not in t["provenance"]
    assert tc.main() == 0  # again over its own output: the rule and its runs stay, once
    t = json.loads((out / "NVIDIA_H200.json").read_text())
    assert t["route_split_min_t"] == 8 and t["provenance"]["route_split_min_t_runs"] == [runs]
    monkeypatch.setattr("base_sglang.kernels.moe_configs.CONFIG_DIR", out)
    route_split_min_t.cache_clear()
    try:
        assert route_split_min_t("NVIDIA H200") == 8
    finally:
        route_split_min_t.cache_clear()


# ---- tuned_configs --trace: trace variants adopted into the budget rows -----------------------------
def test_tuned_configs_adopts_trace_variants_by_rule():
    tc = importlib.import_module("tuned_configs")
    from base_sglang.kernels.fused_moe import MoeConfig
    from base_sglang.kernels.moe_configs import shape_key
    from base_sglang.kernels.moe_gemm import GemmConfig

    key = shape_key(128, 2048, 768, 8)  # qwen3-30b-a3b
    one = {**dataclasses.asdict(MoeConfig(up=GemmConfig(64, 128, 4, 3), one_launch=True,
                                          ctas_per_sm=3)), "us": 50.0, "floor_us": 36.0}
    grouped = {**dataclasses.asdict(MoeConfig()), "us": 90.0, "floor_us": 36.0}

    def shapes():
        return {key: {"budget": {"8": dict(one), "16": dict(one), "64": dict(grouped)},
                      "dense": {"16": dict(one)}}}

    def cell(T, M, v, us):
        return dict(shape="qwen3-30b-a3b", T=T, M=M, variant=v, us=us, shipped_one_launch=T != 64)

    def trace(scale):  # T=16: u=48 4-8 % faster; T=8: u=48 1.5 % slower at M=16; c=2 only here
        return {"cells": [cell(16, 8, "shipped", 33.0), cell(16, 8, "u=48", 31.0 * scale),
                          cell(16, 16, "shipped", 48.0), cell(16, 16, "u=48", 46.0 * scale),
                          cell(8, 8, "shipped", 33.0), cell(8, 8, "u=48", 31.0),
                          cell(8, 16, "shipped", 47.0), cell(8, 16, "u=48", 47.7),
                          cell(64, 16, "shipped", 90.0), cell(64, 16, "u=48", 80.0)]}

    s = shapes()
    extra = trace(1.0)
    extra["cells"] += [cell(16, 16, "c=2", 40.0)]  # much faster, but in one file of two
    changed = tc.apply_traces(s, [trace(1.0), extra])
    rows = s[key]["budget"]
    assert changed == ["qwen3-30b-a3b T=16: u=48 (shipped / variant 1.043-1.065)"]
    assert MoeConfig.from_dict(rows["16"]).up_cols == 48 and rows["16"]["trace_variant"] == "u=48"
    assert rows["16"]["trace_ratios"] == [1.065, 1.043, 1.065, 1.043] and rows["16"]["us"] == 50.0
    assert rows["8"] == one  # slower than 0.99 at one point
    assert rows["64"] == grouped  # not a one-launch row
    assert s[key]["dense"]["16"] == one  # dense rows are never touched
    s1 = shapes()
    assert tc.apply_traces(s1, [extra])[0].startswith("qwen3-30b-a3b T=16: c=2")  # one file: enough


def test_tuned_configs_judges_a_variant_against_what_its_file_ran():
    # generation 1: u=48 over the sweep row (two files); generation 2: t=2 timed over the u=48 row
    # (its "shipped" config) in two later files. t=2 is adopted on top of u=48; a file whose
    # shipped ran something else (here: t=2, slower, over the bare row) counts only in its own
    # generation.
    tc = importlib.import_module("tuned_configs")
    from base_sglang.kernels.fused_moe import MoeConfig
    from base_sglang.kernels.moe_configs import shape_key
    from base_sglang.kernels.moe_gemm import GemmConfig

    key = shape_key(128, 2048, 768, 8)
    bare = MoeConfig(up=GemmConfig(64, 128, 4, 3), one_launch=True, ctas_per_sm=3)
    u48 = dataclasses.replace(bare, up_cols=48)
    both = dataclasses.replace(u48, tma=2)
    row = {**dataclasses.asdict(bare), "us": 50.0, "floor_us": 36.0}

    def cell(M, v, us, cfg):
        return dict(shape="qwen3-30b-a3b", T=16, M=M, variant=v, us=us, shipped_one_launch=True,
                    config=dataclasses.asdict(cfg))

    old = {"cells": [cell(8, "shipped", 33.0, bare), cell(8, "u=48", 31.0, u48),
                     cell(16, "shipped", 48.0, bare), cell(16, "u=48", 46.0, u48)]}
    new = {"cells": [cell(8, "shipped", 31.0, u48), cell(8, "t=2", 30.0, both),
                     cell(16, "shipped", 46.0, u48), cell(16, "t=2", 44.0, both)]}
    stray = {"cells": [cell(16, "shipped", 48.0, bare), cell(16, "t=2", 60.0,
                                                             dataclasses.replace(bare, tma=2))]}
    s = {key: {"budget": {"16": dict(row)}}}
    changed = tc.apply_traces(s, [old, old, new, stray, new])
    got = s[key]["budget"]["16"]
    assert [c.split(" (")[0] for c in changed] == ["qwen3-30b-a3b T=16: u=48", "qwen3-30b-a3b T=16: t=2"]
    assert MoeConfig.from_dict(got) == both and got["trace_variant"] == "u=48 > t=2"
    assert got["trace_ratios"] == [1.033, 1.045, 1.033, 1.045]
    s = {key: {"budget": {"16": dict(row)}}}
    tc.apply_traces(s, [old, old, new])  # t=2 over u=48 in one file of three: not enough
    assert MoeConfig.from_dict(s[key]["budget"]["16"]) == u48


# ---- run_h200_left_issue12.sh: the H200-only runs stop on any other GPU ---------------------------
def _gpu_on_path(tmp_path, name):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # stands in for the driver's tool: this machine has no GPU
    smi.write_text(f"#!/bin/sh\necho '{name}'\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize("gpu,part,rc,says", [
    ("NVIDIA H100 80GB HBM3", "kernels", 0, "not an H200: nothing run"),
    ("NVIDIA H100 80GB HBM3", "e2e", 0, "not an H200: nothing run"),
    ("NVIDIA H200", "fold", 2, "unknown PART 'fold' (kernels e2e)"),
])
def test_h200_left_script_stops_off_the_h200_and_names_a_bad_part(tmp_path, gpu, part, rc, says):
    env = {**_gpu_on_path(tmp_path, gpu), "OUT": str(tmp_path / "out"), "PART": part}
    out = subprocess.run(["bash", str(GPU_DIR / "run_h200_left_issue12.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == rc, out.stderr
    assert says in out.stdout + out.stderr
    assert (tmp_path / "out" / "gpu.txt").read_text() == f"gpu: {gpu}\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu.txt"]  # nothing else ran


@pytest.mark.parametrize("gpu,part,rc", [("NVIDIA H100 80GB HBM3", "kernels", 0), ("NVIDIA H200", "fold", 2)])
def test_h200_left_script_packs_its_folder_on_every_exit(tmp_path, gpu, part, rc):
    """PACK=FILE: the folder comes back as one tar whatever the exit (the device returns 8 files)."""
    pack = tmp_path / "ret" / "kernels.tgz"
    pack.parent.mkdir()
    env = {**_gpu_on_path(tmp_path, gpu), "OUT": str(tmp_path / "k"), "PART": part, "PACK": str(pack)}
    out = subprocess.run(["bash", str(GPU_DIR / "run_h200_left_issue12.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == rc, out.stderr  # the trap keeps the script's own status
    with tarfile.open(pack) as t:
        assert sorted(t.getnames()) == ["k", "k/gpu.txt"]
        assert t.extractfile("k/gpu.txt").read().decode() == f"gpu: {gpu}\n"
