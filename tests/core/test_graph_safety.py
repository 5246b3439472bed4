"""No host synchronisation or data-dependent shapes: every policy that must be CUDA-graph safe runs
on the meta device, where any .item(), nonzero or unique raises."""

import pytest
import torch
from core_helpers import make_predictor

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 8, 12, 4, 16


@pytest.mark.parametrize("policy", ["dense", "base_plus", "base", "oracle", "oea", "gate_sum",
                                    "frequency", "lynx", "exfold"])
@pytest.mark.parametrize("backfill", [True, False])
@pytest.mark.parametrize("renorm, alpha, norm", [("native", 0.5, True), ("partial", 0.0, False),
                                                 ("partial", 0.5, False), ("partial", 1.0, True)])
def test_policy_runs_on_meta_tensors(policy, backfill, renorm, alpha, norm):
    meta = torch.device("meta")
    pred = make_predictor(E, H, K).to(meta)
    sel = select_experts(
        torch.empty(T, E, device=meta), torch.empty(T, K, dtype=torch.int32, device=meta),
        torch.empty(T, K, device=meta), torch.empty(T, H, device=meta),
        torch.empty(T, dtype=torch.int64, device=meta), 0,
        SelectionConfig(policy=policy, backfill=backfill, renorm=renorm, renorm_alpha=alpha), pred,
        norm_topk_prob=norm, routed_norms=torch.empty(T, K, device=meta))
    assert sel.ids.shape == (T, K) and sel.ids.dtype == torch.int32
    assert sel.weights.shape == (T, K)
    assert sel.stats.num_kept.shape == ()
