"""Suffix drafting: prompt lookup over the current context, and over earlier requests in a SuffixStore.

Each step copies the context's last tokens' continuation from the text of this request (as prompt
lookup does) or from an earlier request of the same namespace, whichever copy the target is expected
to accept more of: each source's calibrated acceptance at its match length (a long match in the store
after an instruction many requests share is often right for a few tokens only), or, before anything is
calibrated, the match that reaches further back. At the end of a
generation the whole sequence joins the store, so the next request can copy from it. Free to run,
like prompt lookup; its drafts go through the same confidence scores and stop rule.
"""
from __future__ import annotations

from ..sampling import PositionNoise, SamplingParams
from .base import Draft, StopRule
from .lookup import PromptLookupDrafter, copy_draft
from .suffix_store import SuffixStore


def expected_accepted(draft: Draft, rule: StopRule) -> float:
    """Tokens of the draft the target is expected to accept: a token counts only if all before it are accepted."""
    expected, chain = 0.0, 1.0
    for position, confidence in enumerate(draft.confidences):
        chain *= rule.chance(position, confidence)
        expected += chain
    return expected


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
        drafts = []  # this request's copy first: it wins ties
        if local is not None:
            drafts.append(self._copy("lookup", context, *local, k, stop_rule))
        if earlier is not None:
            drafts.append(self._copy("store", earlier.tokens, earlier.end, earlier.length, k, stop_rule))
        if not drafts:
            return Draft(source="lookup")
        if stop_rule is None:  # nothing calibrated: the match that reaches further back
            return max(drafts, key=lambda d: d.confidences[0] if d.confidences else 0.0)
        return max(drafts, key=lambda d: expected_accepted(d, stop_rule.for_source(d.source)))

    @staticmethod
    def _copy(source: str, tokens: list[int], end: int, length: int, k: int, stop_rule: StopRule | None) -> Draft:
        draft = copy_draft(tokens, end, length, k, stop_rule.for_source(source) if stop_rule else None)
        draft.source = source
        return draft

    def end(self, sequence: list[int]) -> None:
        if self.namespace is not None:
            self.store.add(self.namespace, sequence)
