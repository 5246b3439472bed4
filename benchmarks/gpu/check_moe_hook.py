"""The plugin's fused_experts AROUND hook (BASE_MOE=auto, the default) against SGLang's own MoE.

For BASE-selected ids (-1 = a dropped slot: each row keeps only the batch's M most used experts)
at the Qwen3-30B-A3B and OLMoE shapes, T = 1..16, 17, 64 and 65, through
hooks.around_fused_experts with SGLang's real fused_experts_impl as the original:
  - which kernel ran: ours where plugin/moe.py says so (a tuned budget row of this GPU, at most
    BASE_MOE_MAX_ROWS rows), SGLang's otherwise (T = 65, above the default 64);
  - the hook's output and SGLang's (filter_expert=True) against an fp32 reference that skips
    dropped slots (relative Frobenius error), and against each other;
  - inplace=True writes hidden_states; run-to-run bitwise;
  - a CUDA graph of the hook, replayed with new ids and weights, == eager, bitwise.
On CPU under TRITON_INTERPRET=1 it runs one small shape against the reference alone (a smoke run).

    bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/check_moe_hook.py --out DIR
    -> DIR/moe_hook.json, a table on stdout; exit 1 on any failure
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
from pathlib import Path

import torch

SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "olmoe-1b-7b": (64, 2048, 1024, 8),
          "tiny": (6, 32, 16, 2)}  # (E, H, I, K)
TOL = 1e-2  # bf16 GEMMs with fp32 accumulation against the fp32 reference


def base_ids(T: int, E: int, K: int, M: int, g: torch.Generator):
    """Softmax top-K routing of skewed logits, then every slot outside the batch's M most routed
    experts set to -1 (BASE's kept set, without backfill); renormalised weights."""
    logits = torch.randn(T, E, generator=g) + 2 * torch.randn(E, generator=g)  # [T, E]
    w, ids = torch.softmax(logits, -1).topk(K, dim=-1)  # [T, K]
    counts = torch.bincount(ids.reshape(-1), minlength=E)  # [E]
    keep = torch.zeros(E, dtype=torch.bool)
    keep[counts.topk(min(M, E)).indices] = True
    ids = torch.where(keep[ids], ids, torch.full_like(ids, -1)).to(torch.int32)
    return ids, (w / w.sum(-1, keepdim=True)).float()


def reference(x, w1, w2, w, ids):
    from base_sglang.core.moe_ref import expert_outputs

    outs = expert_outputs(x, ids.long(), w1, w2, dtype=torch.float32)  # [T, K, H]
    return (outs * torch.where(ids >= 0, w, 0).unsqueeze(-1)).sum(1)  # [T, H]


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check_cell(shape, T, M, dev, original, hooks, moe, counter, graph: bool) -> dict:
    E, H, inter, K = SHAPES[shape]
    g = torch.Generator().manual_seed(1000 * T + E)
    dt = torch.bfloat16
    x = torch.randn(T, H, generator=g).to(dev, dt)
    w1 = (torch.randn(E, 2 * inter, H, generator=g) * H ** -0.5).to(dev, dt)
    w2 = (torch.randn(E, H, inter, generator=g) * inter ** -0.5).to(dev, dt)
    ids, w = (t.to(dev) for t in base_ids(T, E, K, M, g))
    ref = reference(x, w1, w2, w, ids)
    counter["ours"] = 0
    y = hooks.around_fused_experts(original, x, w1, w2, w, ids)
    ran = "ours" if counter["ours"] else "sglang"
    y2 = hooks.around_fused_experts(original, x, w1, w2, w, ids)
    x_in = x.clone()
    out = hooks.around_fused_experts(original, x_in, w1, w2, w, ids, inplace=True)
    row = dict(shape=shape, T=T, M=M, dropped=int((ids < 0).sum()), ran=ran,
               expected=("ours" if moe.why_not_ours(moe.signature().bind(
                   x, w1, w2, w, ids).arguments, moe.signature(),
                   hooks.state.STATE.config.moe_max_rows) is None else "sglang"),
               rel_ref=rel(y, ref), bitwise_rerun=bool(torch.equal(y, y2)),
               inplace=bool(out.data_ptr() == x_in.data_ptr() and torch.equal(x_in, y)))
    if dev.type == "cuda":
        try:  # its own failure, so it cannot hide the hook's result
            ys = original(x, w1, w2, w, ids, filter_expert=True)
            row.update(rel_sglang_ref=rel(ys, ref), rel_ours_sglang=rel(y, ys))
        except Exception as e:  # noqa: BLE001
            row.update(rel_sglang_ref=float("inf"), sglang_error=f"{type(e).__name__}: {e}"[:300])
    if graph and dev.type == "cuda":
        ids_b, w_b = ids.clone(), w.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up off the capture stream, as SGLang does
            hooks.around_fused_experts(original, x, w1, w2, w_b, ids_b)
        torch.cuda.current_stream().wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            y_g = hooks.around_fused_experts(original, x, w1, w2, w_b, ids_b)
        fails = 0
        for trial in range(3):
            ids_n, w_n = (t.to(dev) for t in base_ids(T, E, K, max(1, M - 4 * trial),
                                                        torch.Generator().manual_seed(trial)))
            ids_b.copy_(ids_n)
            w_b.copy_(w_n)
            cg.replay()
            eager = hooks.around_fused_experts(original, x, w1, w2, w_n, ids_n)
            fails += not torch.equal(y_g, eager)
        row["graph_replays_equal"] = fails == 0
    row["ok"] = bool(row["ran"] == row["expected"] and row["rel_ref"] < TOL and row["bitwise_rerun"]
                     and row["inplace"] and row.get("rel_sglang_ref", 0) < TOL
                     and row.get("graph_replays_equal", True))
    return row


def publish(device: str) -> None:
    """SGLang's process config, as a server publishes it (fused_experts_impl reads its exec bag);
    what tests/plugin/conftest.py does for the CPU tests."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    from base_sglang.plugin.compat import publish_process_config

    publish_process_config(ServerArgs(model_path="dummy", device=device))
    if hasattr(runtime_context, "get_exec"):
        runtime_context.get_exec()  # raises "not published" if the above did not take
    # one rank of tensor parallelism (its all-reduce checks read the TP group: call 4 failed
    # "tensor model parallel group is not initialized" without it)
    import socket

    from sglang.srt.distributed import parallel_state as ps

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                    distributed_init_method=f"tcp://127.0.0.1:{port}",
                                    backend="nccl" if device == "cuda" else "gloo")
    if "tensor_model_parallel_size" in inspect.signature(ps.initialize_model_parallel).parameters:
        ps.initialize_model_parallel(tensor_model_parallel_size=1)  # 0.5.17
    else:
        ps.initialize_model_parallel()  # 0.5.23: the widths come from the published config
    ps.get_tensor_model_parallel_world_size()  # raises if the group is not there


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen3-30b-a3b,olmoe-1b-7b")
    ap.add_argument("--tokens", default="1,2,4,8,16,17,64,65")
    ap.add_argument("--budget-m", type=int, default=16)
    args = ap.parse_args()
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as sgl

    from base_sglang.plugin import hooks, moe, state

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = args.shapes.split(",") if dev.type == "cuda" else ["tiny"]
    tokens = [int(t) for t in args.tokens.split(",")] if dev.type == "cuda" else [1, 3]
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("check_moe_hook: no GPU; on CPU run it with TRITON_INTERPRET=1 (a smoke run)")
    publish(dev.type)
    original = inspect.unwrap(sgl.fused_experts_impl)
    counter = {"ours": 0}
    run_ours = moe.run_ours

    def counted(a):
        counter["ours"] += 1
        return run_ours(a)

    moe.run_ours = counted
    st = state.STATE
    st.config = dataclasses.replace(st.config, moe="auto")
    st.active = True
    rows = []
    for shape in shapes:
        for T in tokens:
            M = args.budget_m if SHAPES[shape][0] > args.budget_m else 2
            try:
                row = check_cell(shape, T, M, dev, original, hooks, moe, counter, graph=True)
            except Exception as e:  # noqa: BLE001 - recorded as a failure, the run goes on
                row = dict(shape=shape, T=T, M=M, ok=False, error=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
    info = dict(gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
                torch=torch.__version__, commit=os.environ.get("BASE_COMMIT", "unknown"),
                sglang=getattr(sys.modules.get("sglang"), "__version__", "unknown"),
                budget_m=args.budget_m, tol=TOL)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "moe_hook.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    print("| shape | T | dropped | ran | rel. err. (ours) | rel. err. (SGLang) | ours vs SGLang | "
          "graph == eager | ok |")
    for r in rows:
        print(f"| {r['shape']} | {r['T']} | {r.get('dropped', '-')} | {r.get('ran', '-')} | "
              f"{r.get('rel_ref', float('nan')):.1e} | {r.get('rel_sglang_ref', float('nan')):.1e} | "
              f"{r.get('rel_ours_sglang', float('nan')):.1e} | {r.get('graph_replays_equal', '-')} | "
              f"{r['ok']} |")
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} hook checks passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
