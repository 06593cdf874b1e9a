"""Preallocated key/value cache with O(1) rollback."""
from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer for one sequence, written in place.

    `length` is the number of positions that hold real entries; rolling back after a rejected
    draft only moves it (`truncate`), the stale entries are overwritten by the next block.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype, device):
        shape = (n_layers, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    @property
    def room(self) -> int:
        return self.max_len - self.length

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys/values: [n_kv_heads, T, head_dim] for positions start..start+T-1."""
        end = start + keys.shape[1]
        self.keys[layer, :, start:end] = keys
        self.values[layer, :, start:end] = values

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer, :, :end], self.values[layer, :, :end]

    def copy_prefix(self, source: "KVCache", end: int) -> None:
        """Take positions length..end-1 from `source` (a cache holding the same tokens there), so this cache
        holds `end` positions without computing them; a row's keys and values depend only on the tokens up
        to it, so they are the ones this cache would have computed."""
        if not self.length <= end <= min(source.length, self.max_len):
            raise ValueError(f"cannot copy positions {self.length}..{end} from a cache of length {source.length}")
        self.keys[:, :, self.length:end] = source.keys[:, :, self.length:end]
        self.values[:, :, self.length:end] = source.values[:, :, self.length:end]
        self.length = end

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def compact(self, start: int, kept_offsets: list[int]) -> None:
        """Keep the block entries at start+offset (offsets ascending) as positions start, start+1, ...

        Used after tree verification, where the accepted path is scattered through the block.
        """
        if kept_offsets == list(range(len(kept_offsets))):
            self.length = start + len(kept_offsets)
            return
        index = torch.tensor(kept_offsets, device=self.keys.device) + start
        new_end = start + len(kept_offsets)
        self.keys[:, :, start:new_end] = self.keys.index_select(2, index)
        self.values[:, :, start:new_end] = self.values.index_select(2, index)
        self.length = new_end
