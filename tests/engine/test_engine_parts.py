"""Detokenizer, batched KV cache and sampler filters in isolation."""

import pytest
import torch
from transformers import DynamicCache

from base_sglang.engine.detokenizer import Detokenizer
from base_sglang.engine.kv_cache import BatchKVCache
from base_sglang.engine.sampler import _filter


class CharTokenizer:
    def decode(self, ids, **kw):
        return "".join(chr(i) for i in ids)


def test_detokenizer_holds_back_a_possible_stop_string():
    d = Detokenizer(CharTokenizer(), stop=("END",))
    ids = []
    deltas = []
    for ch in "abEN":
        ids.append(ord(ch))
        deltas.append(d.update(ids))
    assert "".join(deltas) == "ab" and not d.stopped  # "EN" might become "END"
    ids.append(ord("x"))
    assert d.update(ids) == "ENx"
    for ch in "yEND":
        ids.append(ord(ch))
        d.update(ids)
    assert d.stopped and d.text == "abENxy"


def test_detokenizer_holds_back_incomplete_characters():
    d = Detokenizer(CharTokenizer())
    assert d.update([ord("a"), 0xFFFD]) == "a"
    assert d.update([ord("a"), 0xFFFD], final=True) == "\ufffd"


def _cache(lengths, value):
    """Left-padded cache: row b holds `value + b` in its last lengths[b] columns."""
    S = max(lengths)
    k = torch.zeros(len(lengths), 1, S, 2)
    for b, n in enumerate(lengths):
        k[b, :, S - n:] = value + b
    return DynamicCache(ddp_cache_data=[(k.clone(), k.clone())]), [S - n for n in lengths]


def test_kv_merge_release_keeps_each_row_right_aligned():
    kv = BatchKVCache()
    kv.merge(*_cache([3, 1], 10))
    kv.merge(*_cache([5], 20))  # longer: the old rows get more padding
    assert kv.pad == [2, 4, 0] and kv.seq_len == 5
    keys = kv.cache.layers[0].keys[:, 0, :, 0]
    assert keys[0].tolist() == [0, 0, 10, 10, 10] and keys[1].tolist() == [0, 0, 0, 0, 11]
    assert kv.attention_mask(1, "cpu")[1].tolist() == [0, 0, 0, 0, 1, 1]
    kv.release([2])  # the longest leaves: common padding is trimmed
    assert kv.pad == [0, 2] and kv.seq_len == 3
    assert kv.cache.layers[0].keys[:, 0, :, 0].tolist() == [[10, 10, 10], [0, 0, 11]]
    kv.release([0, 1])
    assert kv.cache is None and kv.num_rows == 0


def test_filter_top_k_and_top_p_per_row():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = _filter(logits, torch.tensor([2, -1]), torch.tensor([1.0, 0.7]))
    assert torch.isfinite(out).tolist() == [[True, True, False, False], [True, True, False, False]]
    out = _filter(logits, torch.tensor([-1, 1]), torch.tensor([0.9, 1.0]))
    assert torch.isfinite(out).tolist() == [[True, True, True, False], [True, False, False, False]]


@pytest.mark.parametrize("rows,budget", [(35, 8), (2, 4), (3, 6)])  # dense; M >= T*K (K = 2)
def test_skip_selection_fast_path_equals_the_selection(tiny_model_dir, rows, budget):
    """decode_step(skip_selection=True) skips select_experts; outputs and stats must not change."""
    from transformers import AutoModelForCausalLM

    from base_sglang.core import Predictor, SelectionConfig
    from base_sglang.hf import MoEPatch, decode_step

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    MoEPatch(model, SelectionConfig(policy="base"),
             Predictor.load(tiny_model_dir / "predictor.safetensors"))
    ids = torch.randint(0, 300, (rows, 1))
    budgets = torch.full((rows,), budget)
    budgets[0] = 1  # the batch budget is the largest
    with torch.no_grad():
        with decode_step(budgets) as full:
            ref = model(ids).logits
        with decode_step(budgets, skip_selection=True) as fast:
            got = model(ids).logits
    assert torch.equal(ref, got)
    for layer, stats in full.stats.items():
        assert [int(x) for x in fast.stats[layer]] == [int(x) for x in stats]
        assert torch.equal(fast.ids[layer], full.ids[layer])


def _filter_ref(logits, top_k, top_p):
    """The full-sort definition: rank < k and mass strictly above the rank < top_p."""
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
    drop = torch.arange(V)[None, :] >= k[:, None]
    probs = torch.softmax(sorted_logits, -1)
    drop |= (probs.cumsum(-1) - probs) >= top_p[:, None]
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, -float("inf")))


def test_filter_equals_the_full_sort_definition():
    torch.manual_seed(0)
    logits = torch.randn(7, 300) * 3
    top_k = torch.tensor([-1, 5, 50, 1, -1, 300, 1000])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 0.3, 0.99, 1.0])
    got, ref = _filter(logits, top_k, top_p)[1:6], _filter_ref(logits, top_k, top_p)[1:6]
    assert torch.equal(torch.isfinite(got), torch.isfinite(ref))
    assert torch.equal(got[torch.isfinite(got)], ref[torch.isfinite(ref)])
    # no filter: the row as is (the full-sort form drops tail tokens where the float cumsum hits 1)
    full = _filter(logits, top_k, top_p)
    assert torch.equal(full[0], logits[0]) and torch.equal(full[6], logits[6])
