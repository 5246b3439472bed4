"""Selection policy settings: one frozen dataclass that travels with every call."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("dense", "base", "oracle", "gate_sum", "frequency", "exfold", "oea", "sere", "lynx")
RENORM_MODES = ("native", "always", "never")
# policies whose kept-set size is the batch budget M (the others use their own knobs)
BUDGETED_POLICIES = ("base", "oracle", "exfold", "gate_sum", "frequency")
# policies that read calibration statistics (the predictor file)
STAT_POLICIES = {"base": "predictor", "sere": "sere_sim", "exfold": "exfold_coef",
                 "frequency": "expert_freq"}


@dataclass(frozen=True)
class SelectionConfig:
    """How one MoE layer turns the router's top-k into what it executes in a decode step.

    policy     : one of POLICIES.
    backfill   : fill freed slots with the token's next-preferred kept experts (BASE); False = drop only.
    renorm     : "native" follows the model (renormalise iff norm_topk_prob), "always" rescales the
                 final set to the token's original total weight, "never" keeps each expert's own weight.
    sere_s, sere_rho : SERE primary slots S and critical-expert threshold rho.
    oea_k0     : OEA baseline experts per token.
    lynx_alpha, lynx_beta, lynx_tau : Lynx bin width (inverse), number of bins, keep threshold.
    skip_layers: layer ids left dense (ablation).
    """

    policy: str = "base"
    backfill: bool = True
    renorm: str = "native"
    sere_s: int = 1
    sere_rho: float = 0.0
    oea_k0: int = 2
    lynx_alpha: float = 1.0
    lynx_beta: int = 5
    lynx_tau: float = 1.0
    skip_layers: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown policy {self.policy!r}; choose one of {POLICIES}")
        if self.renorm not in RENORM_MODES:
            raise ValueError(f"renorm: must be one of {RENORM_MODES}, got {self.renorm!r}")
        if self.sere_s < 1:
            raise ValueError(f"sere_s: must be >= 1, got {self.sere_s}")
        if not 0.0 <= self.sere_rho <= 1.0:
            raise ValueError(f"sere_rho: must be in [0, 1], got {self.sere_rho}")
        if self.oea_k0 < 1:
            raise ValueError(f"oea_k0: must be >= 1, got {self.oea_k0}")
        if self.lynx_alpha < 0 or self.lynx_beta < 0:
            raise ValueError("lynx_alpha and lynx_beta: must be >= 0")
        object.__setattr__(self, "skip_layers", tuple(int(x) for x in self.skip_layers))

    @property
    def uses_budget(self) -> bool:
        return self.policy in BUDGETED_POLICIES

    @property
    def needs_stats(self) -> str | None:
        """Name of the calibration statistic this policy reads, or None."""
        return STAT_POLICIES.get(self.policy)
