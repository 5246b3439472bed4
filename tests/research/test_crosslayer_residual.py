"""research/crosslayer_residual.py: token-level corrections from the layer below and the other slots."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from research.crosslayer_residual import fit_beta, leave_one_out, main, offsets, summary


def test_leave_one_out_and_offsets():
    r = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])  # [T=2, K=3]
    assert torch.equal(leave_one_out(r), torch.tensor([[2.5, 2.0, 1.5], [3.0, 3.0, 0.0]]))
    below = torch.tensor([[1.0, 3.0, 5.0], [2.0, 2.0, 2.0]])
    w = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
    assert torch.equal(offsets("below", below, w, r), torch.tensor([[3.0] * 3, [2.0] * 3]))
    assert torch.equal(offsets("below_w", below, w, r), torch.tensor([[1.0] * 3, [2.0] * 3]))  # w^2 mean
    assert offsets("below", None, None, r) is None  # the first MoE layer has nothing below
    assert torch.equal(offsets("same_loo", None, None, r), leave_one_out(r))


def test_fit_beta_recovers_a_scale_and_summary_is_the_gap_share():
    x = torch.linspace(-1, 1, 101)
    assert fit_beta(x, 0.3 * x) == pytest.approx(0.3)
    layers = {"0": {"energy_linear@8": 0.8, "energy_oracle@8": 0.9, "below_corr": 0.1, "below_energy@8": 0.85},
              "1": {"energy_linear@8": 0.7, "energy_oracle@8": 0.8, "below_corr": 0.3, "below_energy@8": 0.7}}
    s = summary(layers, (8,))
    assert s["below"]["gap_closed@8"] == pytest.approx(0.25) and s["below"]["corr_mean"] == pytest.approx(0.2)
    assert "same_loo" not in s


def test_missing_model_is_a_cli_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path / "nope")])
    assert e.value.code == 2 and "--model: no model folder" in capsys.readouterr().err


def test_quality_script_refuses_an_unknown_run(tmp_path):
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(["bash", str(root / "benchmarks/run_quality_cpu.sh"), "proxy_b8", "proxy_b9"],
                       capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                                                                           "OUT_DIR": str(tmp_path / "o")})
    assert p.returncode == 2 and "unknown run 'proxy_b9'" in p.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran
