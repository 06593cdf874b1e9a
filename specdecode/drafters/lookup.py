"""Prompt-lookup drafting: no draft model, copy what followed an earlier occurrence of the recent text.

Strong where the answer repeats its input (summaries, extraction, code edits, RAG) and free to run.
Among the earlier occurrences of the longest matching n-gram, the one whose match reaches furthest
back wins (the most recent on a tie): a longer match is more likely to continue the same way. Every
drafted token carries a confidence score from its match length, which the engine calibrates against
what the target accepted, so a stop rule can end the copy where it stops paying.
"""
from __future__ import annotations

from ..sampling import PositionNoise, SamplingParams
from .base import Draft, Drafter, DrafterTraits, StopRule


def match_confidence(match_length: int) -> float:
    """A score in (0, 1) rising with the match length; the engine learns what each score is worth."""
    return match_length / (match_length + 2.0)


class PromptLookupDrafter(Drafter):
    name = "lookup"
    traits = DrafterTraits(stop_rule=True, max_k=15)  # a verify block of 16 still goes through the exact skinny kernel

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_candidates: int = 64, max_match: int = 32):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_candidates = max_candidates  # most recent occurrences compared per step
        self.max_match = max_match
        self._indexed: list[int] = []
        # n -> n-gram -> end positions (index of its last token) in self._indexed, oldest first
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}

    def reset(self) -> None:
        self._indexed = []
        self._index = {}

    def _sync_index(self, context: list[int]) -> None:
        """Index every n-gram of context; incremental while the context only grows."""
        known = len(self._indexed)
        if known > len(context) or self._indexed != context[:known]:
            self.reset()
            known = 0
        self._indexed.extend(context[known:])
        for end in range(known, len(context)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n + 1 < 0:
                    break
                self._index.setdefault(n, {}).setdefault(tuple(context[end - n + 1 : end + 1]), []).append(end)

    def _best_match(self, context: list[int]) -> tuple[int, int] | None:
        """(end position of the chosen earlier occurrence, match length), or None."""
        last = len(context) - 1
        for n in range(min(self.max_ngram, last), self.min_ngram - 1, -1):
            ends = self._index.get(n, {}).get(tuple(context[last - n + 1 :]), [])
            best: tuple[int, int] | None = None
            for end in reversed(ends[-self.max_candidates - 1 :]):
                if end >= last:  # the suffix itself
                    continue
                length = n
                while length < self.max_match and end - length >= 0 and context[end - length] == context[last - length]:
                    length += 1
                if best is None or length > best[1]:
                    best = (end, length)
            if best is not None:
                return best
        return None

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        if k <= 0 or len(context) < 2:
            return Draft()
        self._sync_index(context)
        match = self._best_match(context)
        if match is None:
            return Draft()
        end, length = match
        return copy_draft(context, end, length, k, stop_rule)


def copy_draft(source: list[int], end: int, length: int, k: int, stop_rule: StopRule | None) -> Draft:
    """Up to k tokens of what followed source[end], where the context's last `length` tokens matched."""
    tokens: list[int] = []
    confidences: list[float] = []
    chain_prob = 1.0
    for i, token in enumerate(source[end + 1 : end + 1 + k]):
        # Once i copied tokens are accepted, the match is i tokens longer.
        confidence = match_confidence(length + i)
        if stop_rule is not None:
            if not stop_rule.keep(i, chain_prob, confidence):
                break
            chain_prob *= stop_rule.chance(i, confidence)
        tokens.append(token)
        confidences.append(confidence)
    return Draft(tokens, confidences=confidences)
