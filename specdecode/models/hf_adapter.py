"""Fallback: any Hugging Face AutoModelForCausalLM behind the native model's interface (slower)."""
from __future__ import annotations

import torch


class HFCache:
    """Rollback-able view of a transformers DynamicCache, with the same API as KVCache."""

    def __init__(self, max_len: int):
        from transformers import DynamicCache

        self.inner = DynamicCache()
        self.max_len = max_len
        self.length = 0

    @property
    def room(self) -> int:
        return self.max_len - self.length

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        if length < self.length:
            # A negative argument drops that many entries from the end (transformers 4.x and 5.x agree on it).
            self.inner.crop(length - self.length)
        self.length = length


class HFAdapter:
    def __init__(self, hf_model, max_positions: int):
        self.hf = hf_model.eval()
        self.max_positions = max_positions
        cfg = hf_model.config
        self.config = cfg
        self.vocab_size = int(cfg.vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    def new_cache(self, max_len: int | None = None) -> HFCache:
        return HFCache(min(max_len or self.max_positions, self.max_positions))

    @torch.inference_mode()
    def __call__(self, tokens, cache: HFCache, positions=None, attn_mask=None, logits: str = "all"):
        if attn_mask is not None or positions is not None:
            raise NotImplementedError("the transformers fallback supports causal blocks only (no token trees)")
        seq = tokens.shape[0]
        if cache.length + seq > cache.max_len:
            raise ValueError(f"block of {seq} tokens does not fit: cache holds {cache.length} of {cache.max_len}")
        out = self.hf(input_ids=tokens[None], past_key_values=cache.inner, use_cache=True)
        cache.length += seq
        if logits == "none":
            return None
        result = out.logits[0].float()
        return result[-1:] if logits == "last" else result
