"""Key/value caches of many sequences in one device tensor, so one kernel launch reaches every sequence of a pass.

A pool holds [layers, slots, kv heads, max_len, head_dim] keys and values; each sequence's cache is one slot of
it (PooledKVCache: the usual KVCache interface over a view, so rollback, prefix copies and tree compaction work
unchanged). Slot 0 is never handed out: rows that only pad a pass to its captured size write there. The pool
doubles when it runs out of slots (copying what it holds); its `version` then changes, and passes captured
against the old tensors are captured again.
"""
from __future__ import annotations

import weakref

import torch

from ..cache import KVCache


class KVPool:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype, device,
                 slots: int = 4):
        self.shape = (n_layers, n_kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.keys = torch.zeros(n_layers, slots, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free = list(range(slots - 1, 0, -1))
        self.version = 0

    @property
    def slots(self) -> int:
        return self.keys.shape[1]

    def new_cache(self) -> "PooledKVCache":
        if not self.free:
            self._grow()
        return PooledKVCache(self, self.free.pop())

    def _grow(self) -> None:
        old = self.slots
        keys = torch.zeros(self.keys.shape[0], 2 * old, *self.keys.shape[2:], dtype=self.keys.dtype,
                           device=self.keys.device)
        values = torch.zeros_like(keys)
        keys[:, :old] = self.keys
        values[:, :old] = self.values
        self.keys, self.values = keys, values
        self.free = list(range(2 * old - 1, old - 1, -1))
        self.version += 1

    def release(self, slot: int) -> None:
        self.free.append(slot)


class PooledKVCache(KVCache):
    """One sequence's cache: slot `slot` of `pool` (returned to it when the cache is dropped)."""

    def __init__(self, pool: KVPool, slot: int):
        self.pool = pool
        self.slot = slot
        self.max_len = pool.max_len
        self.length = 0
        weakref.finalize(self, pool.release, slot)

    @property
    def keys(self) -> torch.Tensor:  # [layers, kv heads, max_len, head_dim]
        return self.pool.keys[:, self.slot]

    @property
    def values(self) -> torch.Tensor:
        return self.pool.values[:, self.slot]
