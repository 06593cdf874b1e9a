"""Suffix drafting: prompt lookup over the current context, and over earlier requests in a SuffixStore.

Each step copies from whichever matches the context's last tokens further back: the text of this
request (as prompt lookup does) or an earlier request of the same namespace. At the end of a
generation the whole sequence joins the store, so the next request can copy from it. Free to run,
like prompt lookup; its drafts go through the same confidence scores and stop rule.
"""
from __future__ import annotations

from ..sampling import PositionNoise, SamplingParams
from .base import Draft, StopRule
from .lookup import PromptLookupDrafter, copy_draft
from .suffix_store import SuffixStore


class SuffixDrafter(PromptLookupDrafter):
    name = "suffix"
    sources = ("lookup", "store")  # copies from this request or from earlier ones, calibrated apart

    def __init__(self, store: SuffixStore, **lookup_options):
        super().__init__(**lookup_options)
        self.store = store
        self.namespace: str | None = ""

    def begin(self, context: list[int], namespace: str | None = "") -> None:
        """namespace None: neither copy from earlier requests nor keep this one (prompt lookup alone)."""
        self.namespace = namespace
        self.sync(context)

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        if k <= 0 or len(context) < 2:
            return Draft()
        self._sync_index(context)
        local = self._best_match(context)
        earlier = None if self.namespace is None else self.store.best_match(self.namespace, context, self.max_match)
        if earlier is not None and (local is None or earlier.length > local[1]):
            source, tokens, end, length = "store", earlier.tokens, earlier.end, earlier.length
        elif local is not None:
            source, tokens, (end, length) = "lookup", context, local
        else:
            return Draft(source="lookup")
        draft = copy_draft(tokens, end, length, k, stop_rule.for_source(source) if stop_rule else None)
        draft.source = source
        return draft

    def end(self, sequence: list[int]) -> None:
        if self.namespace is not None:
            self.store.add(self.namespace, sequence)
