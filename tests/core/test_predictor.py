"""Predictor file: round trip, validation against a model config, clear errors."""

import json

import pytest
import torch
from core_helpers import make_predictor
from safetensors.torch import save_file

from base_sglang.core import Predictor, PredictorMismatch, describe_model_config
from base_sglang.core.predictor import moe_layer_ids


def qwen3_config(**kw):
    from transformers import Qwen3MoeConfig

    base = dict(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                num_experts=6, num_experts_per_tok=2)
    base.update(kw)
    return Qwen3MoeConfig(**base)


def test_round_trip(tmp_path):
    pred = make_predictor(6, 16, 2, layers=(0, 1))
    pred.meta.fit_stats = {"0": {"r2": 0.5}}
    path = tmp_path / "p.safetensors"
    pred.save(path)
    back = Predictor.load(path)
    assert back.meta == pred.meta
    for name in ("weight", "bias", "expert_freq", "expert_norm", "sere_sim", "exfold_coef", "exfold_loss"):
        assert torch.equal(getattr(back, name), getattr(pred, name))
    back.validate(qwen3_config())


@pytest.mark.parametrize("field,kw", [("hidden_size", {"hidden_size": 32, "head_dim": 16}),
                                      ("num_experts", {"num_experts": 8}),
                                      ("top_k", {"num_experts_per_tok": 3}),
                                      ("num_layers", {"num_hidden_layers": 3}),
                                      ("moe_layers", {"mlp_only_layers": [1]})])
def test_validate_names_the_mismatching_field(field, kw):
    pred = make_predictor(6, 16, 2, layers=(0, 1))
    with pytest.raises(PredictorMismatch, match=field):
        pred.validate(qwen3_config(**kw))


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="predictor"):
        Predictor.load(tmp_path / "missing.safetensors")
    plain = tmp_path / "plain.safetensors"
    save_file({"weight": torch.zeros(1, 2, 3)}, str(plain))
    with pytest.raises(PredictorMismatch, match="metadata"):
        Predictor.load(plain)
    pred = make_predictor(6, 16, 2)
    path = tmp_path / "v.safetensors"
    pred.save(path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["base_sglang"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta["format_version"] = 99
    save_file(tensors, str(path), metadata={"base_sglang": json.dumps(meta)})
    with pytest.raises(PredictorMismatch, match="format_version"):
        Predictor.load(path)
    with pytest.raises(PredictorMismatch, match="weight"):
        Predictor(meta=pred.meta, weight=torch.zeros(1, 6, 15), bias=pred.bias)


def test_predicted_log_norm_matches_the_linear_model():
    pred = make_predictor(6, 16, 2)
    z = torch.randn(3, 16)
    ids = torch.tensor([[0, 5], [2, 2], [4, 1]])
    yhat = pred.predict_log_norm(0, z, ids)
    for t in range(3):
        for k in range(2):
            u = ids[t, k]
            assert torch.isclose(yhat[t, k], z[t] @ pred.weight[0, u] + pred.bias[0, u], atol=1e-5)
    with pytest.raises(KeyError, match="layer_id"):
        pred.predict_log_norm(7, z, ids)


def test_moe_layer_ids_for_each_family():
    from transformers import DeepseekV2Config, MixtralConfig, OlmoeConfig, Qwen2MoeConfig

    assert moe_layer_ids(qwen3_config(num_hidden_layers=4, mlp_only_layers=[2])) == [0, 1, 3]
    assert moe_layer_ids(Qwen2MoeConfig(num_hidden_layers=4, decoder_sparse_step=2)) == [1, 3]
    assert moe_layer_ids(OlmoeConfig(num_hidden_layers=3)) == [0, 1, 2]
    assert moe_layer_ids(MixtralConfig(num_hidden_layers=2)) == [0, 1]
    assert moe_layer_ids(DeepseekV2Config(num_hidden_layers=4, first_k_dense_replace=1)) == [1, 2, 3]
    d = describe_model_config(MixtralConfig(num_hidden_layers=2))
    assert d["num_experts"] == 8 and d["top_k"] == 2


def test_validate_checks_the_architecture():
    pred = make_predictor(6, 16, 2, layers=(0, 1))  # architecture "Qwen3MoeForCausalLM"
    cfg = qwen3_config()
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    pred.validate(cfg)
    pred.meta.architecture = "qwen3_moe"  # calibration records the model_type
    pred.validate(cfg)
    pred.meta.architecture = "mixtral"
    with pytest.raises(PredictorMismatch, match="architecture"):
        pred.validate(cfg)
