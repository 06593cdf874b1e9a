"""The chat template's opening: the tokens every chat prompt of a model starts with whatever its messages say
(Qwen2.5's default system message and the user turn's header: 23 tokens), read into each model once, at load.

A request's prompt then starts with those keys and values copied into its cache instead of computed: a target's
prefill and a draft model's prompt read are that much shorter for every request, any client's. A row's keys and
values depend only on its own tokens and position (the kernels are row-exact), so the copied rows are the bits the
request would have computed, and its answer is unchanged.

Nothing here tells one client about another: the tokens come from the template alone and are read before the first
request, so every request whose prompt starts with them gains the same, whatever anyone sent before (a prefix some
client's request computed is shared only within its namespace: batch.Slot, batch.BatchEngine._may_share).
"""
from __future__ import annotations

import torch

from .cache import KVCache
from .drafters.draft_model import common_prefix_len
from .errors import InputError

# First characters of a user message that tokenizers may merge with the header before it (a newline after a
# newline, a space, a letter, a digit, punctuation, another script): the opening is what all renders share.
SAMPLE_MESSAGES = ("a", "Z 1", "\n\n", " {", "7", "中文", "'")


def opening_ids(encode_chat) -> list[int]:
    """The token ids every one-message chat starts with, whatever the message: encode_chat(messages) renders and
    encodes a chat as the engine does. [] where the template renders no such chat."""
    try:
        renders = [encode_chat([{"role": "user", "content": text}]) for text in SAMPLE_MESSAGES]
    except InputError:  # a template that refuses a lone user message reads no opening: prompts read as before
        return []
    shared = min(common_prefix_len(renders[0], other) for other in renders[1:])
    return renders[0][:shared]


class Opening:
    """One model's keys and values of the opening's tokens (`ids`), in a cache of their own."""

    def __init__(self, ids: list[int], cache: KVCache):
        self.ids = ids
        self.cache = cache

    @classmethod
    def read(cls, model, ids: list[int], chunk: int) -> "Opening | None":
        """The opening read into `model` in prompt chunks of `chunk` rows, as the engine reads a prompt (the same
        block sizes: a float32 model is row-exact only within them). None where there is nothing to read or the
        model's cache is not a KVCache (the transformers fallback)."""
        if not ids:
            return None
        cache = model.new_cache(len(ids))
        if not isinstance(cache, KVCache):
            return None
        ids = ids[: cache.max_len]
        device = getattr(model, "device", None)
        for start in range(0, len(ids), chunk):
            model(torch.tensor(ids[start : start + chunk], device=device), cache, logits="none")
        return cls(ids, cache)

    def covers(self, tokens: list[int], cache: KVCache | None = None) -> int:
        """How many of `tokens`' first tokens the opening holds (as many as `cache` has room for, where given)."""
        shared = common_prefix_len(self.ids, tokens)
        return shared if cache is None else min(shared, cache.max_len)

    def restore(self, cache: KVCache, cached: list[int], tokens: list[int]) -> None:
        """`cache` holds `cached`, a prefix of `tokens` (what it is about to hold): where `tokens` start with more of
        the opening than that, the opening's rows are copied in and `cached` extended to match."""
        if len(cached) >= len(self.ids):  # every step of a request: it holds the whole opening already
            return
        shared = self.covers(tokens, cache)
        if shared > len(cached):
            cache.copy_prefix(self.cache, shared)
            cached.extend(tokens[len(cached) : shared])
