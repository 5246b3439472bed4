"""base-calibrate end to end on tiny random checkpoints of every supported family."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from base_sglang.calibration.calibrate import main
from base_sglang.calibration.config import CalibrationConfig
from base_sglang.calibration.data import read_documents, split_documents, tokenize_documents
from base_sglang.calibration.fit import NEVER
from base_sglang.calibration.pipeline import calibrate
from base_sglang.core import Predictor, PredictorMismatch
from base_sglang.hf import find_moe_blocks

FAST = ["--num-seqs", "16", "--seq-len", "24", "--batch-size", "8", "--heldout-every", "4",
        "--stat-batch", "4", "--sere-tokens", "64", "--quiet"]


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v2"])
def test_calibrate_family(family, tiny_ckpt, tiny_data, tmp_path):
    ckpt = tiny_ckpt(family)
    out = tmp_path / "pred.safetensors"
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(out), *FAST]) == 0
    pred = Predictor.load(out)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    pred.validate(model.config)
    m = pred.meta
    assert m.architecture == family and m.moe_layers == sorted(find_moe_blocks(model))
    if family == "deepseek_v2":
        assert m.moe_layers == [1, 2]  # layer 0 is dense (first_k_dense_replace=1)
    L, E = len(m.moe_layers), m.num_experts
    assert pred.weight.shape == (L, E, m.hidden_size) and torch.isfinite(pred.weight).all()
    assert torch.allclose(pred.expert_freq.sum(1), torch.ones(L), atol=1e-5)
    seen = pred.expert_freq > 0
    assert (pred.expert_norm[seen] > 0).all() and (pred.expert_norm[~seen] == 0).all()
    for j in range(L):
        assert torch.all(pred.sere_sim[j].diagonal() == 1)
        assert torch.all(pred.exfold_coef[j].diagonal() == 1)
        assert torch.all(pred.exfold_loss[j].diagonal() == NEVER)
    assert 0 <= pred.sere_sim.min() and pred.sere_sim.max() <= 1
    assert set(m.fit_stats) == {str(j) for j in m.moe_layers}
    for st in m.fit_stats.values():
        # 36 rows per expert overfit the log-norm (held-out r2 can be < 0), but the removal cost
        # c = w^2 exp(2 yhat) still ranks pairs well, and the training fit is real
        assert st["r2_train"] > 0.3 and st["spearman_cost"] > 0.7
        for mm in m.calibration["stat_budgets"]:
            assert 0 < st[f"energy_base@{mm}"] <= st[f"energy_oracle@{mm}"] + 1e-9 <= 1 + 1e-9
    assert m.calibration["split"] == "calib" and m.calibration["fit_seqs"] > 0


def test_calibration_uses_only_calibration_documents(tiny_ckpt, tiny_data, tmp_path):
    out = tmp_path / "p.safetensors"
    assert main(["--model", str(tiny_ckpt("qwen3_moe")), "--data", str(tiny_data), "--out", str(out),
                 *FAST]) == 0
    docs = read_documents(tiny_data)
    assert Predictor.load(out).meta.calibration["documents"] == len(split_documents(docs, "calib"))
    assert len(split_documents(docs, "calib")) < len(docs)


def test_layer_groups_give_the_same_fit(tiny_ckpt, tiny_data):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt("olmoe")))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt("olmoe")))
    doc_ids = tokenize_documents(tok, split_documents(read_documents(tiny_data), "calib"))
    kw = dict(num_seqs=12, seq_len=20, heldout_every=4, stat_batch=3, sere_tokens=32)
    one = calibrate(model, doc_ids, CalibrationConfig(**kw), progress=False)
    per_layer = calibrate(model, doc_ids, CalibrationConfig(**kw, max_stats_gib=1e-9), progress=False)
    assert one.meta.calibration["layer_groups"] == 1 and per_layer.meta.calibration["layer_groups"] == 2
    for name in ("weight", "bias", "expert_freq", "sere_sim", "exfold_coef"):
        assert torch.allclose(getattr(one, name), getattr(per_layer, name), atol=1e-5), name
    for layer, st in one.meta.fit_stats.items():
        assert per_layer.meta.fit_stats[layer] == pytest.approx(st, rel=1e-4, abs=1e-6)


def test_round_trip_and_validate_names_the_field(tiny_ckpt, tiny_data, tmp_path):
    out = tmp_path / "p.safetensors"
    assert main(["--model", str(tiny_ckpt("qwen3_moe")), "--data", str(tiny_data), "--out", str(out),
                 *FAST]) == 0
    a = Predictor.load(out)
    a.save(tmp_path / "again.safetensors")
    b = Predictor.load(tmp_path / "again.safetensors")
    assert a.meta == b.meta
    for name in ("weight", "bias", "expert_freq", "expert_norm", "sere_sim", "exfold_coef", "exfold_loss"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    other = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt("mixtral"))).config
    other.num_local_experts = 6
    with pytest.raises(PredictorMismatch, match="architecture"):  # a Qwen3 file on a Mixtral model
        a.validate(other)
    same_arch = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt("qwen3_moe"))).config
    same_arch.num_experts += 2
    with pytest.raises(PredictorMismatch, match="num_experts"):
        a.validate(same_arch)
    cfg = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt("qwen3_moe"))).config
    cfg.hidden_size = 48
    with pytest.raises(PredictorMismatch, match="hidden_size"):
        a.validate(cfg)


def test_cli_errors_name_the_field(tiny_ckpt, tiny_data, tmp_path, capsys):
    ckpt = str(tiny_ckpt("qwen3_moe"))
    cases = [
        (["--model", str(tmp_path), "--data", str(tiny_data), "--out", "x.safetensors"], "config.json"),
        (["--model", ckpt, "--data", str(tmp_path / "nope.txt"), "--out", "x.safetensors"], "no such file"),
        (["--model", ckpt, "--data", str(tiny_data), "--out", "x.bin"], "out"),
        (["--model", ckpt, "--data", str(tiny_data), "--out", "x.safetensors", "--seq-len", "0"], "seq_len"),
        (["--model", ckpt, "--data", str(tiny_data), "--out", "x.safetensors", "--seq-len", "5000"],
         "seq-len"),
        (["--model", ckpt, "--data", str(tiny_data), "--out", "x.safetensors", "--device", "tpu"], "device"),
    ]
    for argv, word in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error" in err and word in err, (argv, err)
