"""Prompt-lookup drafting: no draft model, copy what followed the latest earlier match of the recent n-gram.

Strong where the answer repeats its input (summaries, extraction, code edits, RAG) and free to run.
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from .base import Draft, Drafter


class PromptLookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, context: list[int], k: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        if k <= 0:
            return Draft()
        size = len(context)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            pattern = context[size - n :]
            # Scan backwards so the most recent occurrence wins: recent text predicts best.
            for start in range(size - n - 1, -1, -1):
                if context[start : start + n] == pattern:
                    follow = context[start + n : start + n + k]
                    if follow:
                        return Draft(list(follow))
        return Draft()
