"""Tensor parallelism on CPU: W ranks as processes (torch.distributed gloo) decoding a small TP MoE
model with BASE's selection in every layer, and a per-step, per-layer check that they agree.

One decode step of one layer on rank r of W, in SGLang's TP layout of a Qwen3-MoE block:
    y_r    = silu(h @ Wa_r)                     column-parallel stand-in for attention  [T, F/W]
    h      = h + all_reduce(y_r @ Wo_r)         row-parallel output projection: partial sums [T, H]
    x      = rmsnorm(h)                         replicated: the router (and predictor) input [T, H]
    logits = x @ Wg.T                           replicated router                        [T, E]
    ids, w = top-k + BASE selection, per-row budgets, padded rows -1                     [T, K]
    h      = h + all_reduce(sum_k w * expert_r(x))   rank r holds I/W of every expert's inner dim
Every step the ranks all-gather, per layer, digests of x and of the kept ids and weights and count
where they differ. Batches change every step (rows 1..max, padded to the next "graph" size like
SGLang's CUDA-graph padding; padded rows carry rank-local garbage) and every row has its own
budget. `selector="core"` calls base_sglang.core.select_experts; `selector="hook"` runs the real
sglang TopK with the plugin's hooks (sglang must be importable; each rank loads the plugins as an
SGLang TP worker does, and BASE_SELECTION_TRACE writes the per-rank trace files).

Faults (from step `fault_from_step` on), to show the check can fail: "last_bit" flips the lowest mantissa bit of one element of rank
1's all-reduced attention output; "rank_order_reduce" replaces that all-reduce by a sum of the
gathered partials in a rank-dependent order (what float atomics do: the order of the additions
varies, so the rounding does).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

FAULTS = (None, "last_bit", "rank_order_reduce")
SELECTORS = ("core", "hook")


@dataclass(frozen=True)
class TPSimConfig:
    world: int = 2
    layers: int = 4
    hidden: int = 64  # H
    attn: int = 64  # F, width of the column/row-parallel pair
    experts: int = 32  # E
    top_k: int = 4  # K
    inter: int = 16  # I, expert intermediate size (split over the ranks)
    steps: int = 300
    graph_sizes: tuple[int, ...] = (4, 8, 16, 32)
    budgets: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    dense_row_rate: float = 0.01  # a row asks for dense (E): its whole batch runs dense
    seed: int = 0
    selector: str = "core"
    fault: str | None = None
    fault_from_step: int = 0  # clean steps before the fault starts (one run shows both)
    trace_prefix: str | None = None  # BASE_SELECTION_TRACE (selector "hook")
    extra_env: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.selector not in SELECTORS:
            raise ValueError(f"selector: must be one of {SELECTORS}, got {self.selector!r}")
        if self.fault not in FAULTS:
            raise ValueError(f"fault: must be one of {FAULTS}, got {self.fault!r}")
        for name, size in (("attn", self.attn), ("inter", self.inter)):
            if size % (2 * self.world):
                raise ValueError(f"{name}: {size} is not divisible by 2 x world ({self.world})")


# ---- the parent ---------------------------------------------------------------------------------
def run(config: TPSimConfig, out_dir: str | Path, timeout: float = 60.0) -> list[dict]:
    """Run the ranks, wait at most `timeout` seconds, return each rank's result dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _predictor(config).save(out / "predictor.safetensors")
    ctx = torch.multiprocessing.start_processes(
        _rank_main, args=(config, str(out), _free_port()), nprocs=config.world, join=False,
        start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"TP simulation ({config.world} ranks) did not finish in {timeout} s")
    return [json.loads((out / f"result.rank{r}.json").read_text()) for r in range(config.world)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one rank -----------------------------------------------------------------------------------
def _rank_main(rank: int, config: TPSimConfig, out_dir: str, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(config.extra_env)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=config.world, timeout=timedelta(seconds=30))
    kind = CoreSelector if config.selector == "core" else HookSelector
    select = kind(config, Path(out_dir))
    result = _decode(rank, config, select)
    result["rank"] = rank
    (Path(out_dir) / f"result.rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()  # every rank is done communicating
    # NOTE: skip the interpreter's teardown: with sglang imported, a C++ thread's destructor can
    # abort at exit ("terminate called without an active exception") after the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _decode(rank: int, cfg: TPSimConfig, select) -> dict:
    from base_sglang.plugin.selection_trace import selection_digest, tensor_digest

    W = cfg.world
    wts = _weights(cfg)  # full weights, identical on every rank (seeded)
    Fr, Ir = cfg.attn // W, cfg.inter // W
    shard = {"wa": [w[:, rank * Fr:(rank + 1) * Fr] for w in wts["wa"]],  # [H, F/W]
             "wo": [w[rank * Fr:(rank + 1) * Fr] for w in wts["wo"]],  # [F/W, H]
             "w1": [w[:, rank * Ir:(rank + 1) * Ir] for w in wts["w1"]],  # [E, I/W, H]
             "w3": [w[:, rank * Ir:(rank + 1) * Ir] for w in wts["w3"]],  # [E, I/W, H]
             "w2": [w[:, :, rank * Ir:(rank + 1) * Ir] for w in wts["w2"]]}  # [E, H, I/W]
    fields = ("router_input", "ids", "weights")
    diff_steps = dict.fromkeys(fields, 0)
    first, tp1_err, kept_sum, union_sum, padded_rows = None, 0.0, 0, 0, 0
    for step in range(cfg.steps):
        rows, T, budgets = _schedule(cfg, step)
        padded_rows += T - rows
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        h = torch.randn(T, cfg.hidden, generator=g)  # [T, H] token embeddings, same on all ranks
        local = torch.Generator().manual_seed(10_000 * rank + step)
        digests, step_diff = [], set()
        with select.step(budgets, T) as sel:
            for layer in range(cfg.layers):
                y = F.silu(h @ shard["wa"][layer])  # [T, F/W]
                attn = _attn_reduce(cfg, rank, y, shard["wo"][layer],
                                    cfg.fault if step >= cfg.fault_from_step else None)  # [T, H]
                if rank == 0:
                    full = F.silu(h @ wts["wa"][layer]) @ wts["wo"][layer]  # [T, H] TP=1
                    tp1_err = max(tp1_err, (attn - full)[:rows].abs().max().item())
                h = h + attn
                h[rows:] = torch.randn(T - rows, cfg.hidden, generator=local) * 100  # rank-local
                x = _rmsnorm(h)  # [T, H]
                logits = x @ wts["wg"][layer].T  # [T, E]
                ids, w, k, u = sel(layer, x, logits)  # [T, K] each
                kept_sum, union_sum = kept_sum + k, union_sum + u
                moe = _experts(x, ids, w, shard["w1"][layer], shard["w3"][layer],
                               shard["w2"][layer])  # [T, H] partial
                dist.all_reduce(moe)
                if rank == 0:
                    full = _experts(x, ids, w, wts["w1"][layer], wts["w3"][layer],
                                    wts["w2"][layer])
                    tp1_err = max(tp1_err, (moe - full)[:rows].abs().max().item())
                h = h + moe
                digests.append((tensor_digest(x[:rows]), *selection_digest(ids, w)))
        everyone = [None] * W
        dist.all_gather_object(everyone, digests)
        for layer in range(cfg.layers):
            for i, name in enumerate(fields):
                vals = [d[layer][i] for d in everyone]
                if any(v != vals[0] for v in vals):
                    step_diff.add(name)
                    if first is None:
                        first = {"step": step, "layer": layer, "field": name, "values": vals}
        for name in step_diff:
            diff_steps[name] += 1
    n_sel = cfg.steps * cfg.layers
    return {"config": {**asdict(cfg), "graph_sizes": list(cfg.graph_sizes),
                       "budgets": list(cfg.budgets)},
            "steps": cfg.steps, "layers": cfg.layers, "steps_differing": diff_steps,
            "agree": not any(diff_steps.values()), "first_mismatch": first,
            "max_abs_err_vs_tp1": tp1_err if rank == 0 else None,
            "mean_kept": kept_sum / n_sel, "mean_union": union_sum / n_sel,
            "padded_rows": padded_rows, "select_fn": select.name}


def _schedule(cfg: TPSimConfig, step: int):
    """(real rows, padded rows T, per-row budgets) of one step, the same on every rank."""
    g = torch.Generator().manual_seed(cfg.seed * 7919 + step)
    top = max(cfg.graph_sizes)
    rows = int(torch.randint(1, top + 1, (1,), generator=g))
    T = min(s for s in cfg.graph_sizes if s >= rows)
    pick = torch.randint(0, len(cfg.budgets), (rows,), generator=g)
    dense = torch.rand(rows, generator=g) < cfg.dense_row_rate
    budgets = [cfg.experts if d else cfg.budgets[i] for i, d in zip(pick.tolist(), dense.tolist())]
    return rows, T, budgets


def _attn_reduce(cfg, rank, y, wo, fault):
    """The row-parallel projection's all-reduce, or one of the faults."""
    if fault != "rank_order_reduce":
        out = y @ wo  # [T, H] this rank's partial sum
        dist.all_reduce(out)
        if fault == "last_bit" and rank == 1:
            out.view(torch.int32)[0, 0] ^= 1  # one ulp in one element of one real row
        return out
    half = y.shape[1] // 2
    parts = torch.stack([y[:, :half] @ wo[:half], y[:, half:] @ wo[half:]])  # [2, T, H]
    everyone = [torch.empty_like(parts) for _ in range(cfg.world)]
    dist.all_gather(everyone, parts)
    order = [rank, *[r for r in range(cfg.world) if r != rank]]  # own partials first
    out = torch.zeros_like(parts[0])
    for r in order:
        for p in everyone[r]:
            out = out + p
    return out


def _rmsnorm(h, eps=1e-6):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def _experts(x, ids, w, w1, w3, w2):
    """sum_k w[t,k] * expert_{ids[t,k]}(x[t]) over this rank's slice; -1 slots contribute 0."""
    ok = ids >= 0  # [T, K]
    e = ids.long().clamp_min(0)  # [T, K]
    gate = torch.einsum("th,tkih->tki", x, w1[e])  # [T, K, I/W]
    up = torch.einsum("th,tkih->tki", x, w3[e])  # [T, K, I/W]
    out = torch.einsum("tki,tkhi->tkh", F.silu(gate) * up, w2[e])  # [T, K, H]
    return (out * (w.float() * ok)[..., None]).sum(1)  # [T, H]


def _weights(cfg: TPSimConfig) -> dict:
    """Full (TP=1) weights, seeded: every rank builds the same and slices its shard."""
    g = torch.Generator().manual_seed(cfg.seed + 17)
    L, H, Fw, E, Ie = cfg.layers, cfg.hidden, cfg.attn, cfg.experts, cfg.inter

    def r(*shape, fan_in, scale=1.0):
        return torch.randn(*shape, generator=g) * (scale / fan_in ** 0.5)

    return {"wa": [r(H, Fw, fan_in=H) for _ in range(L)],  # [H, F]
            "wo": [r(Fw, H, fan_in=Fw, scale=0.5) for _ in range(L)],  # [F, H]
            "wg": [r(E, H, fan_in=H, scale=4.0) for _ in range(L)],  # [E, H] peaked routing
            "w1": [r(E, Ie, H, fan_in=H) for _ in range(L)],  # [E, I, H]
            "w3": [r(E, Ie, H, fan_in=H) for _ in range(L)],  # [E, I, H]
            "w2": [r(E, H, Ie, fan_in=Ie) for _ in range(L)]}  # [E, H, I]


def _predictor(cfg: TPSimConfig):
    from base_sglang.core import Predictor, PredictorMeta

    g = torch.Generator().manual_seed(cfg.seed + 29)
    meta = PredictorMeta(architecture="Qwen3MoeForCausalLM", model_id="tp-sim",
                         num_layers=cfg.layers, moe_layers=list(range(cfg.layers)),
                         hidden_size=cfg.hidden, num_experts=cfg.experts, top_k=cfg.top_k)
    return Predictor(meta=meta, weight=torch.randn(cfg.layers, cfg.experts, cfg.hidden, generator=g)
                     * 0.3, bias=torch.randn(cfg.layers, cfg.experts, generator=g))


# ---- selectors: the core, or the plugin's hook on a real sglang TopK --------------------------------
class CoreSelector:
    """base_sglang.core.select_experts after a plain softmax top-k (SGLang's native TopK math)."""

    def __init__(self, cfg: TPSimConfig, out: Path):
        from base_sglang.core import Predictor, SelectionConfig, select_experts

        self.cfg, self.select = cfg, select_experts
        self.predictor = Predictor.load(out / "predictor.safetensors")
        self.config = SelectionConfig()
        self.name = "base_sglang.core.select_experts"

    def step(self, budgets, T):
        from contextlib import contextmanager

        budget = torch.tensor(budgets + [-1] * (T - len(budgets)))  # [T] padded rows -1

        @contextmanager
        def ctx():
            def sel(layer, x, logits):
                w, ids = torch.softmax(logits, -1).topk(self.cfg.top_k, dim=-1)  # [T, K]
                w = w / w.sum(-1, keepdim=True)
                s = self.select(logits, ids.int(), w, x, budget, layer, self.config,
                                self.predictor, norm_topk_prob=True)
                return s.ids, s.weights, int(s.stats.num_kept), int(s.stats.num_union)
            yield sel

        return ctx()


class HookSelector:
    """The plugin's TopK hook on real sglang TopK modules, inside the plugin's decode step."""

    def __init__(self, cfg: TPSimConfig, out: Path):
        os.environ.update(SGLANG_PLUGINS="base", BASE_PREDICTOR=str(out / "predictor.safetensors"),
                          BASE_STATS_INTERVAL="0", BASE_DEFAULT_BUDGET="dense")
        if cfg.trace_prefix:
            os.environ["BASE_SELECTION_TRACE"] = cfg.trace_prefix
        from sglang.srt.plugins import load_plugins

        load_plugins()  # as every SGLang TP worker process does
        _publish_cpu_topology()
        from sglang.srt.layers.moe.topk import TopK

        from base_sglang.core import Predictor
        from base_sglang.plugin import state

        if state.STATE.config_error:
            raise ValueError(state.STATE.config_error)
        self.state = state.STATE
        self.state.enable(Predictor.load(out / "predictor.safetensors"), self.state.config, "cpu")
        self.state.ensure_buffer(max(cfg.graph_sizes), "cpu")
        self.topk = [TopK(top_k=cfg.top_k, layer_id=layer, renormalize=True)
                     for layer in range(cfg.layers)]
        self.name = f"plugin hook on sglang TopK ({self.state.select.__name__})"

    def step(self, budgets, T):
        from contextlib import contextmanager

        st = self.state

        @contextmanager
        def ctx():
            with st.decode_step(budgets) as on:
                if not on:
                    raise RuntimeError("the plugin's decode gate did not open")

                def sel(layer, x, logits):
                    before = st.num_kept[layer].item(), st.num_union[layer].item()
                    out = self.topk[layer](x, logits)
                    return (out.topk_ids, out.topk_weights, st.num_kept[layer].item() - before[0],
                            st.num_union[layer].item() - before[1])
                yield sel

        return ctx()


def _publish_cpu_topology() -> None:
    """SGLang's process topology for a CPU process (as tests/plugin/conftest.py `published`)."""
    from sglang.srt.server_args import ServerArgs

    from base_sglang.plugin.compat import publish_process_config

    publish_process_config(ServerArgs(model_path="dummy", device="cpu", tp_size=dist.get_world_size()),
                           world_rank=dist.get_rank())
