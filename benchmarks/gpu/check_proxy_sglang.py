"""The shipped proxy (real weights) under SGLang on the GPU: dense equals the references, budget M
never executes more than M experts in any MoE layer of any decode step.

Two stages, two processes (the SGLang bundle pins transformers 5.12.1; the references run on the
device's own transformers):

    # 1. SGLang offline Engine (bf16, CUDA graphs, the plugin with the proxy's predictor): greedy
    #    outputs per budget, per-request budgets via custom_params, one trace line per decode step
    python3 benchmarks/gpu/check_proxy_sglang.py sglang --out OUT
    # 2. references on the same GPU and the verdict: transformers fp32 (the oracle) and bf16 (the
    #    noise floor of a second bf16 implementation), the native engine (fp32, same predictor)
    python3 benchmarks/gpu/check_proxy_sglang.py reference --out OUT

Criterion for dense (bf16 kernels may flip near-tied greedy choices, after which sequences part):
every token SGLang emits must be a near-argmax of the fp32 reference given SGLang's own prefix:
gap_t = max_v logp_ref(v | prefix_t) - logp_ref(sglang_t | prefix_t) <= tau for all t, with
tau = max(--tau-floor, 2 * the largest such gap of transformers-bf16's own greedy output). A real
bug (wrong weights, wrong routing, broken KV) gives gaps of several nats within a few tokens; a bf16
rounding flip gives a gap no larger than the logit error of bf16 itself, which the transformers-bf16
run measures on the same prompts. Exact-match lengths and first divergences are reported too.
Criterion for budgets: BASE_STEP_TRACE (plugin/state.py) records the experts executed per MoE
layer in every decode step; every step run under budget M must have kept <= M in every layer
(and kept == union for dense).
Writes OUT/proxy_sglang.json (stage 1) and OUT/proxy_check.json (stage 2, with the verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

STAGE1_FILE, STAGE2_FILE = "proxy_sglang.json", "proxy_check.json"
DENSE_LABEL = "dense"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", choices=("sglang", "reference"))
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", default=str(common.PROXY_DIR))
    p.add_argument("--prompts", type=int, default=8, help="prompts, decoded as one batch")
    p.add_argument("--prompt-len", type=int, default=48, help="tokens per prompt")
    p.add_argument("--max-new", type=int, default=32, help="greedy tokens per prompt")
    p.add_argument("--budgets", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--tau-floor", type=float, default=0.05, help="nats (see the module doc)")
    p.add_argument("--mem-fraction-static", type=float, default=0.3)
    p.add_argument("--trace", default="/tmp/base-bench/proxy_step_trace.jsonl")
    args = p.parse_args(argv)
    for name in ("prompts", "prompt_len", "max_new"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if any(b < 1 for b in args.budgets):
        p.error(f"--budgets: integers >= 1, got {args.budgets}")
    if not (Path(args.model_dir) / "config.json").is_file():
        p.error(f"--model-dir: no config.json in {args.model_dir} (the proxy weights must travel "
                "with this call: do not device-slim base_sglang/models/proxy-moe)")
    return args


def heldout_prompts(n: int, length: int, tokenizer_file: Path) -> list[list[int]]:
    """n prompts of `length` token ids: the starts of n held-out documents, evenly spread."""
    from tokenizers import Tokenizer

    text = (common.REPO / "base_sglang" / "data" / "heldout.txt").read_text()
    docs, cur = [], []
    for line in text.splitlines():
        if line.startswith("<<<") and line.endswith(">>>"):
            if cur:
                docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        docs.append("\n".join(cur))
    tok = Tokenizer.from_file(str(tokenizer_file))
    ids = [tok.encode(d.strip()).ids for d in docs]
    ids = [x[:length] for x in ids if len(x) >= length]
    if len(ids) < n:
        raise ValueError(f"--prompts: only {len(ids)} held-out documents have {length} tokens")
    step = len(ids) / n
    return [ids[int(i * step)] for i in range(n)]


# ---- stage 1: SGLang ------------------------------------------------------------------------------
def engine_argv(args) -> list[str]:
    bs = sorted({1, 2, 4, args.prompts} | {b for b in (8,) if b <= args.prompts})
    return ["--model-path", args.model_dir, "--dtype", "bfloat16",
            "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--grammar-backend", "none", "--moe-runner-backend", "triton",
            "--mem-fraction-static", str(args.mem_fraction_static),
            "--cuda-graph-bs-decode", *map(str, bs), "--cuda-graph-max-bs-decode", str(max(bs)),
            "--cuda-graph-backend-prefill", "disabled", "--max-running-requests",
            str(args.prompts), "--disable-radix-cache", "--random-seed", "0"]


def stage_sglang(args) -> int:
    clock = common.Clock()
    model = Path(args.model_dir)
    trace = Path(args.trace)
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.unlink(missing_ok=True)
    os.environ.update({"BASE_PREDICTOR": str(model / "predictor.safetensors"),
                       "BASE_DEFAULT_BUDGET": "dense", "BASE_STATS_INTERVAL": "0",
                       "BASE_STEP_TRACE": str(trace)})
    prompts = heldout_prompts(args.prompts, args.prompt_len, model / "tokenizer.json")
    from base_sglang.hf.untie import is_tied, untie_embeddings

    if is_tied(model):  # SGLang's Qwen3-MoE ignores tie_word_embeddings (uninitialised LM head)
        args.model_dir = str(untie_embeddings(model, "/tmp/proxy-untied"))
        print(f"[proxy] tied embeddings: SGLang serves the untied copy {args.model_dir}", flush=True)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(engine_argv(args)))
    clock.lap("import sglang")
    engine = Engine(server_args=server_args)
    clock.lap("Engine start (load + capture)")
    info = common.run_info()
    import sglang

    info["sglang_version"] = info["sglang_version"] or getattr(sglang, "__version__", "unknown")
    result = {"run_info": info, "engine_argv": engine_argv(args), "prompts": prompts,
              "max_new": args.max_new, "outputs": {}, "trace_records": {}, "errors": {}}
    out_file = Path(args.out) / STAGE1_FILE
    try:
        # ascending budgets, dense last: a late trace line of one call can only carry a budget
        # <= the next call's; every line also names its own batch budget (max_budget)
        for budget in [*sorted(args.budgets), DENSE_LABEL]:
            n_before = _trace_lines(trace)
            sp = {"temperature": 0.0, "max_new_tokens": args.max_new, "ignore_eos": True,
                  "custom_params": {"expert_budget": budget}}
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params=[dict(sp) for _ in prompts],
                                   return_logprob=True)
            dt = time.perf_counter() - t0
            _settle(trace)
            result["outputs"][str(budget)] = [_output(o) for o in outs]
            result["trace_records"][str(budget)] = [n_before, _trace_lines(trace)]
            print(f"[sglang] budget {budget}: {len(outs)} outputs in {dt:.2f} s", flush=True)
            common.write_json(out_file, result)
        result["bad_budget_rejected"] = _bad_budget(engine, prompts[0])
        result["trace"] = [json.loads(x) for x in trace.read_text().splitlines()] \
            if trace.is_file() else []
    finally:
        engine.shutdown()
        result["timings"] = clock.phases
        common.write_json(out_file, result)
    clock.lap("generation")
    print(f"[sglang] wrote {out_file} ({len(result.get('trace', []))} decode-step records)")
    return 0


def _output(o: dict) -> dict:
    meta = o.get("meta_info", {})
    lps = meta.get("output_token_logprobs") or []
    ids = o.get("output_ids") or [t[1] for t in lps]
    return {"ids": list(ids), "logprobs": [t[0] for t in lps],
            "finish_reason": meta.get("finish_reason")}


def _trace_lines(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.is_file() else 0


def _settle(trace: Path, timeout: float = 5.0) -> None:
    """Wait until the scheduler stopped appending trace lines (overlap scheduling runs ahead)."""
    last, t_end = -1, time.time() + timeout
    while time.time() < t_end:
        n = _trace_lines(trace)
        if n == last:
            return
        last = n
        time.sleep(0.3)


def _bad_budget(engine, prompt) -> dict:
    """custom_params expert_budget 0 must be refused with a ValueError naming the field."""
    try:
        engine.generate(input_ids=[prompt], sampling_params=[{
            "max_new_tokens": 2, "custom_params": {"expert_budget": 0}}])
    except ValueError as exc:
        return {"rejected": True, "error": str(exc)[:300]}
    except Exception as exc:  # noqa: BLE001 - any other failure is reported as it is
        return {"rejected": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"rejected": False, "error": "accepted"}


# ---- stage 2: references and the verdict ----------------------------------------------------------
def stage_reference(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    clock = common.Clock()
    s1 = json.loads((Path(args.out) / STAGE1_FILE).read_text())
    prompts, n_new = s1["prompts"], s1["max_new"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype).to(dev).eval()
        ref[str(dtype)] = (model, [greedy(model, p, n_new, dev) for p in prompts])
    clock.lap("transformers greedy (fp32, bf16)")
    fp32 = ref[str(torch.float32)][0]
    hf32_ids = ref[str(torch.float32)][1]
    hf16_ids = ref[str(torch.bfloat16)][1]
    hf16_gaps = [teacher_forced(fp32, p, o, dev) for p, o in zip(prompts, hf16_ids)]
    g_hf = max(max(g["gap"]) for g in hf16_gaps)
    tau = max(args.tau_floor, 2.0 * g_hf)
    dense = s1["outputs"].get(DENSE_LABEL, [])
    per_prompt = []
    for i, (p, o) in enumerate(zip(prompts, dense)):
        tf = teacher_forced(fp32, p, o["ids"], dev)
        lp_diff = [abs(a - b) for a, b in zip(o["logprobs"], tf["logp"]) if a is not None]
        per_prompt.append({
            "prompt": i, "match_fp32": prefix_match(o["ids"], hf32_ids[i]),
            "match_bf16": prefix_match(o["ids"], hf16_ids[i]), "max_gap": max(tf["gap"]),
            "gap_at_first_divergence": _gap_at(tf["gap"], prefix_match(o["ids"], hf32_ids[i])),
            "max_abs_logprob_diff": max(lp_diff) if lp_diff else None})
    dense_pass = bool(per_prompt) and all(r["max_gap"] <= tau for r in per_prompt)
    clock.lap("teacher-forced gaps")
    native = native_engine(args, prompts, n_new, s1["outputs"])
    clock.lap("native engine")
    budgets = budget_checks(s1, args.budgets)
    bad = s1.get("bad_budget_rejected", {})
    verdict = {"dense_equals_reference": dense_pass,
               "budgets_respected": all(b["pass"] for b in budgets.values()),
               "bad_budget_rejected": bool(bad.get("rejected"))}
    verdict["pass"] = all(verdict.values())
    result = {"verdict": verdict, "tau_nats": tau, "hf_bf16_max_gap": g_hf,
              "dense_per_prompt": per_prompt, "hf_bf16_vs_fp32_match": [
                  prefix_match(a, b) for a, b in zip(hf16_ids, hf32_ids)],
              "budgets": budgets, "native_engine": native, "bad_budget": bad,
              "max_new": n_new, "prompts": len(prompts), "run_info": common.run_info(),
              "sglang_run_info": s1.get("run_info"), "timings": clock.phases}
    common.write_json(Path(args.out) / STAGE2_FILE, result)
    print_report(result)
    return 0 if verdict["pass"] else 1


def greedy(model, prompt: list[int], n: int, dev: str) -> list[int]:
    """Greedy continuation by full recomputation (no cache, no eos): the plain reference."""
    import torch

    ids = torch.tensor([prompt], device=dev)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].float().argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=dev)], dim=1)
    return out


def teacher_forced(model, prompt: list[int], out: list[int], dev: str) -> dict:
    """Reference log-probs of `out` after `prompt` in one forward: gap to the argmax per token."""
    import torch

    ids = torch.tensor([prompt + out], device=dev)
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)  # [P+N, V]
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(out), device=dev)  # predicts out
    tgt = torch.tensor(out, device=dev)
    lp = logp[pos, tgt]  # [N]
    gap = logp[pos].max(-1).values - lp  # [N] >= 0
    return {"logp": lp.tolist(), "gap": gap.tolist()}


def prefix_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _gap_at(gaps: list[float], pos: int):
    return gaps[pos] if pos < len(gaps) else None


def budget_checks(s1: dict, budgets: list[int], num_experts: int = 64) -> dict:
    """Per budget: decode-step records under it, max experts any layer executed, pass/fail.
    Budgets reach the plugin resolved (1..E, dense = E)."""
    trace = s1.get("trace", [])
    out = {}
    for label in [*map(str, sorted(budgets)), DENSE_LABEL]:
        m = num_experts if label == DENSE_LABEL else int(label)
        recs = [r for r in trace if r["max_budget"] == m]
        kept = [k for r in recs for k in r["kept"]]
        over = [r for r in recs if any(k > m for k in r["kept"])]
        not_union = [r for r in recs if label == DENSE_LABEL and r["kept"] != r["union"]]
        more_than_union = [r for r in recs if any(k > u for k, u in zip(r["kept"], r["union"]))]
        n_out = len((s1["outputs"].get(label) or [{}])[0].get("ids", []))
        ok = bool(recs) and not over and not not_union and not more_than_union
        out[label] = {"steps": len(recs), "expected_steps_at_least": max(n_out - 1, 0),
                      "max_kept": max(kept) if kept else None,
                      "mean_kept": sum(kept) / len(kept) if kept else None,
                      "mean_union": (sum(u for r in recs for u in r["union"]) / len(kept))
                      if kept else None,
                      "steps_over_budget": len(over), "dense_steps_not_union": len(not_union),
                      "pass": ok and len(recs) >= max(n_out - 1, 1)}
    return out


def native_engine(args, prompts, n_new, sgl_outputs) -> dict:
    """The native engine (fp32, same predictor, policy base) per budget; prefix agreement with
    SGLang's outputs (information: a BASE choice can flip under bf16, then sequences part)."""
    import torch

    from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    eng = LLMEngine(EngineConfig(model=args.model_dir, device=dev, dtype="float32",
                                 policy="base", max_running_requests=len(prompts)))
    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    res = {}
    for label in [DENSE_LABEL, *map(str, sorted(args.budgets))]:
        outs = eng.generate(prompts, params, budget=label)  # "dense" or the int, as over HTTP
        sgl = sgl_outputs.get(label, [])
        res[label] = {"prefix_match_with_sglang": [prefix_match(o[0], s["ids"])
                                                   for o, s in zip(outs, sgl)],
                      "experts_per_layer": [o[2].experts_per_layer for o in outs]}
    return res


def print_report(r: dict) -> None:
    v = r["verdict"]
    print(f"\n== proxy under SGLang: {'PASS' if v['pass'] else 'FAIL'} "
          f"(tau {r['tau_nats']:.3f} nats; transformers-bf16 max gap {r['hf_bf16_max_gap']:.3f}) ==")
    print(common.format_table(
        ["prompt", "match fp32", "match bf16", "max gap", "gap@div", "max |dlogp|"],
        [[p["prompt"], p["match_fp32"], p["match_bf16"], p["max_gap"],
          p["gap_at_first_divergence"], p["max_abs_logprob_diff"]] for p in r["dense_per_prompt"]]))
    print(common.format_table(
        ["budget", "steps", "max kept", "mean kept", "mean union", "over", "pass"],
        [[k, b["steps"], b["max_kept"], b["mean_kept"], b["mean_union"], b["steps_over_budget"],
          b["pass"]] for k, b in r["budgets"].items()]))
    print(f"bad budget rejected: {r['bad_budget'].get('rejected')} "
          f"({r['bad_budget'].get('error')})")
    nat = r.get("native_engine", {})
    for k, b in nat.items():
        print(f"native engine budget {k}: prefix match with SGLang {b['prefix_match_with_sglang']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    return stage_sglang(args) if args.stage == "sglang" else stage_reference(args)


if __name__ == "__main__":
    sys.exit(main())
