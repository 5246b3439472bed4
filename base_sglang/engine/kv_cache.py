"""The running requests' KV cache as one left-padded transformers DynamicCache.

Row b of every layer holds request b's keys/values right-aligned: pad[b] zero columns, then its tokens.
Shapes per layer: keys [B, heads, S, Dk], values [B, heads, S, Dv] (Dk != Dv for DeepSeek-V2 MLA).
Decode steps feed the cache as is (attention_mask hides the pad columns, position_ids give each row
its real position); rows are merged in after prefill and dropped when requests retire.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


class BatchKVCache:
    def __init__(self):
        self.cache: DynamicCache | None = None
        self.pad: list[int] = []  # leading pad columns per row
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.pad)

    @property
    def seq_len(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def attention_mask(self, num_new: int, device) -> torch.Tensor:
        """[B, S + num_new] int64: 0 on pad columns."""
        cols = torch.arange(self.seq_len + num_new, device=device)  # [S']
        pad = torch.tensor(self.pad, device=device)  # [B]
        return (cols[None, :] >= pad[:, None]).long()

    def merge(self, new: DynamicCache, pad: list[int], rows: list[int] | None = None) -> None:
        """Append the rows of a freshly prefilled left-padded cache (its pad columns get zeroed).

        rows: which prefilled row each new batch row copies (a prompt with n choices is prefilled
        once and its row copied n times); None = each row once, in order.
        """
        for layer in new.layers:
            for b, p in enumerate(pad):
                layer.keys[b, :, :p] = 0
                layer.values[b, :, :p] = 0
        if rows is not None and rows != list(range(len(pad))):
            idx = torch.tensor(rows, device=new.layers[0].keys.device)
            for layer in new.layers:
                layer.keys = layer.keys.index_select(0, idx)  # [b', heads, S, Dk]
                layer.values = layer.values.index_select(0, idx)
            pad = [pad[r] for r in rows]
        if self.cache is None:
            self.cache, self.pad = new, list(pad)
            return
        s_old, s_new = self.seq_len, new.get_seq_length()
        for old_l, new_l in zip(self.cache.layers, new.layers):
            old_l.keys = torch.cat([_left_pad(old_l.keys, s_new - s_old),
                                    _left_pad(new_l.keys, s_old - s_new)], 0)
            old_l.values = torch.cat([_left_pad(old_l.values, s_new - s_old),
                                      _left_pad(new_l.values, s_old - s_new)], 0)
        self.pad = ([p + max(0, s_new - s_old) for p in self.pad]
                    + [p + max(0, s_old - s_new) for p in pad])

    def release(self, rows: list[int]) -> None:
        """Drop rows (retired requests) and the pad columns no remaining row needs."""
        drop = set(rows)
        keep = [b for b in range(self.num_rows) if b not in drop]
        if not keep:
            self.cache, self.pad = None, []
            return
        trim = min(self.pad[b] for b in keep)
        idx = torch.tensor(keep, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, trim:]
            layer.values = layer.values.index_select(0, idx)[:, :, trim:]
        self.pad = [self.pad[b] - trim for b in keep]

    # A decode forward replaces each layer's tensors (torch.cat), so keeping the old references is
    # enough to undo a step that raised half-way.
    def snapshot(self) -> None:
        self._saved = [(layer.keys, layer.values) for layer in self.cache.layers] if self.cache else None

    def restore(self) -> None:
        if self._saved is not None:
            for layer, (k, v) in zip(self.cache.layers, self._saved):
                layer.keys, layer.values = k, v
        self._saved = None


def _left_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """Prepend n zero columns on the sequence dim of [B, heads, S, D]."""
    return F.pad(x, (0, 0, max(n, 0), 0)) if n > 0 else x
