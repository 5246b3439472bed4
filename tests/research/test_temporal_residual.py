"""research/temporal_residual.py: the previous token's residual of the same expert, within a window."""

from __future__ import annotations

import torch

from research.temporal_residual import main, prev_residual


def test_prev_residual_matches_the_same_expert_of_the_previous_token():
    # two windows of 3 tokens, K = 2; residual r[t, k] = 10 t + k
    ids = torch.tensor([[1, 2], [2, 3], [3, 1], [3, 4], [4, 3], [0, 5]])
    r = torch.tensor([[10.0 * t + k for k in range(2)] for t in range(6)])
    got, has = prev_residual(ids, r, seq=3)
    want_has = torch.tensor([[0, 0], [1, 0], [1, 0], [0, 0], [1, 1], [0, 0]], dtype=torch.bool)
    assert torch.equal(has, want_has)  # t = 3 starts the second window: nothing before it
    assert got[1, 0] == r[0, 1]  # expert 2 was slot 1 of token 0
    assert got[2, 0] == r[1, 1]  # expert 3 was slot 1 of token 1
    assert got[4, 0] == r[3, 1] and got[4, 1] == r[3, 0]  # experts 4 and 3 swap slots
    assert float(got[~has].abs().sum()) == 0.0


def test_missing_model_is_a_cli_error(tmp_path, capsys):
    try:
        main(["--model", str(tmp_path / "nope")])
    except SystemExit as e:
        assert e.code == 2
    assert "--model: no model folder" in capsys.readouterr().err
