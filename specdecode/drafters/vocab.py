"""Frequency-ranked draft vocabulary (FR-Spec, Zhao et al. 2025): the draft scores only common tokens.

Tokens outside the subset get zero draft probability. That never changes what is generated (the
target decides every token and the rejection rule accounts for q = 0), it only makes drafting
cheaper and, rarely, a draft shorter. The ranking is built offline by scripts/build_draft_vocab.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..tokenizer import Tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
TABLES = ("qwen2_draft_vocab",)


def frequent_token_ids(tokenizer: Tokenizer, size: int) -> torch.Tensor | None:
    """The `size` most frequent token ids for this tokenizer plus its special tokens, or None if no table fits."""
    for table in TABLES:
        meta_path = DATA / f"{table}.json"
        if not meta_path.is_file():
            continue
        meta = json.loads(meta_path.read_text())
        if meta["tokenizer_fingerprint"] != tokenizer.fingerprint():
            continue
        ranked = np.load(DATA / f"{table}.npy")[:size]
        special = set(tokenizer.eos_ids) | set(getattr(tokenizer.hf, "all_special_ids", []) or [])
        ids = sorted(set(int(t) for t in ranked) | special)
        return torch.tensor(ids, dtype=torch.long)
    return None


def restrict_draft_vocabulary(draft, size: int | None) -> None:
    """Give a draft model (a LoadedModel) the frequent-vocabulary head of `size` tokens where a table fits it."""
    if not size:
        return
    subset = frequent_token_ids(draft.tokenizer, size)
    if subset is not None and len(subset) < draft.vocab_size:
        draft.model.set_vocab_subset(subset)
