"""Train the proxy Qwen3-MoE model from scratch inside one time budget (one 10-minute device call).

bf16 model + fp32 master weights and AdamW state; warmup-stable-decay schedule over the time budget
(default) or over a fixed number of steps (`--schedule steps --steps N`: the same run on any GPU that
finishes N steps inside the budget);
CE + per-layer Switch balance loss; `torch.compile` of forward + losses with eager fallback;
all token ids resident on the device. At the end: held-out CE / perplexity, per-layer routing
statistics, a bf16 `save_pretrained` checkpoint with tokenizer files, metrics.json.

    python -m research.proxy.train --data .corpus --out runs/proxy \
        --budget 400 --deadline 540 --pack-to $OUT
    python -m research.proxy.train --data DIR --out DIR --config tiny --steps 30  # CPU smoke
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import lzma
import math
import os
import shutil
import tarfile
import time

T_PROCESS = time.time()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from research.proxy.routing_stats import (  # noqa: E402
    RoutingAccumulator,
    union_curve,
)

CONFIGS = {
    # config A of proxy_model.md: 28.97M parameters, 6.95M active per token
    "A": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=64,
              norm_topk_prob=True),
    # the second proxy (proxy_model.md section 0): another routing convention, 32 experts, top-4,
    # no top-k renormalisation (Qwen1.5-MoE / DeepSeek-V2 style); 22.2M parameters, 5.69M active
    "E32K4": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=128,
                  norm_topk_prob=False),
    # CPU smoke tests
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                 norm_topk_prob=True),
    "tiny-nonorm": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                        norm_topk_prob=False),
}
DEFAULT_WEIGHTS = "wordnet:0.5,gosrc:0.6,rustsrc:0.6,sympy:0.6"
CODE_SOURCES = {"pystdlib", "pytests", "django", "sympy", "gosrc", "rustsrc"}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def log(msg: str) -> None:
    print(f"[{time.time() - T_PROCESS:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- data


def load_data(data_dir: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """train / val token ids as int32 tensors on `device`, plus index.json."""
    index = json.load(open(os.path.join(data_dir, "index.json")))
    with lzma.open(os.path.join(data_dir, "train.u16.xz")) as f:
        train = np.frombuffer(f.read(), dtype=np.uint16)
    val = np.fromfile(os.path.join(data_dir, "val.u16"), dtype=np.uint16)
    to = lambda a: torch.from_numpy(a.astype(np.int32)).to(device)
    return to(train), to(val), index


def parse_weights(spec: str, keys: list[str], strict: bool) -> dict[str, float]:
    weights = {k: 1.0 for k in keys}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition(":")
        if key not in weights:
            if strict:
                raise SystemExit(f"--weights: unknown source '{key}' (known: {', '.join(keys)})")
            continue
        try:
            weights[key] = float(value)
        except ValueError:
            raise SystemExit(f"--weights: '{item}' is not key:number") from None
        if weights[key] < 0:
            raise SystemExit(f"--weights: negative weight for '{key}'")
    return weights


class Sampler:
    """Random windows of seq+1 tokens: a source per row with P ~ tokens x weight, then a uniform
    start inside that source. Runs on the device, no host sync."""

    def __init__(self, ids: torch.Tensor, ranges: dict[str, list[int]], weights: dict[str, float],
                 batch: int, seq: int, seed: int):
        keys = [k for k, (lo, hi) in ranges.items() if hi - lo > seq + 1 and weights.get(k, 0) > 0]
        if not keys:
            raise SystemExit(f"no source has more than seq+1={seq + 1} tokens")
        dev = ids.device
        self.ids, self.batch, self.seq, self.keys = ids, batch, seq, keys
        self.lo = torch.tensor([ranges[k][0] for k in keys], device=dev)
        self.span = torch.tensor([ranges[k][1] - ranges[k][0] - seq - 1 for k in keys], device=dev)
        mass = torch.tensor([(ranges[k][1] - ranges[k][0]) * weights[k] for k in keys], dtype=torch.float64)
        self.probs = (mass / mass.sum()).float().to(dev)
        self.offsets = torch.arange(seq + 1, device=dev)
        self.gen = torch.Generator(device=dev)
        self.gen.manual_seed(seed)

    def mix(self) -> dict[str, float]:
        return {k: round(float(p), 4) for k, p in zip(self.keys, self.probs.cpu())}

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        src = torch.multinomial(self.probs, self.batch, replacement=True, generator=self.gen)  # (B,)
        u = torch.rand(self.batch, generator=self.gen, device=self.ids.device)
        start = self.lo[src] + (u * self.span[src]).long()  # (B,)
        chunk = self.ids[start[:, None] + self.offsets].long()  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]


# ---------------------------------------------------------------- model and loss


def build_model(name: str, vocab: int, seed: int, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab, **CONFIGS[name], decoder_sparse_step=1, mlp_only_layers=[],
        intermediate_size=4 * CONFIGS[name]["hidden_size"], max_position_embeddings=2048,
        rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True,
        output_router_logits=False, router_aux_loss_coef=0.0, bos_token_id=None, eos_token_id=0,
        pad_token_id=1, use_cache=True,
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).to(device=device, dtype=dtype)
    return model


def balance_loss(router_logits: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """Switch balance loss E * sum_i f_i P_i per layer (1.0 when balanced), averaged over layers."""
    losses = []
    for logits in router_logits:  # (N, E) per layer
        probs = logits.float().softmax(-1)  # (N, E)
        n, e = probs.shape
        top = probs.topk(top_k, dim=-1).indices  # (N, k)
        counts = torch.zeros(e, device=probs.device).scatter_add_(
            0, top.reshape(-1), torch.ones(n * top_k, device=probs.device))
        losses.append(e * (counts / (n * top_k) * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def z_loss(router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.stack([torch.logsumexp(lg.float(), -1).pow(2).mean() for lg in router_logits]).mean()


def make_loss_fn(model, aux: float, zloss: float):
    top_k = model.config.num_experts_per_tok

    def loss_fn(x: torch.Tensor, y: torch.Tensor):
        out = model.model(input_ids=x, output_router_logits=True, use_cache=False)
        logits = model.lm_head(out.last_hidden_state).float()  # (B, T, V)
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        bal = balance_loss(out.router_logits, top_k)
        total = ce + aux * bal
        if zloss > 0:
            total = total + zloss * z_loss(out.router_logits)
        return total, ce.detach(), bal.detach()

    return loss_fn


# ---------------------------------------------------------------- optimiser


class MasterAdamW:
    """fp32 master copies + fused AdamW on them; the (bf16) model params are overwritten each step."""

    def __init__(self, model, lr: float, wd: float, betas=(0.9, 0.95), eps=1e-8):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        decay = [m for p, m in zip(self.params, self.master) if p.ndim >= 2]
        no_decay = [m for p, m in zip(self.params, self.master) if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
        fused = self.params[0].is_cuda
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)

    def step(self, lr: float, clip: float) -> torch.Tensor:
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
            p.grad = None
        norm = torch.nn.utils.clip_grad_norm_(self.master, clip)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)
        for m in self.master:
            m.grad = None
        return norm


def lr_at(step: int, progress: float, peak: float, warmup: int, decay_frac: float, floor: float) -> float:
    """Warmup (by steps), then flat, then linear decay to floor*peak over the last decay_frac of the
    run; progress in [0, 1] is the share of the time budget used or of the scheduled steps done."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    if progress <= 1.0 - decay_frac:
        return peak * warm
    frac = min(1.0, (progress - (1.0 - decay_frac)) / decay_frac)
    return peak * warm * (1.0 - (1.0 - floor) * frac)


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model, val: torch.Tensor, index: dict, seq: int, batch: int, max_tokens: int) -> dict:
    """Held-out CE over consecutive windows of the val stream, and routing statistics."""
    cfg = model.config
    e, k, n_layers = cfg.num_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers
    n_win = min((len(val) - 1) // seq, max(1, max_tokens // seq))
    starts = torch.arange(n_win, device=val.device) * seq
    # which source each window starts in (for code-vs-text routing)
    code_lo_hi = [(lo, hi) for key, (lo, hi) in index["val"].items() if key in CODE_SOURCES]
    acc = RoutingAccumulator(n_layers, e, k, val.device)
    nll, count = torch.zeros((), dtype=torch.float64, device=val.device), 0
    offsets = torch.arange(seq + 1, device=val.device)
    for i in range(0, n_win, batch):
        s = starts[i : i + batch]
        chunk = val[s[:, None] + offsets].long()  # (b, T+1)
        x, y = chunk[:, :-1], chunk[:, 1:]
        out = model.model(input_ids=x, output_router_logits=True, use_cache=False)
        logits = model.lm_head(out.last_hidden_state).float()
        nll += F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").double()
        count += y.numel()
        is_code = torch.zeros(len(s), dtype=torch.bool, device=val.device)
        for lo, hi in code_lo_hi:
            is_code |= (s >= lo) & (s < hi)
        group = is_code[:, None].expand(-1, seq).reshape(-1)  # (b*T,)
        acc.add(out.router_logits, group)
    ce = (nll / count).item()
    return {"heldout_tokens": count, "heldout_ce": ce, "heldout_ppl": math.exp(ce), "routing": acc.summary()}


def doc_windows(val: torch.Tensor, index: dict, n_docs: int, length: int) -> torch.Tensor:
    """The first `length` tokens of n_docs different held-out documents, spread over sources."""
    ids = val.cpu().numpy()
    per_source = {}
    for key, (lo, hi) in index["val"].items():
        eos = np.flatnonzero(ids[lo:hi] == index["eos_id"]) + lo
        starts = np.concatenate([[lo], eos[:-1] + 1])
        per_source[key] = [int(s) for s, e in zip(starts, eos) if e - s >= length]
    picked, rnd = [], 0
    while len(picked) < n_docs and any(len(v) > rnd for v in per_source.values()):
        picked += [v[rnd] for v in per_source.values() if len(v) > rnd]
        rnd += 1
    if len(picked) < n_docs:
        raise SystemExit(f"held-out set has only {len(picked)} documents of >= {length} tokens")
    starts = torch.tensor(picked[:n_docs], device=val.device)
    return val[starts[:, None] + torch.arange(length, device=val.device)].long()  # (n_docs, length)


@torch.no_grad()
def union_stats(model, val: torch.Tensor, index: dict, length: int, batch_sizes=(1, 4, 8, 16, 32)) -> dict:
    docs = doc_windows(val, index, max(batch_sizes), length)
    out = model.model(input_ids=docs, output_router_logits=True, use_cache=False)
    k = model.config.num_experts_per_tok
    return union_curve(out.router_logits, docs.shape[0], length, k, batch_sizes)


@torch.no_grad()
def samples(model, tok_dir: str, prompts: list[str], new_tokens: int) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    texts = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids.to(model.device)
        gen = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=1)
        texts.append(tok.decode(gen[0], skip_special_tokens=True))
    return texts


# ---------------------------------------------------------------- save


def save(model, out_dir: str, tok_dir: str | None) -> None:
    from transformers import GenerationConfig

    model.config.output_router_logits = False
    model.config.use_cache = True
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=0, pad_token_id=1,
                                               max_new_tokens=128)
    bf16 = model if model.dtype == torch.bfloat16 else copy.deepcopy(model).to(torch.bfloat16)
    bf16.save_pretrained(out_dir, max_shard_size="15MB")
    cfg_path = os.path.join(out_dir, "config.json")
    cfg = json.load(open(cfg_path))
    # 4.x key names next to the 5.x ones, so older transformers can read the config too
    cfg.setdefault("num_experts", model.config.num_experts)
    cfg.setdefault("rope_theta", 10000.0)
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    if tok_dir:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            src = os.path.join(tok_dir, name)
            if os.path.exists(src):
                shutil.copy(src, out_dir)


def pack(src_dir: str, dest_dir: str, part_mib: int = 15) -> list[str]:
    """tar of src_dir split into part_mib-MiB files model.tar.part-NN (cat them to untar)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src_dir, arcname=os.path.basename(src_dir.rstrip("/")))
    data, size, parts = buf.getvalue(), part_mib << 20, []
    os.makedirs(dest_dir, exist_ok=True)
    for i in range(0, len(data), size):
        path = os.path.join(dest_dir, f"model.tar.part-{i // size:02d}")
        with open(path, "wb") as f:
            f.write(data[i : i + size])
        parts.append(path)
    return parts


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with train.u16.xz, val.u16, index.json")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: DATA/tokenizer)")
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument("--config", default="A", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150, help="warmup steps")
    ap.add_argument("--decay-frac", type=float, default=0.25, help="share of the time budget spent decaying")
    ap.add_argument("--lr-floor", type=float, default=0.1, help="final LR as a share of --lr")
    ap.add_argument("--aux", type=float, default=0.01, help="per-layer balance loss coefficient")
    ap.add_argument("--zloss", type=float, default=0.0, help="router z-loss coefficient")
    ap.add_argument("--weights", default=None, help=f"source weights key:w,... (default {DEFAULT_WEIGHTS})")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds of optimisation")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds from process start to be done by")
    ap.add_argument("--reserve", type=float, default=70.0, help="seconds kept for eval + save")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: time only)")
    ap.add_argument("--schedule", default="time", choices=["time", "steps"],
                    help="LR decay by the share of the time budget used (time) or of --steps done "
                         "(steps: the same run on any GPU, as long as the budget lets --steps finish)")
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                    help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--eval-tokens", type=int, default=2_000_000)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--union-len", type=int, default=256, help="tokens per document for the union statistics")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--pack-to", default=None, help="also write model.tar.part-NN, metrics.json here")
    a = ap.parse_args(argv)
    for name in ("batch", "seq", "warmup", "log_every", "eval_batch", "union_len"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if a.budget <= 0 or a.deadline <= 0:
        ap.error("--budget and --deadline must be positive")
    if a.schedule == "steps" and a.steps <= 0:
        ap.error("--schedule steps needs --steps > 0")
    if not 0 < a.decay_frac <= 1 or not 0 <= a.lr_floor <= 1:
        ap.error("--decay-frac must be in (0, 1], --lr-floor in [0, 1]")
    for f in ("train.u16.xz", "val.u16", "index.json"):
        if not os.path.exists(os.path.join(a.data, f)):
            ap.error(f"--data: {os.path.join(a.data, f)} not found")
    tok_dir = a.tokenizer or os.path.join(a.data, "tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        tok_dir = None

    device = torch.device(a.device)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(a.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        log(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    import transformers

    train_ids, val_ids, index = load_data(a.data, device)
    log(f"data: {len(train_ids) / 1e6:.2f}M train, {len(val_ids) / 1e6:.3f}M val tokens; "
        f"transformers {transformers.__version__}")
    weights = parse_weights(a.weights if a.weights is not None else DEFAULT_WEIGHTS, list(index["train"]),
                            strict=a.weights is not None)
    sampler = Sampler(train_ids, index["train"], weights, a.batch, a.seq, a.seed)
    log(f"mix: {sampler.mix()}")

    model = build_model(a.config, index["vocab_size"], a.seed, device, dtype)
    n_total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_active = n_total - n_expert + n_expert * cfg.num_experts_per_tok // cfg.num_experts
    log(f"model {a.config}: {n_total / 1e6:.2f}M params, {n_active / 1e6:.2f}M active/token, "
        f"experts impl {cfg._experts_implementation}, attn {cfg._attn_implementation}, dtype {dtype}")
    opt = MasterAdamW(model, a.lr, a.wd)
    loss_fn = make_loss_fn(model, a.aux, a.zloss)
    step_fn = loss_fn
    want_compile = a.compile == "on" or (a.compile == "auto" and device.type == "cuda")
    if want_compile:
        step_fn = torch.compile(loss_fn)

    def run_step(fn, step: int, lr: float):
        x, y = sampler.next()
        loss, ce, bal = fn(x, y)
        loss.backward()
        norm = opt.step(lr, 1.0)
        return loss.detach(), ce, bal, norm

    # first step (compiles); fall back to eager if compiling fails
    model.train()
    t0 = time.time()
    try:
        stats = run_step(step_fn, 0, lr_at(0, 0.0, a.lr, a.warmup, a.decay_frac, a.lr_floor))
        compiled = want_compile
    except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager
        if not want_compile:
            raise
        log(f"torch.compile failed ({type(exc).__name__}: {str(exc)[:300]}); falling back to eager")
        for p in model.parameters():
            p.grad = None
        step_fn, compiled = loss_fn, False
        stats = run_step(step_fn, 0, lr_at(0, 0.0, a.lr, a.warmup, a.decay_frac, a.lr_floor))
    first_loss = stats[1].item()
    first_step_s = time.time() - t0
    log(f"step 0 (incl. compile={compiled}) {first_step_s:.1f}s, ce {first_loss:.3f}")

    # the time budget starts now; it shrinks so that eval + save finish before the deadline
    budget = min(a.budget, a.deadline - (time.time() - T_PROCESS) - a.reserve)
    if budget <= 0:
        log(f"no time left for training (deadline {a.deadline}s); only step 0 ran")
    t_start, step, tokens = time.time(), 1, a.batch * a.seq
    hist, run_ce, train_error = [], torch.zeros((), device=device), None
    n_run = 0
    last_log_t, last_log_tok = t_start, tokens
    while budget > 0:
        elapsed = time.time() - t_start
        if elapsed >= budget or (a.steps and step >= a.steps):
            break
        progress = step / a.steps if a.schedule == "steps" else elapsed / budget
        lr = lr_at(step, progress, a.lr, a.warmup, a.decay_frac, a.lr_floor)
        try:
            loss, ce, bal, norm = run_step(step_fn, step, lr)
        except Exception as exc:  # noqa: BLE001 - keep what was trained so far
            log(f"step {step} failed ({type(exc).__name__}: {str(exc)[:300]}); stopping and saving")
            train_error = f"{type(exc).__name__}: {exc}"
            break
        run_ce += ce
        n_run += 1
        step += 1
        tokens += a.batch * a.seq
        if step % a.log_every == 0:
            mean_ce = (run_ce / n_run).item()  # host sync, once per log interval
            now = time.time()
            tps = (tokens - last_log_tok) / (now - last_log_t)
            hist.append({"step": step, "t": round(now - t_start, 1), "ce": round(mean_ce, 4),
                         "aux": round(bal.item(), 4), "lr": lr, "grad_norm": round(norm.item(), 3),
                         "tok_s": round(tps)})
            log(f"step {step:5d}  ce {mean_ce:.4f}  bal {bal.item():.4f}  lr {lr:.2e}  "
                f"|g| {norm.item():.2f}  {tps / 1e6:.2f}M tok/s")
            run_ce.zero_()
            n_run, last_log_t, last_log_tok = 0, now, tokens
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t_start
    final_ce = (run_ce / n_run).item() if n_run else (hist[-1]["ce"] if hist else first_loss)
    log(f"trained {step} steps, {tokens / 1e6:.1f}M tokens in {train_s:.1f}s "
        f"({(tokens - a.batch * a.seq) / max(train_s, 1e-9) / 1e6:.2f}M tok/s after step 0)")
    schedule_done = a.schedule == "time" or step >= a.steps
    if not schedule_done:
        log(f"WARNING: the time budget ended the step schedule at {step} of {a.steps} steps; "
            "this checkpoint is not the scheduled run")

    model.eval()
    save(model, a.out, tok_dir)  # first, so that a failing evaluation cannot lose the weights
    log(f"saved {a.out}")
    t_eval = time.time()
    try:
        metrics = evaluate(model, val_ids, index, a.seq, a.eval_batch, a.eval_tokens)
        metrics["union"] = union_stats(model, val_ids, index, a.union_len)
    except Exception as exc:  # noqa: BLE001 - report it, still write metrics and pack
        log(f"evaluation failed: {type(exc).__name__}: {exc}")
        metrics = {"eval_error": f"{type(exc).__name__}: {exc}"}
    if "heldout_ce" in metrics:
        log(f"held-out ce {metrics['heldout_ce']:.4f} ppl {metrics['heldout_ppl']:.2f} "
            f"on {metrics['heldout_tokens']} tokens ({time.time() - t_eval:.1f}s)")
        for i, layer in enumerate(metrics["routing"]["layers"]):
            log(f"  layer {i}: max/mean {layer['load_max_over_mean']:.2f} "
                f"min/mean {layer['load_min_over_mean']:.2f} dead {layer['dead_experts']} "
                f"entropy {layer['load_entropy']:.3f} MI {layer['mutual_info']:.3f} "
                f"union@16 {metrics['union']['per_layer'][16][i]:.1f} code/text TV {_fmt(layer['code_text_tv'])}")
        u = metrics["union"]
        log("  union mean over layers: " + ", ".join(
            f"B={b}: {u['mean'][b]:.1f} (uniform {u['uniform'][b]:.1f})" for b in u["batch_sizes"]))
    if tok_dir:
        try:
            metrics["samples"] = samples(model, tok_dir, ["def fibonacci(n):", "The history of the",
                                                           "It is a truth universally acknowledged"], 40)
            for s in metrics["samples"]:
                log(f"  sample: {s!r}")
        except Exception as exc:  # noqa: BLE001 - samples are a bonus; never lose the run over them
            log(f"generation failed: {type(exc).__name__}: {exc}")

    metrics.update({
        "config": a.config, "model_config": CONFIGS[a.config], "params_total": n_total,
        "params_active": n_active, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": str(dtype),
        "compiled": compiled, "first_step_s": round(first_step_s, 2), "first_ce": first_loss,
        "steps": step, "schedule": a.schedule, "schedule_done": schedule_done, "tokens": tokens, "train_s": round(train_s, 1), "final_train_ce": final_ce,
        "tokens_per_s": round((tokens - a.batch * a.seq) / max(train_s, 1e-9)),
        "epochs": tokens / len(train_ids), "mix": sampler.mix(), "history": hist,
        "train_error": train_error, "args": vars(a), "wall_s": round(time.time() - T_PROCESS, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
    })
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    if a.pack_to:
        parts = pack(a.out, a.pack_to)
        shutil.copy(os.path.join(a.out, "metrics.json"), a.pack_to)
        log(f"packed {len(parts)} parts into {a.pack_to}")
    log(f"done in {time.time() - T_PROCESS:.1f}s")
    return metrics


if __name__ == "__main__":
    main()
