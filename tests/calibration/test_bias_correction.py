"""base-calibrate --bias-correction lognormal: each expert's bias gains its training residual
variance, so exp(2 yhat) estimates E[||E_u||^2] (hand-checked on synthetic sufficient statistics)."""

import pytest
import torch

from base_sglang.calibration.collect import LayerStats
from base_sglang.calibration.config import CalibrationConfig
from base_sglang.calibration.fit import fit_ridge


def _stats(E=3, H=4, n=400, noise=(0.1, 0.5, 1.0), seed=0):
    g = torch.Generator().manual_seed(seed)
    st = LayerStats(E, H, sere_tokens=0)
    for e in range(E - 1):  # the last expert is never routed
        z = torch.randn(n, H, generator=g, dtype=torch.float64)
        y = z @ torch.randn(H, generator=g, dtype=torch.float64) + 0.3 * e
        y = y + noise[e] * torch.randn(n, generator=g, dtype=torch.float64)
        za = torch.cat([z, torch.ones(n, 1, dtype=torch.float64)], 1)  # [n, H+1]
        st.zz[e] = za.T @ za
        st.zy[e] = za.T @ y
        st.yy[e] = y @ y
        st.n[e] = n
    return st, noise


def test_lognormal_adds_each_experts_residual_variance():
    st, noise = _stats()
    w0, b0, _ = fit_ridge(st, 0.0)
    w1, b1, stats = fit_ridge(st, 0.0, "lognormal")
    assert torch.equal(w0, w1)  # the slopes are untouched
    shift = (b1 - b0).double()
    for e in range(2):  # least squares: sse/n -> noise^2 (n = 400, 5 parameters)
        assert shift[e].item() == pytest.approx(noise[e] ** 2, rel=0.2)
    assert shift[1] > shift[0] * 10  # the noisier expert gains more: the ranking can change
    assert shift[2].item() == 0.0  # never routed: no residuals, no shift
    assert stats["sigma2_max"] == pytest.approx(shift[:2].max().item(), rel=1e-5)


def test_config_rejects_an_unknown_correction():
    with pytest.raises(ValueError, match="bias_correction"):
        CalibrationConfig(bias_correction="smearing")
