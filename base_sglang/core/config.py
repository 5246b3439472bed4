"""Selection policy settings: one frozen dataclass that travels with every call."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("dense", "base_plus", "base", "oracle", "gate_sum", "frequency", "exfold", "oea", "sere",
            "lynx", "base_net", "oracle_net", "base_sched", "oracle_sched", "base_fold")
# the project's default: BASE's kept set with partial renormalisation (see SelectionConfig.renorm)
DEFAULT_POLICY = "base_plus"
RENORM_MODES = ("native", "always", "never", "partial")
# policies whose kept-set size is the batch budget M (the others use their own knobs)
BUDGETED_POLICIES = ("base_plus", "base", "oracle", "exfold", "gate_sum", "frequency", "base_net",
                     "oracle_net", "base_sched", "oracle_sched")
# issue-13 variants of base_plus (core only, not in the Triton kernels): kept-set objective and
# per-layer budget schedule, each with its true-norm oracle. name -> (costs, objective, scheduled)
#   costs: "pred" (the predictor) or "true" (routed_norms / expert_norms);
#   objective: "net" (backfill-aware net loss) or "top" (BASE's top-M)
# (a per-token top-1 floor was measured on the tune split and lost: BENCHMARKS.md, code removed)
VARIANTS = {"base_net": ("pred", "net", False), "oracle_net": ("true", "net", False),
            "base_sched": ("pred", "top", True), "oracle_sched": ("true", "top", True)}
# the true-norm oracle of each predicted-cost policy (the "within 10 % of its oracle" check)
ORACLE_OF = {"base_plus": "oracle_plus", "base_net": "oracle_net", "base_sched": "oracle_sched"}
# policies whose removal costs are the true expert-output norms (the caller passes routed_norms)
TRUE_NORM_POLICIES = ("oracle", "oracle_net", "oracle_sched")
# policies with a removal cost that an error-targeted budget (max_error) can bound
ERROR_POLICIES = ("base_plus", "base", "oracle")
# policies that read calibration statistics (the predictor file)
STAT_POLICIES = {"base_plus": "predictor", "base": "predictor", "sere": "sere_sim",
                 "exfold": "exfold_coef", "frequency": "expert_freq", "base_net": "predictor",
                 "base_sched": "layer_budget",
                 "oracle_sched": "layer_budget", "base_fold": "exfold_coef"}
# base_fold (core/fold.py, issue 13): base_plus's kept set, dropped slots folded into kept experts by
# ExFold's calibrated pair statistics (it reads the predictor and exfold_coef / exfold_loss)
FOLD_FALLBACKS = ("drop", "backfill")
# policies whose "native" combine rule is partial renormalisation instead of the model's convention
# (base_fold: of its unfolded slots, core/fold.py; chosen over ExFold's "never" on --split tune)
PARTIAL_NATIVE = ("base_plus", *VARIANTS, "base_fold")


@dataclass(frozen=True)
class SelectionConfig:
    """How one MoE layer turns the router's top-k into what it executes in a decode step.

    policy     : one of POLICIES. "base" is the paper's BASE; "base_plus" (DEFAULT_POLICY) keeps BASE's
                 kept set and backfill and combines with partial renormalisation.
    backfill   : fill freed slots with the token's next-preferred kept experts (BASE); False = drop only.
    renorm     : "native" follows the policy's own rule: the model's convention (renormalise iff
                 norm_topk_prob) for every policy but base_plus, whose rule is "partial".
                 "always" rescales the final set to the token's original total weight W, "never" keeps
                 each expert's own weight (backfilled experts get p scaled like the routed ones), and
                 "partial" multiplies the "never" weights of a token by (W / their sum) ** renorm_alpha,
                 between never (alpha 0) and always (alpha 1).
                 The VARIANTS (base_net, base_sched and their oracle_* twins) are base_plus
                 with another kept-set rule (selection.py); their native rule is "partial" too.
    renorm_alpha: exponent of "partial" renormalisation, in [0, 1].
    net_lambda : base_net / oracle_net: share of the backfill expert's contribution subtracted from
                 a removal cost, in [0, 1] (0 = base_plus's kept set).
    net_iters  : base_net / oracle_net: re-selections on the net loss (a constant: fixed shapes), >= 1.
    fold_max_loss: base_fold: a dropped slot folds only when its best kept expert's ExFold residual
                 loss is below this, in (0, 1] (1 = whenever the fold recovers anything).
    fold_fallback: base_fold: what happens to a dropped slot that does not fold: "drop" or
                 "backfill" (the token's next-preferred kept expert, as base_plus). base_fold ignores
                 `backfill`; its native combine rule is "partial" (its unfolded slots renormalised
                 partially; "never" = ExFold's rule; core/fold.py).
    sere_s, sere_rho : SERE primary slots S and critical-expert threshold rho.
    oea_k0     : OEA baseline experts per token.
    lynx_alpha, lynx_beta, lynx_tau : Lynx bin width (inverse), number of bins, keep threshold.
    skip_layers: layer ids left dense (ablation).
    """

    policy: str = "base"  # the paper's BASE; engine, server and plugin default to DEFAULT_POLICY
    backfill: bool = True
    renorm: str = "native"
    renorm_alpha: float = 0.5
    net_lambda: float = 1.0
    net_iters: int = 2
    fold_max_loss: float = 1.0
    fold_fallback: str = "drop"
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
        if not 0.0 <= self.renorm_alpha <= 1.0:
            raise ValueError(f"renorm_alpha: must be in [0, 1], got {self.renorm_alpha}")
        if not 0.0 <= self.net_lambda <= 1.0:
            raise ValueError(f"net_lambda: must be in [0, 1], got {self.net_lambda}")
        if isinstance(self.net_iters, bool) or not isinstance(self.net_iters, int) or self.net_iters < 1:
            raise ValueError(f"net_iters: must be an integer >= 1, got {self.net_iters!r}")
        if not 0.0 < self.fold_max_loss <= 1.0:
            raise ValueError(f"fold_max_loss: must be in (0, 1], got {self.fold_max_loss}")
        if self.fold_fallback not in FOLD_FALLBACKS:
            raise ValueError(f"fold_fallback: must be one of {FOLD_FALLBACKS}, got "
                             f"{self.fold_fallback!r}")
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

    def combine_mode(self, norm_topk_prob: bool) -> str:
        """The combine rule after selection: "always", "never" or "partial"."""
        if self.renorm != "native":
            return self.renorm
        if self.policy in PARTIAL_NATIVE:
            return "partial"
        return "always" if norm_topk_prob else "never"

    @property
    def needs_stats(self) -> str | None:
        """Name of the calibration statistic this policy reads, or None."""
        return STAT_POLICIES.get(self.policy)
