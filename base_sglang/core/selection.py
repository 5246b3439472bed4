"""Batch-aware expert selection for one MoE layer in one decode step (pure torch: CPU path and oracle).

Shape legend
  T  tokens in the decode batch (one row per running request; padded rows allowed)
  E  routed experts of the layer
  K  top-k slots per token
  H  hidden size (MoE-layer input)
  P  = K + E preference slots: the model's own top-k first, then every other expert by router logit

Budget semantics (per token, int [T]):
  -1      padded row: contributes nothing to any score and is fully dropped (ids -1, weights 0);
  1..E-1  experts per MoE layer per decode step;
  >= E    dense.
The batch budget M is the LARGEST budget among real rows (dense if any real row is dense). The kept set S
is the top-M experts of the union by the policy's batch score, and EVERY token uses its routed experts that
are in S and is backfilled from its own preference order inside S. Loaded experts cost no extra HBM
traffic, so a small-budget request batched with a larger one gets the better quality for free, and the
number of distinct experts executed never exceeds M.

Policies base and base_plus choose the same kept set (top-M of D_u = sum_t w^2 exp(2 yhat)) and the same
backfilled ids; they differ in the combine weights of changed tokens: base follows the model (renormalise
iff norm_topk_prob), base_plus renormalises partially, w' = w_never * (W / sum w_never) ** alpha
(alpha = 0.5, W = the token's routed weight; see _combine_weights). With max_error, rows carrying a
bound ask for the smallest budget meeting it (error_budget.py) before the batch budget is taken.

The issue-13 variants (config.VARIANTS, variants.py) keep base_plus's backfill and combine rule and change
the kept set: base_net (backfill-aware net loss) and base_sched (a calibrated per-layer budget);
oracle_net / oracle_sched are the same rules on true norms.
They run here only (the Triton kernels hand them to this core).
base_fold (fold.py) keeps base_plus's kept set and folds each dropped routed slot into the kept expert
with the smallest calibrated ExFold residual instead of backfilling it (core only as well).

Everything is fixed-shape and free of host synchronisation for dense/base_plus/base/oracle/oea/gate_sum/
frequency/lynx/exfold (no .item(), nonzero, unique): the call can be captured in a CUDA graph. Batch scores are
reduced with a one-hot sum (no float atomics), so repeated calls and every tensor-parallel rank agree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .config import ERROR_POLICIES, VARIANTS, SelectionConfig
from .error_budget import error_budgets, score_rank
from .fold import fold_slots
from .predictor import Predictor
from .variants import net_kept, scheduled_budget


class SelectionStats(NamedTuple):
    num_union: torch.Tensor  # [] int64  distinct experts routed by real rows, before selection
    num_kept: torch.Tensor  # [] int64  distinct experts executed after selection
    removed_cost: torch.Tensor  # [] fp32 predicted removal cost of the union experts not kept


class Selection(NamedTuple):
    ids: torch.Tensor  # [T, K] same dtype as topk_ids, -1 = dropped slot
    weights: torch.Tensor  # [T, K] same dtype as topk_weights, 0 for dropped slots
    stats: SelectionStats


def select_experts(
    router_logits: torch.Tensor,  # [T, E]
    topk_ids: torch.Tensor,  # [T, K] int32/int64, as the model computed them
    topk_weights: torch.Tensor,  # [T, K] as the model computed them (after its own renorm/scaling)
    hidden_states: torch.Tensor | None,  # [T, H] MoE-layer input (router input)
    budget: torch.Tensor,  # [T] int, see the module docstring
    layer_id: int,
    config: SelectionConfig,
    predictor: Predictor | None = None,
    *,
    norm_topk_prob: bool = True,
    routed_norms: torch.Tensor | None = None,  # [T, K] true ||E_u(z_t)|| (oracle policies only)
    max_error: torch.Tensor | None = None,  # [T] float error bound per row, NaN = none (error_budget.py)
    expert_norms: torch.Tensor | None = None,  # [T, E] true ||E_e(z_t)|| of every expert (oracle_net)
    log_norms: torch.Tensor | None = None,  # [T, K] predicted log-norms computed elsewhere (core.routing)
) -> Selection:
    """Turn the router's top-k into what one MoE layer executes in one decode step.

    With max_error, a row with a (non-NaN) bound asks for the smallest budget whose predicted relative
    error stays within it, capped by its integer budget (base_plus, base and oracle only).
    The oracle_* variants take routed_norms, or expert_norms (from which routed_norms is gathered).
    log_norms replaces the predictor's own dot products (a folded router GEMM computed them).
    """
    T, E = router_logits.shape
    K = topk_ids.shape[1]
    dev = router_logits.device
    raw = topk_ids.long()  # [T, K]; -1 may mark padding (e.g. SGLang DP padding rows)
    ids = raw.clamp_min(0)  # [T, K] safe for gathers; every use is masked by `valid`
    if routed_norms is None and expert_norms is not None:
        routed_norms = expert_norms.float().gather(1, ids)  # [T, K]
    w = torch.where(raw >= 0, topk_weights.float(), torch.zeros_like(topk_weights.float()))  # [T, K]
    budget = budget.to(dev).long()  # [T]
    real = budget >= 0  # [T]
    valid = real[:, None] & (raw >= 0)  # [T, K] routed slots of real rows

    routed_row = _membership(ids, raw >= 0, E)  # [T, E] per row
    count = (routed_row & real[:, None]).sum(0)  # [E] real tokens routing to u
    in_union = count > 0  # [E]
    num_union = in_union.sum()  # []

    pred_d = None  # [E] predicted batch removal score D_u = sum_t w^2 exp(2 yhat)
    pred_c = None  # [T, K] predicted removal cost w^2 exp(2 yhat)
    variant = VARIANTS.get(config.policy)  # (costs, objective, scheduled) or None
    pred_policy = (config.policy in ("base", "base_plus", "base_fold")
                   or (variant is not None and variant[0] == "pred"))
    if pred_policy and predictor is not None and layer_id not in config.skip_layers:
        predictor.slot(layer_id)  # raises, naming the layer, when the file does not cover it
    if log_norms is not None or (predictor is not None and hidden_states is not None
                                 and layer_id in predictor._slot):
        yhat = (log_norms.float() if log_norms is not None
                else predictor.predict_log_norm(layer_id, hidden_states, ids))  # [T, K]
        pred_c = w.square() * torch.exp(2.0 * yhat)  # [T, K]
        pred_d = _batch_score(ids, pred_c, valid, E)  # [E]

    if max_error is not None and layer_id not in config.skip_layers and config.policy != "dense":
        cost, score = _error_cost(config.policy, pred_c, pred_d, w, ids, valid, E, routed_norms)
        budget = error_budgets(cost, ids, valid, score_rank(score, in_union), max_error.to(dev),
                               budget)  # [T] bounded rows ask for the M that meets their bound
    any_dense = (real & (budget >= E)).any()  # []
    batch_m = torch.where(real, budget, torch.zeros_like(budget)).amax() if T else budget.new_zeros(())
    m = torch.where(any_dense, torch.full_like(batch_m, E), batch_m)  # [] batch budget M
    if variant is not None and variant[2] and layer_id not in config.skip_layers:
        # [E+1] this layer's row of the table for the step's batch-size range (T rows: under CUDA
        # graphs the captured batch size, padding rows included; predictor.py)
        table = _need(predictor, config.policy).layer_schedule(layer_id, T)
        m = scheduled_budget(m, table, E)  # [] this layer's share of the schedule

    policy = config.policy
    if policy == "dense" or layer_id in config.skip_layers:
        new_ids, new_w = raw, w
        d = pred_d
    elif policy in ("sere", "exfold"):
        new_ids, new_w = (_sere if policy == "sere" else _exfold)(
            ids, w, valid, in_union, m, layer_id, config, _need(predictor, policy))
        new_ids = torch.where(raw >= 0, new_ids, raw)  # a -1 slot stays dropped
        d = pred_d
    else:
        if variant is not None:
            d, in_s = _variant_kept_set(variant, ids, w, valid, in_union, m, router_logits, real,
                                        routed_row, layer_id, config, predictor, pred_c, pred_d,
                                        hidden_states, routed_norms, expert_norms)
        else:
            d, in_s = _kept_set(policy, ids, w, valid, in_union, m, router_logits, real, layer_id,
                                config, predictor, pred_d, routed_norms)
        if policy == "base_fold":  # its own fallback and combine rule (fold.py)
            new_ids, new_w = _fold(ids, w, valid, in_s, router_logits, layer_id, config, predictor,
                                   norm_topk_prob)
        else:
            if config.backfill:
                new_ids = _backfill(router_logits, ids, raw >= 0, routed_row, in_s, K)  # [T, K]
            else:
                new_ids = torch.where(in_s[ids] & valid, ids, torch.full_like(ids, -1))  # [T, K]
            new_w = _combine_weights(router_logits, raw, w, routed_row, new_ids,
                                     config.combine_mode(norm_topk_prob), config.renorm_alpha)

    new_ids = torch.where(real[:, None], new_ids, torch.full_like(new_ids, -1))  # padded rows dropped
    new_w = torch.where(new_ids >= 0, new_w, torch.zeros_like(new_w))  # [T, K]

    kept = _membership(new_ids, new_ids >= 0, E).any(0)  # [E]
    removed = torch.zeros((), device=dev)
    if d is not None:
        removed = (d * (in_union & ~kept)).sum()  # []
    stats = SelectionStats(num_union, kept.sum(), removed)
    return Selection(new_ids.to(topk_ids.dtype), new_w.to(topk_weights.dtype), stats)


# ---- kept set S for the backfill-style policies ------------------------------------------------
def _kept_set(policy, ids, w, valid, in_union, m, logits, real, layer_id, config, predictor,
              pred_d, routed_norms):
    """Return (batch removal score D [E] reported in the stats, or None; kept mask in_s [E])."""
    E = logits.shape[1]
    cost = pred_d  # other policies report the predicted removal score when a predictor is given
    if policy in ("base", "base_plus", "base_fold"):
        if pred_d is None:
            _need(predictor, policy)
            raise ValueError("base: hidden_states are required to predict removal costs")
        return pred_d, top_m_mask(pred_d, m, in_union)
    if policy == "oracle":
        if routed_norms is None:
            raise ValueError("oracle: routed_norms (true expert output norms [T, K]) are required")
        d = _batch_score(ids, w.square() * routed_norms.float().square(), valid, E)  # [E] true D_u
        return d, top_m_mask(d, m, in_union)
    if policy == "gate_sum":
        return cost, top_m_mask(_batch_score(ids, w, valid, E), m, in_union)
    if policy == "frequency":
        freq = _need(predictor, policy).expert_freq[predictor.slot(layer_id)].to(w.device)  # [E]
        return cost, top_m_mask(freq.float(), m, in_union)
    if policy == "oea":
        top = slot_rank(w) < config.oea_k0  # [T, K] the token's k0 heaviest slots
        base = _membership(ids, valid & top, E).any(0)  # [E] union of every token's top-k0
        return cost, base
    if policy == "lynx":
        r = logits.float()  # [T, E]
        lr = r.gather(1, ids) - r.amax(1, keepdim=True)  # [T, K] log(p_e / p_top1) <= 0
        bins = torch.floor(config.lynx_alpha * lr).clamp(-float(config.lynx_beta), 0.0)  # [T, K]
        b = real.sum().clamp_min(1).float()  # [] batch size B
        score = _batch_score(ids, torch.pow(b, bins), valid, E)  # [E] sum_t B^bin
        return cost, (score >= config.lynx_tau) & in_union
    raise ValueError(f"policy: {policy!r} has no kept-set rule")


def _variant_kept_set(variant, ids, w, valid, in_union, m, logits, real, routed_row, layer_id,
                      config, predictor, pred_c, pred_d, hidden, routed_norms, expert_norms):
    """(batch removal score D [E] for the stats, kept mask in_s [E]) of a VARIANTS policy."""
    E = logits.shape[1]
    costs, objective, _ = variant
    policy = config.policy
    if costs == "pred":
        if pred_c is None:
            _need(predictor, policy)
            raise ValueError(f"{policy}: hidden_states are required to predict removal costs")
        c, d = pred_c, pred_d
    else:
        if routed_norms is None:
            raise ValueError(f"{policy}: routed_norms or expert_norms (true expert output norms) "
                             f"are required")
        c = w.square() * routed_norms.float().square()  # [T, K] true removal cost
        d = _batch_score(ids, c, valid, E)  # [E] true D_u
    if objective == "top":
        return d, top_m_mask(d, m, in_union)
    if costs == "pred":
        def norm2(b):  # [T] predicted ||E_b(z_t)||^2
            return torch.exp(2.0 * predictor.predict_log_norm(layer_id, hidden, b[:, None])[:, 0])
    else:
        if expert_norms is None:
            raise ValueError(f"{policy}: expert_norms (true output norms of every expert, [T, E]) "
                             f"are required")

        def norm2(b):  # [T] true ||E_b(z_t)||^2
            return expert_norms.float().gather(1, b[:, None])[:, 0].square()
    _, in_s = net_kept(d, c, m, ids, w, valid, real, in_union, logits, routed_row, norm2,
                       config.net_lambda, config.net_iters, top_m_mask)
    return d, in_s


def _error_cost(policy, pred_c, pred_d, w, ids, valid, E, routed_norms):
    """(removal cost [T, K], batch score [E]) that an error bound is measured in, per policy."""
    if policy == "oracle":
        if routed_norms is None:
            raise ValueError("oracle: routed_norms (true expert output norms [T, K]) are required")
        cost = w.square() * routed_norms.float().square()  # [T, K]
        return cost, _batch_score(ids, cost, valid, E)
    if policy not in ERROR_POLICIES:
        raise ValueError(f"max_error: error-targeted budgets need a removal-cost policy "
                         f"({', '.join(ERROR_POLICIES)}), not {policy!r}")
    if pred_c is None:
        raise ValueError(f"max_error: policy {policy!r} needs a predictor and hidden_states to "
                         f"predict the error")
    return pred_c, pred_d


def top_m_mask(score: torch.Tensor, m, in_union: torch.Tensor) -> torch.Tensor:
    """Mask of the top-m union experts by score (stable: ties go to the lower id).

    score, in_union [..., E]; m an int or a tensor broadcastable to score[..., 0] (a 0-d tensor
    keeps it on the device: no host sync).
    """
    E = score.shape[-1]
    masked = torch.where(in_union, score.float(), torch.full_like(score.float(), -float("inf")))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices  # [..., E]
    ar = torch.arange(E, device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ar)  # [..., E]
    m = torch.as_tensor(m, device=score.device)
    return (rank < m.unsqueeze(-1) if m.dim() else rank < m) & in_union  # [..., E]


# ---- backfill and weights ----------------------------------------------------------------------
def preference_order(logits: torch.Tensor, ids: torch.Tensor, ok: torch.Tensor,
                     routed_row: torch.Tensor):
    """Each token's preference order: its own top-k as the model gave them, then the rest by logit.

    ids [T, K] (non-negative), ok [T, K] real slots. Returns pref [T, P] expert ids and fresh [T, P]
    (False for a -1 slot, and where a rest-slot repeats a top-k expert).
    """
    rest = torch.sort(logits.float(), dim=1, descending=True, stable=True).indices  # [T, E]
    pref = torch.cat([ids, rest], 1)  # [T, P]
    fresh = torch.cat([ok, ~routed_row.gather(1, rest)], 1)  # [T, P]
    return pref, fresh


def _backfill(logits, ids, ok, routed_row, in_s, K):
    """First K experts of each token's preference order that lie in the kept set. [T, K], -1 pad."""
    T = ids.shape[0]
    pref, fresh = preference_order(logits, ids, ok, routed_row)  # [T, P]
    cand = in_s[pref] & fresh  # [T, P]
    pos = torch.cumsum(cand.int(), 1) - 1  # [T, P] output slot of each candidate
    take = cand & (pos < K)  # [T, P]
    col = torch.where(take, pos, torch.full_like(pos, K)).long()  # [T, P]; K = discard column
    out = torch.full((T, K + 1), -1, dtype=ids.dtype, device=ids.device)  # [T, K+1]
    out.scatter_(1, col, torch.where(take, pref, torch.full_like(pref, -1)))
    return out[:, :K]  # [T, K]


def _combine_weights(logits, ids, w, routed_row, new_ids, mode, alpha=0.5):
    """Combine weights for the final set: mode "always", "never" or "partial" (see SelectionConfig)."""
    p = torch.softmax(logits.float(), dim=-1)  # [T, E]
    ok = new_ids >= 0  # [T, K]
    safe = new_ids.clamp_min(0)  # [T, K]
    p_new = p.gather(1, safe) * ok  # [T, K]
    total_w = w.sum(1, keepdim=True)  # [T, 1] weight the model gave the token
    total_p = (p.gather(1, ids.clamp_min(0)) * (ids >= 0)).sum(1, keepdim=True)  # [T, 1] routed set
    if mode == "always":
        new_w = p_new / p_new.sum(1, keepdim=True).clamp_min(1e-30) * total_w  # [T, K]
    else:
        col = torch.where(ids >= 0, ids, torch.full_like(ids, p.shape[1]))  # [T, K]; -1 -> E
        w_full = p.new_zeros(p.shape[0], p.shape[1] + 1).scatter_(1, col, w)  # [T, E+1] own weights
        own = routed_row.gather(1, safe) & ok  # [T, K] expert was in the token's top-k
        scaled = p_new * (total_w / total_p.clamp_min(1e-30))  # backfilled: same scaling as routed
        new_w = torch.where(own, w_full.gather(1, safe), scaled)  # [T, K] "never"
        if mode == "partial":
            total_new = new_w.sum(1, keepdim=True).clamp_min(1e-30)  # [T, 1]
            new_w = new_w * (total_w / total_new).clamp_min(0.0).pow(alpha)  # [T, K]
    unchanged = (new_ids == ids).all(1, keepdim=True)  # [T, 1] exact identity when nothing moved
    return torch.where(unchanged, w, new_w)


def _fold(ids, w, valid, in_s, logits, layer_id, config, predictor, norm_topk_prob):
    """base_fold: the slots outside S folded into kept experts (fold.py). ids, weights [T, K]."""
    j = predictor.slot(layer_id)
    if predictor.exfold_coef is None or predictor.exfold_loss is None:
        raise ValueError("base_fold: the predictor file lacks exfold_coef / exfold_loss statistics")
    loss = predictor.exfold_loss[j].to(w.device).float()  # [E, E]
    coef = predictor.exfold_coef[j].to(w.device).float()  # [E, E]
    return fold_slots(ids, w, valid, in_s, loss, coef, logits, max_loss=config.fold_max_loss,
                      fallback=config.fold_fallback, mode=config.combine_mode(norm_topk_prob),
                      alpha=config.renorm_alpha)


# ---- re-routing baselines ----------------------------------------------------------------------
def _sere(ids, w, valid, in_union, m, layer_id, config, predictor):
    """SERE: secondary slots outside the primary set go to the most similar primary expert."""
    E = in_union.shape[0]
    rank = slot_rank(w)  # [T, K] 0 = the token's heaviest slot
    primary = _membership(ids, valid & (rank < config.sere_s), E).any(0)  # [E]
    sim = predictor.sere_sim[predictor.slot(layer_id)].to(w.device).float()  # [E, E]
    to_p = torch.where(primary[None, None, :], sim[ids], torch.full_like(sim[ids], -float("inf")))
    best_sim, best = to_p.max(-1)  # [T, K]
    secondary = rank >= config.sere_s  # [T, K]
    critical = (config.sere_rho > 0) & (best_sim < config.sere_rho)  # [T, K]
    reroute = secondary & ~primary[ids] & ~critical & valid  # [T, K]
    return torch.where(reroute, best, ids), w


def _exfold(ids, w, valid, in_union, m, layer_id, config, predictor):
    """ExFold (decode): keep the top-D experts by sum w*h; fold every other slot into its best sink."""
    E = in_union.shape[0]
    j = predictor.slot(layer_id)
    if predictor.expert_norm is None or predictor.exfold_loss is None:
        raise ValueError("exfold: the predictor file lacks expert_norm / exfold_loss statistics")
    h = predictor.expert_norm[j].to(w.device).float()  # [E]
    imp = _batch_score(ids, w * h[ids], valid, E)  # [E]
    sub = top_m_mask(imp, m, in_union)  # [E]
    loss = predictor.exfold_loss[j].to(w.device).float()  # [E, E]
    coef = predictor.exfold_coef[j].to(w.device).float()  # [E, E]
    to_sub = torch.where(sub[None, None, :], loss[ids], torch.full_like(loss[ids], float("inf")))
    sink = to_sub.argmin(-1)  # [T, K]
    fold = ~sub[ids] & valid  # [T, K]
    new_ids = torch.where(fold, sink, ids)
    new_w = torch.where(fold, w * coef[ids, sink], w)
    return new_ids, new_w


# ---- small helpers -----------------------------------------------------------------------------
def slot_rank(w: torch.Tensor) -> torch.Tensor:
    """[T, K] rank of each slot by weight within its row (0 = heaviest; ties keep slot order).

    Routers need not return their top-k sorted (DeepSeek-V2 uses topk(sorted=False)), so the
    "first k0 / S slots" of OEA and SERE are taken by weight, not by position.
    """
    order = torch.sort(w, dim=1, descending=True, stable=True).indices  # [T, K]
    ar = torch.arange(w.shape[1], device=w.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, ar)  # [T, K]


def _membership(ids: torch.Tensor, mask: torch.Tensor, E: int) -> torch.Tensor:
    """[T, E] bool: expert e appears in row t among the masked slots. ids [T, K] (-1 allowed)."""
    T = ids.shape[0]
    col = torch.where(mask & (ids >= 0), ids.long(), torch.full_like(ids.long(), E))  # [T, K]
    out = torch.zeros((T, E + 1), dtype=torch.bool, device=ids.device)
    return out.scatter_(1, col, True)[:, :E]


def _batch_score(ids: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, E: int):
    """D[e] = sum over real (t, k) with ids[t,k] == e of values[t,k]. Deterministic one-hot sum.

    A NaN value (a row whose hidden state went bad) counts as 0, so it cannot poison every
    expert's score through the one-hot product (0 * NaN = NaN) and the other rows' selection.
    """
    onehot = (ids.unsqueeze(-1) == torch.arange(E, device=ids.device)) & valid.unsqueeze(-1)
    clean = torch.nan_to_num(values.float(), nan=0.0)  # [T, K]
    return (onehot * clean.unsqueeze(-1)).sum((0, 1))  # [E]


def _need(predictor: Predictor | None, policy: str) -> Predictor:
    stat = SelectionConfig(policy=policy).needs_stats
    if predictor is None:
        raise ValueError(f"{policy}: this policy needs a predictor file with calibration statistics")
    if stat not in ("predictor", None) and getattr(predictor, stat) is None:
        raise ValueError(f"{policy}: the predictor file has no {stat!r} statistics")
    return predictor
