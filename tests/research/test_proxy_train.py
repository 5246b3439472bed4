"""CPU smoke test of the proxy-model training script on a tiny synthetic token stream."""

import json
import lzma
import math

import numpy as np
import pytest
import torch

from research.proxy import train
from research.proxy.routing_stats import RoutingAccumulator, union_curve

VOCAB = 48


def _stream(rng: np.random.Generator, n_docs: int, doc_len: int, period: int, offset: int) -> np.ndarray:
    """Documents that repeat a short random motif (learnable), each followed by EOS = 0."""
    parts = []
    for _ in range(n_docs):
        motif = rng.integers(2 + offset, 2 + offset + 20, size=period)
        parts.append(np.resize(motif, doc_len))
        parts.append(np.zeros(1, dtype=np.int64))
    return np.concatenate(parts).astype(np.uint16)


def make_data(tmp_path):
    """train.u16.xz / val.u16 / index.json with two sources, as train_tokenizer.py writes them."""
    rng = np.random.default_rng(0)
    index = {"vocab_size": VOCAB, "eos_id": 0, "pad_id": 1, "dtype": "uint16", "train": {}, "val": {}}
    for split, n_docs in (("train", 60), ("val", 20)):
        arrays, pos = [], 0
        for key, offset in (("prose", 0), ("gosrc", 24)):  # gosrc counts as code
            a = _stream(rng, n_docs, 40, period=5, offset=offset)
            index[split][key] = [pos, pos + len(a)]
            pos += len(a)
            arrays.append(a)
        stream = np.concatenate(arrays)
        if split == "train":
            with lzma.open(tmp_path / "train.u16.xz", "wb") as f:
                f.write(stream.tobytes())
        else:
            stream.tofile(tmp_path / "val.u16")
    (tmp_path / "index.json").write_text(json.dumps(index))
    return tmp_path


@pytest.fixture
def data_dir(tmp_path):
    return make_data(tmp_path)


def test_train_smoke_reloads_and_learns(data_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ckpt"
    m = train.main([
        "--data", str(data_dir), "--out", str(out), "--config", "tiny", "--device", "cpu",
        "--batch", "8", "--seq", "32", "--steps", "40", "--warmup", "5", "--lr", "1e-2",
        "--log-every", "10", "--eval-batch", "8", "--union-len", "16", "--compile", "off",
        "--budget", "900", "--deadline", "1200", "--reserve", "10",  # step-bound, not time-bound
    ])
    assert m["steps"] == 40
    assert m["first_ce"] > math.log(VOCAB) - 0.5  # starts near uniform
    assert m["final_train_ce"] < m["first_ce"] - 1.0  # and learns the motifs
    assert m["heldout_ce"] < m["first_ce"] - 0.7
    assert abs(m["heldout_ppl"] - math.exp(m["heldout_ce"])) < 1e-6
    layers = m["routing"]["layers"]
    assert len(layers) == 2 and all(0 < lay["load_entropy"] <= 1 for lay in layers)
    assert all(lay["code_text_tv"] is not None for lay in layers)
    assert m["union"]["mean"][16] <= 8 and m["union"]["mean"][1] == 2  # top-2 of 8 experts

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16 and model.config.num_experts == 8
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == 10000.0 and cfg["num_experts"] == 8
    val = np.fromfile(data_dir / "val.u16", dtype=np.uint16)[:33].astype(np.int64)
    x = torch.from_numpy(val)[None]
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model.float()(x[:, :-1]).logits[0], x[0, 1:]).item()
    assert ce < m["first_ce"] - 0.7  # the reloaded weights are the trained ones


def test_second_proxy_config_has_no_topk_renorm(data_dir, tmp_path):
    """The E32K4 routing convention (norm_topk_prob false) reaches the saved config and the router."""
    from transformers import AutoModelForCausalLM

    assert train.CONFIGS["E32K4"]["norm_topk_prob"] is False
    assert (train.CONFIGS["E32K4"]["num_experts"], train.CONFIGS["E32K4"]["num_experts_per_tok"]) == (32, 4)
    out = tmp_path / "ckpt"
    train.main(["--data", str(data_dir), "--out", str(out), "--config", "tiny-nonorm", "--device", "cpu",
                "--batch", "4", "--seq", "16", "--steps", "3", "--warmup", "1", "--eval-batch", "4",
                "--eval-tokens", "64", "--union-len", "8", "--compile", "off", "--budget", "900",
                "--deadline", "1200", "--reserve", "10"])
    model = AutoModelForCausalLM.from_pretrained(out).float()
    assert model.config.norm_topk_prob is False
    gate = model.model.layers[0].mlp.gate
    _, weights, _ = gate(torch.randn(5, model.config.hidden_size))
    assert (weights.sum(-1) < 1 - 1e-3).all()  # raw softmax probabilities of the top-2, not renormalised


def test_bad_weights_name_the_source(data_dir, tmp_path):
    with pytest.raises(SystemExit, match="unknown source 'nope'"):
        train.main(["--data", str(data_dir), "--out", str(tmp_path / "o"), "--config", "tiny",
                    "--device", "cpu", "--weights", "nope:1"])


def test_routing_stats_known_values():
    # 4 experts, top-1: tokens always pick expert 0 or 1 with certainty -> 2 dead experts
    logits = torch.full((8, 4), -30.0)
    logits[:4, 0] = 30.0
    logits[4:, 1] = 30.0
    acc = RoutingAccumulator(1, 4, 1, torch.device("cpu"))
    acc.add((logits,), torch.tensor([True] * 4 + [False] * 4))
    lay = acc.summary()["layers"][0]
    assert lay["dead_experts"] == 2
    assert lay["load_max_over_mean"] == pytest.approx(2.0)
    assert lay["load_entropy"] == pytest.approx(math.log(2) / math.log(4))
    assert lay["mutual_info"] == pytest.approx(math.log(2), abs=1e-6)  # deterministic, 2 choices
    assert lay["code_text_tv"] == pytest.approx(1.0)
    # union over 2 docs of 4 tokens: doc 0 uses expert 0, doc 1 uses expert 1
    u = union_curve((logits,), 2, 4, 1, (1, 2))
    assert u["mean"][1] == 1.0 and u["mean"][2] == 2.0
    assert u["uniform"][2] == pytest.approx(4 * (1 - 0.75**2))


def test_heldout_format_roundtrip_and_shipped_file(tmp_path):
    from research.proxy.assets import HELDOUT_TXT, format_heldout, read_heldout

    docs = [("pydoc", "Lists\n=====\n\nA list <<<is>>> mutable.\n"), ("gosrc", "package main\n")]
    path = tmp_path / "h.txt"
    path.write_text(format_heldout(docs), encoding="utf-8")
    assert read_heldout(str(path)) == docs
    assert read_heldout(str(path), sources={"gosrc"}) == docs[1:]
    with pytest.raises(ValueError, match="header"):
        format_heldout([("x", "a\n<<<y>>>\nb\n")])
    shipped = read_heldout(HELDOUT_TXT)
    keys = {k for k, _ in shipped}
    assert len(shipped) > 100 and "lodoc" not in keys and {"gosrc", "austen", "pydoc"} <= keys


def test_html_to_text_keeps_main_content_and_pre():
    from research.proxy.html_text import html_to_text

    page = b"""<html><head><title>t</title><script>var x=1;</script></head><body>
    <div class="sphinxsidebar">Navigation junk</div>
    <div role="main"><h1>Title</h1><p>Some   <b>bold</b>
    text.</p><pre>def f():
        return 1</pre><ul><li>one</li><li>two</li></ul></div></body></html>"""
    text = html_to_text(page)
    # runs of spaces collapse, source line breaks inside a paragraph stay, <pre> is verbatim
    assert text == "Title\n\nSome bold\ntext.\n\ndef f():\n        return 1\n\none\n\ntwo\n"
    assert html_to_text(b"   ") == ""


def test_step_schedule_is_the_same_run_twice(data_dir, tmp_path):
    """--schedule steps: the LR follows the step count (not the clock), so two runs are one run."""
    args = ["--data", str(data_dir), "--config", "tiny", "--device", "cpu", "--batch", "4", "--seq", "16",
            "--steps", "12", "--schedule", "steps", "--warmup", "2", "--decay-frac", "0.5",
            "--log-every", "2", "--eval-batch", "4", "--eval-tokens", "64", "--union-len", "8",
            "--compile", "off", "--budget", "900", "--deadline", "1200", "--reserve", "10"]
    a = train.main(args + ["--out", str(tmp_path / "a")])
    b = train.main(args + ["--out", str(tmp_path / "b")])
    assert a["steps"] == 12 and a["schedule"] == "steps" and a["schedule_done"] is True
    for h in a["history"]:  # logged at steps 2, 4, ..., 12 with the lr of the step before
        assert h["lr"] == pytest.approx(train.lr_at(h["step"] - 1, (h["step"] - 1) / 12, 2e-3, 2, 0.5, 0.1))
    assert a["history"][-1]["lr"] < a["history"][0]["lr"]  # decayed by the last steps
    assert [h["ce"] for h in a["history"]] == [h["ce"] for h in b["history"]]
    assert a["heldout_ce"] == b["heldout_ce"]
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_step_schedule_needs_steps(data_dir, tmp_path):
    with pytest.raises(SystemExit):
        train.main(["--data", str(data_dir), "--out", str(tmp_path / "o"), "--config", "tiny",
                    "--device", "cpu", "--schedule", "steps"])
