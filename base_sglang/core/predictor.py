"""The predictor file: per-(layer, expert) linear model of log ||E_u(z)|| plus baseline statistics.

One file, safetensors: tensors stacked over the model's MoE layers (index j <-> layer moe_layers[j]) and
a JSON metadata blob under the safetensors metadata key "base_sglang".

Shape legend: L = number of MoE layers, E = routed experts, H = hidden size.
  weight       [L, E, H] fp32  a_u of  yhat = <z, a_u> + b_u  (predicted log-norm)
  bias         [L, E]    fp32  b_u
  expert_freq  [L, E]    fp32  share of routed slots per expert (frequency baseline)      (optional)
  expert_norm  [L, E]    fp32  mean unweighted output norm h_e (ExFold importance)        (optional)
  sere_sim     [L, E, E] fp32  SERE expert similarity                                     (optional)
  exfold_coef  [L, E, E] fp32  ExFold fold coefficient s -> t                              (optional)
  exfold_loss  [L, E, E] fp32  ExFold relative residual s -> t                             (optional)
  layer_budget [L, E+1]  fp32  per-layer budget M_l for each batch budget M = 0..E (integer values
                               in 0..E, same total over the layers; calibration/layer_schedule.py),
                               one table for every batch size                              (optional)
            or [R, L, E+1]     one such table per batch-size range r = 0..R-1, ranges ascending
  layer_budget_max_batch [R-1] fp32  integer upper bounds (inclusive, >= 1, strictly ascending) of the
                               decode rows of ranges 0..R-2; range R-1 is open-ended (absent or
                               empty with a single table)                                  (optional)

Schedule range of a step (Predictor.schedule_range): the first r with rows <= layer_budget_max_batch[r],
else R-1, where rows is the number of decode rows the selection sees, router_logits.shape[0]: the
running requests in the native engine and base-eval; under SGLang's CUDA graphs the captured graph's
batch size (padding rows included), which is what the kernels see. The pick is a host-side choice of
the [E+1] row (no device synchronisation; fixed for a captured graph).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1
METADATA_KEY = "base_sglang"
OPTIONAL_TENSORS = ("expert_freq", "expert_norm", "sere_sim", "exfold_coef", "exfold_loss",
                    "layer_budget", "layer_budget_max_batch")
HOST_TENSORS = ("layer_budget_max_batch",)  # read on the host per step: Predictor.to keeps them on CPU


class PredictorMismatch(ValueError):
    """The predictor file does not belong to this model; the message names the field."""


@dataclass
class PredictorMeta:
    architecture: str
    model_id: str
    num_layers: int
    moe_layers: list[int]
    hidden_size: int
    num_experts: int
    top_k: int
    norm_topk_prob: bool = True
    calibration: dict[str, Any] = field(default_factory=dict)  # data description, token counts, lambda
    fit_stats: dict[str, dict[str, float]] = field(default_factory=dict)  # str(layer) -> stats
    format_version: int = FORMAT_VERSION


@dataclass
class Predictor:
    meta: PredictorMeta
    weight: torch.Tensor  # [L, E, H]
    bias: torch.Tensor  # [L, E]
    expert_freq: torch.Tensor | None = None  # [L, E]
    expert_norm: torch.Tensor | None = None  # [L, E]
    sere_sim: torch.Tensor | None = None  # [L, E, E]
    exfold_coef: torch.Tensor | None = None  # [L, E, E]
    exfold_loss: torch.Tensor | None = None  # [L, E, E]
    layer_budget: torch.Tensor | None = None  # [L, E+1] or [R, L, E+1]
    layer_budget_max_batch: torch.Tensor | None = None  # upper bounds of the ranges (CPU)

    def __post_init__(self):
        m = self.meta
        num_moe = len(m.moe_layers)
        _check_shape("weight", self.weight, (num_moe, m.num_experts, m.hidden_size))
        _check_shape("bias", self.bias, (num_moe, m.num_experts))
        for name in OPTIONAL_TENSORS:
            t = getattr(self, name)
            if t is not None and name not in ("layer_budget", "layer_budget_max_batch"):
                tail = (m.num_experts,) * (1 if name in ("expert_freq", "expert_norm") else 2)
                _check_shape(name, t, (num_moe, *tail))
        self._slot = {layer: j for j, layer in enumerate(m.moe_layers)}
        self._check_schedule()

    def _check_schedule(self) -> None:
        """Validate layer_budget / layer_budget_max_batch; cache the range bounds (host ints)."""
        self._bounds = check_layer_budget(self.layer_budget, self.layer_budget_max_batch,
                                          len(self.meta.moe_layers), self.meta.num_experts)
        self._bounds_of = (self.layer_budget, self.layer_budget_max_batch)

    # ---- lookup ---------------------------------------------------------------------------
    def check_stats(self, policy: str, stat: str | None, where: str) -> None:
        """Raise, naming the file, when a policy's statistic (SelectionConfig.needs_stats) is absent."""
        if stat not in (None, "predictor") and getattr(self, stat) is None:
            hint = (" (python -m base_sglang.calibration.layer_schedule writes it)"
                    if stat == "layer_budget" else "")
            raise ValueError(f"predictor: policy {policy!r} needs the {stat!r} statistics, which "
                             f"{where} lacks{hint}")

    @property
    def schedule_bounds(self) -> tuple[int, ...]:
        """Inclusive upper bounds of the decode rows of schedule ranges 0..R-2 (() = one table)."""
        if self._bounds_of[0] is not self.layer_budget or \
                self._bounds_of[1] is not self.layer_budget_max_batch:
            self._check_schedule()  # a table assigned after construction is validated once
        return self._bounds

    def schedule_range(self, rows: int) -> int:
        """Index r of the layer_budget table serving a step of `rows` decode rows: the first range
        with rows <= layer_budget_max_batch[r], else the last (open-ended) one."""
        return bisect.bisect_left(self.schedule_bounds, int(rows))

    def layer_schedule(self, layer_id: int, rows: int) -> torch.Tensor:
        """[E+1] per-layer budgets of this layer for a step of `rows` decode rows (a view)."""
        if self.layer_budget is None:
            raise ValueError("predictor: no 'layer_budget' table (python -m "
                             "base_sglang.calibration.layer_schedule writes it)")
        r = self.schedule_range(rows)
        table = self.layer_budget if self.layer_budget.dim() == 3 else self.layer_budget[None]
        return table[r, self.slot(layer_id)]

    def slot(self, layer_id: int) -> int:
        """Index into the stacked tensors for a model layer id."""
        if layer_id not in self._slot:
            raise KeyError(f"layer_id: {layer_id} is not a MoE layer of this predictor "
                           f"(moe_layers={self.meta.moe_layers})")
        return self._slot[layer_id]

    def predict_log_norm(self, layer_id: int, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """yhat[t, k] = <hidden[t], a_{ids[t,k]}> + b_{ids[t,k]} for routed pairs only.

        hidden [T, H] any float dtype; ids [T, K] int (-1 allowed: treated as expert 0, mask later).
        Returns [T, K] fp32.
        """
        j = self.slot(layer_id)
        a = self.weight[j]  # [E, H]
        b = self.bias[j]  # [E]
        safe = ids.long().clamp_min(0)  # [T, K]
        rows = a[safe]  # [T, K, H]
        return torch.einsum("th,tkh->tk", hidden.float(), rows) + b[safe]  # [T, K]

    def to(self, device: torch.device | str) -> Predictor:
        kw = {n: (getattr(self, n).to("cpu" if n in HOST_TENSORS else device)
                  if getattr(self, n) is not None else None)
              for n in ("weight", "bias", *OPTIONAL_TENSORS)}
        return Predictor(meta=self.meta, **kw)

    # ---- validation ------------------------------------------------------------------------
    def validate(self, model_config: Any) -> None:
        """Raise PredictorMismatch naming the first field that disagrees with a HF model config."""
        expected = describe_model_config(model_config)
        m = self.meta
        # architecture: the model_type ("qwen3_moe") or a class name ("Qwen3MoeForCausalLM")
        names = {getattr(model_config, "model_type", None), *(getattr(model_config, "architectures",
                                                                      None) or [])} - {None, ""}
        if names and m.architecture and not any(_same_family(m.architecture, n) for n in names):
            raise PredictorMismatch(f"predictor field 'architecture' = {m.architecture!r} but the "
                                    f"model is {sorted(names)}")
        for name in ("hidden_size", "num_experts", "top_k", "num_layers"):
            got, want = getattr(m, name), expected[name]
            if want is not None and got != want:
                raise PredictorMismatch(
                    f"predictor field {name!r} = {got} but the model has {want}")
        if expected["moe_layers"] is not None and list(m.moe_layers) != list(expected["moe_layers"]):
            raise PredictorMismatch(
                f"predictor field 'moe_layers' = {m.moe_layers} but the model's MoE layers are "
                f"{expected['moe_layers']}")

    # ---- file I/O --------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        tensors = {"weight": self.weight, "bias": self.bias}
        for name in OPTIONAL_TENSORS:
            if getattr(self, name) is not None:
                tensors[name] = getattr(self, name)
        tensors = {k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}
        save_file(tensors, str(path), metadata={METADATA_KEY: json.dumps(asdict(self.meta))})

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> Predictor:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"predictor: no such file {path}")
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw = (f.metadata() or {}).get(METADATA_KEY)
            if raw is None:
                raise PredictorMismatch(f"predictor: {path} has no '{METADATA_KEY}' metadata")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta_dict = json.loads(raw)
        version = meta_dict.get("format_version")
        if version != FORMAT_VERSION:
            raise PredictorMismatch(
                f"predictor field 'format_version' = {version} but this build reads {FORMAT_VERSION}")
        meta = PredictorMeta(**meta_dict)
        for name in ("weight", "bias"):
            if name not in tensors:
                raise PredictorMismatch(f"predictor: tensor {name!r} missing in {path}")
        pred = cls(meta=meta, **{k: v for k, v in tensors.items()
                                 if k in ("weight", "bias", *OPTIONAL_TENSORS)})
        return pred.to(device) if str(device) != "cpu" else pred


def _same_family(a: str, b: str) -> bool:
    """'qwen3_moe' ~ 'Qwen3MoeForCausalLM' ~ 'Qwen3MoeForCausalLM'; 'mixtral' !~ 'qwen3_moe'."""
    ca, cb = (re.sub(r"[^a-z0-9]", "", x.lower()) for x in (a, b))
    return ca.startswith(cb) or cb.startswith(ca)


def check_layer_budget(table: torch.Tensor | None, bounds: torch.Tensor | None, num_layers: int,
                       num_experts: int) -> tuple[int, ...]:
    """Validate a schedule (layer_budget [L, E+1] or [R, L, E+1], layer_budget_max_batch [R-1]);
    return the R-1 range bounds as host ints. Raises PredictorMismatch naming the field."""
    L, E = num_layers, num_experts
    if table is None:
        if bounds is not None:
            raise PredictorMismatch("predictor tensor 'layer_budget_max_batch' is given without "
                                    "'layer_budget'")
        return ()
    if table.dim() == 2:
        _check_shape("layer_budget", table, (L, E + 1))
        R = 1
    elif table.dim() == 3 and table.shape[0] >= 1:
        R = table.shape[0]
        _check_shape("layer_budget", table, (R, L, E + 1))
    else:
        raise PredictorMismatch(f"predictor tensor 'layer_budget' has shape {tuple(table.shape)}, "
                                f"expected ({L}, {E + 1}) or (R, {L}, {E + 1}) with R >= 1 ranges")
    if table.device.type != "meta":
        t = table.detach().double()
        if not (torch.isfinite(t).all() and (t == t.round()).all() and (t >= 0).all()
                and (t <= E).all()):
            raise PredictorMismatch(f"predictor tensor 'layer_budget' must hold integers in 0..{E}")
    if bounds is None:
        if R > 1:
            raise PredictorMismatch(f"predictor tensor 'layer_budget' holds {R} tables (batch-size "
                                    f"ranges) but 'layer_budget_max_batch' is missing")
        return ()
    if bounds.dim() != 1 or bounds.shape[0] != R - 1:
        raise PredictorMismatch(f"predictor tensor 'layer_budget_max_batch' has shape "
                                f"{tuple(bounds.shape)}, expected ({R - 1},): the upper bounds of "
                                f"all but the last of the {R} ranges of 'layer_budget'")
    vals = bounds.detach().cpu().double().tolist()
    if not all(math.isfinite(v) and v == int(v) and v >= 1 for v in vals):
        raise PredictorMismatch(f"predictor tensor 'layer_budget_max_batch' must hold integers >= 1, "
                                f"got {vals}")
    if any(b <= a for a, b in zip(vals, vals[1:])):
        raise PredictorMismatch(f"predictor tensor 'layer_budget_max_batch' must be strictly "
                                f"ascending, got {[int(v) for v in vals]}")
    return tuple(int(v) for v in vals)


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise PredictorMismatch(f"predictor tensor {name!r} has shape {tuple(t.shape)}, "
                                f"expected {tuple(shape)}")


def describe_model_config(cfg: Any) -> dict[str, Any]:
    """Pull (hidden_size, num_experts, top_k, num_layers, moe_layers) out of a HF MoE config.

    Covers Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral and DeepSeek-V2 attribute names. moe_layers is None
    when it cannot be derived from the config alone.
    """
    if isinstance(cfg, dict):
        from types import SimpleNamespace

        cfg = SimpleNamespace(**cfg)
    num_experts = _first(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    top_k = _first(cfg, "num_experts_per_tok", "moe_topk", "top_k")
    num_layers = _first(cfg, "num_hidden_layers")
    return {
        "hidden_size": _first(cfg, "hidden_size"),
        "num_experts": num_experts,
        "top_k": top_k,
        "num_layers": num_layers,
        "moe_layers": moe_layer_ids(cfg) if num_layers is not None else None,
    }


def moe_layer_ids(cfg: Any) -> list[int]:
    """Model layer ids that hold a routed-expert block, from the config alone."""
    n = int(cfg.num_hidden_layers)
    mlp_only = set(getattr(cfg, "mlp_only_layers", None) or [])
    step = getattr(cfg, "decoder_sparse_step", None) or 1
    first_dense = getattr(cfg, "first_k_dense_replace", None)  # DeepSeek-V2
    freq = getattr(cfg, "moe_layer_freq", None) or 1
    ids = []
    for i in range(n):
        if first_dense is not None:
            if i >= first_dense and i % freq == 0:
                ids.append(i)
        elif i not in mlp_only and (i + 1) % step == 0:
            ids.append(i)
    return ids


def _first(cfg: Any, *names: str):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return None
