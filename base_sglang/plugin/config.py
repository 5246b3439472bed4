"""Plugin settings, read from BASE_* environment variables (SGLang's subprocesses inherit them).

    BASE_PREDICTOR       predictor file; BASE is on only when this is set (otherwise the hooks pass through)
    BASE_POLICY          selection policy in decode steps (default: core.DEFAULT_POLICY, base_plus;
                         "base" is the paper's BASE)
    BASE_DEFAULT_BUDGET  budget of requests that set none: an integer or "dense" (default: dense)
    BASE_KERNELS         "auto" (Triton kernels on CUDA when importable) or "off" (torch core)
    BASE_FOLD            "auto" (stack the predictor under each foldable router GEMM: plugin/fold.py)
                         or "off" (SGLang's own router and top-k, then the selection)
    BASE_MOE             "auto" (default: in BASE decode steps a plain fused_experts call of at most
                         BASE_MOE_MAX_ROWS rows on a GPU with tuned tiles for its shape runs our
                         fused_moe: plugin/moe.py) or "sglang" (SGLang's Triton MoE always)
    BASE_MOE_MAX_ROWS    rows up to which BASE_MOE=auto runs our fused_moe (default 64; 1..4096)
    BASE_STATS_INTERVAL  log mean experts executed per MoE layer every N decode steps (0: never)
    BASE_ROUTE, BASE_SELECT_KERNEL  benchmark overrides of the kernels' dispatch (kernels/
                         select_experts.py), read at call time; checked here so that a bad value
                         stops startup naming the variable
The names match base-serve's settings, so `base-serve --backend sglang` hands them down unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from base_sglang.core import DEFAULT_POLICY, SelectionConfig

from ..core.budget import DENSE_LABEL, parse_budget
from .moe import OURS_MAX_TOKENS


@dataclass(frozen=True)
class PluginConfig:
    predictor: str | None = None
    policy: str = DEFAULT_POLICY
    default_budget: int | str = DENSE_LABEL  # resolved against E when the predictor loads
    kernels: bool = True
    fold: bool = True
    moe: str = "auto"  # "auto" | "sglang"
    moe_max_rows: int = OURS_MAX_TOKENS  # BASE_MOE=auto: our fused_moe up to this many rows
    stats_interval: int = 200

    def __post_init__(self):
        SelectionConfig(policy=self.policy)  # raises "policy: ..." for an unknown policy
        if self.moe not in ("auto", "sglang"):
            raise ValueError(f"BASE_MOE: must be auto or sglang, got {self.moe!r}")
        if not 1 <= self.moe_max_rows <= 4096:
            raise ValueError(f"BASE_MOE_MAX_ROWS: must be an integer in [1, 4096], got "
                             f"{self.moe_max_rows}")
        if self.stats_interval < 0:
            raise ValueError(f"BASE_STATS_INTERVAL: must be >= 0, got {self.stats_interval}")

    @property
    def enabled(self) -> bool:
        return bool(self.predictor)

    @classmethod
    def from_env(cls, env=None) -> PluginConfig:
        env = os.environ if env is None else env
        kernels = env.get("BASE_KERNELS", "auto").strip().lower()
        if kernels not in ("auto", "off", "on", "0", "1"):
            raise ValueError(f"BASE_KERNELS: must be auto or off, got {kernels!r}")
        fold = env.get("BASE_FOLD", "auto").strip().lower()
        if fold not in ("auto", "off", "on", "0", "1"):
            raise ValueError(f"BASE_FOLD: must be auto or off, got {fold!r}")
        from base_sglang.kernels import ROUTE_MODES, SELECT_KERNELS  # (no Triton import)

        for name, allowed in (("BASE_ROUTE", ROUTE_MODES), ("BASE_SELECT_KERNEL", SELECT_KERNELS)):
            value = env.get(name, "")
            if value and value not in allowed:
                raise ValueError(f"{name}: must be one of {', '.join(allowed)} (or unset), got {value!r}")
        interval = env.get("BASE_STATS_INTERVAL", "200").strip()
        if not interval.isdigit():
            raise ValueError(f"BASE_STATS_INTERVAL: must be an integer >= 0, got {interval!r}")
        rows = env.get("BASE_MOE_MAX_ROWS", "").strip() or str(OURS_MAX_TOKENS)
        if not rows.isdigit():
            raise ValueError(f"BASE_MOE_MAX_ROWS: must be an integer in [1, 4096], got {rows!r}")
        return cls(predictor=env.get("BASE_PREDICTOR") or None,
                   policy=env.get("BASE_POLICY", "").strip() or DEFAULT_POLICY,
                   default_budget=parse_budget(env.get("BASE_DEFAULT_BUDGET", "dense"),
                                               "BASE_DEFAULT_BUDGET"),
                   kernels=kernels not in ("off", "0"), fold=fold not in ("off", "0"),
                   moe=env.get("BASE_MOE", "auto").strip().lower() or "auto",
                   moe_max_rows=int(rows),
                   stats_interval=int(interval))
