"""Train the proxy model's byte-level BPE tokenizer and pre-tokenize the corpus.

Reads --work/clean/<key>.{train,val}.jsonl (written by build_corpus.py) and writes:

    tokenizer/tokenizer.json, tokenizer_config.json, special_tokens_map.json
    train.u16.xz   uint16 token ids of every training document, each followed by EOS (id 0)
    val.u16        the same for the held-out documents (uncompressed)
    index.json     per-source [start, end) offsets into both streams, vocab and special ids

    python -m research.proxy.train_tokenizer --work .corpus
    python -m research.proxy.train_tokenizer --work .corpus \
        --tokenizer base_sglang/models/proxy-moe       # reuse the shipped tokenizer: same token ids
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import random
import shutil
import time
from collections.abc import Iterator

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

EOS, PAD = "<|endoftext|>", "<|pad|>"
# Qwen2-style split: contractions, letter runs, single digits, punctuation runs, newline and space runs
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# plain-text chat template: the model was trained on raw text, so chat is "Role: text" turns
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterator[str], vocab_size: int) -> Tokenizer:
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS) == 0 and tok.token_to_id(PAD) == 1
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str, max_len: int = 2048) -> None:
    """tokenizer.json + the config files AutoTokenizer needs (no BOS; EOS = pad-free id 0)."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS,
        "pad_token": PAD, "unk_token": None, "model_max_length": max_len, "add_bos_token": False,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": EOS, "pad_token": PAD}, f, indent=1)


def read_docs(path: str) -> list[str]:
    with open(path) as f:
        return [json.loads(line)["text"] for line in f]


def encode_docs(tok: Tokenizer, docs: list[str], batch: int = 256) -> np.ndarray:
    """Token ids of all docs, each followed by EOS (0), as one uint16 array."""
    parts = []
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch(docs[i : i + batch]):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.zeros(1, dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=".corpus")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--sample-mb", type=float, default=60.0, help="text sampled to train the BPE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--xz-preset", type=int, default=9)
    ap.add_argument("--tokenizer", default=None,
                    help="encode with this existing tokenizer folder (tokenizer.json) instead of training one")
    a = ap.parse_args(argv)
    if a.tokenizer and not os.path.exists(os.path.join(a.tokenizer, "tokenizer.json")):
        ap.error(f"--tokenizer: {os.path.join(a.tokenizer, 'tokenizer.json')} not found")
    if a.vocab > 65535:
        ap.error("--vocab must fit uint16 (<= 65535)")
    meta_path = os.path.join(a.work, "sources.json")
    if not os.path.exists(meta_path):
        ap.error(f"{meta_path} not found: run build_corpus first")
    keys = list(json.load(open(meta_path))["sources"])
    clean = os.path.join(a.work, "clean")

    t0 = time.time()
    train = {k: read_docs(os.path.join(clean, f"{k}.train.jsonl")) for k in keys}
    val = {k: read_docs(os.path.join(clean, f"{k}.val.jsonl")) for k in keys}
    total = sum(len(t) for docs in train.values() for t in docs)
    keep = min(1.0, a.sample_mb * 1e6 / total)
    rng = random.Random(a.seed)
    sample = [t for k in keys for t in train[k] if rng.random() < keep]
    print(f"read {total / 1e6:.1f} MB train text in {time.time() - t0:.1f}s; BPE on {len(sample)} docs "
          f"({sum(map(len, sample)) / 1e6:.1f} MB)", flush=True)

    t1 = time.time()
    if a.tokenizer:
        tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
        if tok.token_to_id(EOS) != 0 or tok.token_to_id(PAD) != 1:
            raise SystemExit(f"--tokenizer: {a.tokenizer} must have {EOS} = 0 and {PAD} = 1")
        dest = os.path.join(a.work, "tokenizer")
        os.makedirs(dest, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(a.tokenizer, name)):
                shutil.copy(os.path.join(a.tokenizer, name), dest)
        print(f"tokenizer from {a.tokenizer}, vocab {tok.get_vocab_size()}", flush=True)
    else:
        tok = train_tokenizer(iter(sample), a.vocab)
        save_tokenizer(tok, os.path.join(a.work, "tokenizer"))
        print(f"tokenizer trained in {time.time() - t1:.1f}s, vocab {tok.get_vocab_size()}", flush=True)

    t2 = time.time()
    index = {"vocab_size": tok.get_vocab_size(), "eos_id": 0, "pad_id": 1, "dtype": "uint16",
             "train": {}, "val": {}, "bytes": {}}
    streams = {}
    for split, docs in (("train", train), ("val", val)):
        arrays, pos = [], 0
        for k in keys:
            ids = encode_docs(tok, docs[k])
            index[split][k] = [pos, pos + len(ids)]
            pos += len(ids)
            arrays.append(ids)
            if split == "train":
                nbytes = sum(len(t.encode()) for t in docs[k])
                index["bytes"][k] = nbytes
                print(f"  {k:14s} {len(ids) / 1e6:6.2f}M tokens, {nbytes / max(1, len(ids)):.2f} bytes/token",
                      flush=True)
        streams[split] = np.concatenate(arrays)
    print(f"encoded {len(streams['train']) / 1e6:.2f}M train + {len(streams['val']) / 1e6:.3f}M val tokens "
          f"in {time.time() - t2:.1f}s", flush=True)

    t3 = time.time()
    streams["val"].tofile(os.path.join(a.work, "val.u16"))
    with lzma.open(os.path.join(a.work, "train.u16.xz"), "wb", preset=a.xz_preset) as f:
        f.write(streams["train"].tobytes())
    with open(os.path.join(a.work, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    size = os.path.getsize(os.path.join(a.work, "train.u16.xz"))
    print(f"wrote train.u16.xz ({size / 2**20:.1f} MiB) in {time.time() - t3:.1f}s; total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
