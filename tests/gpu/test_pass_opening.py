"""The chat template's opening (opening.py) on the GPU path (the interpreter on a CPU): read into a cache of its own
from the device's pool at load, its rows copied into a request's pooled cache are the bits a fresh read computes, in
the target's cache and the draft model's, and the answers (draft chains as device rounds, plain requests batched) are those
of an engine without it. tests/lossless/test_opening.py holds the CPU's checks and their broken twins."""
from __future__ import annotations

import torch

from specdecode.batch import BatchEngine
from specdecode.engine import Engine
from gpu_models import CONTEXT, tiny_target_and_draft
from testlib import as_loaded, fake_tokenizer

OPENING = [5, 61, 17, 3, 99, 250, 3, 17, 42, 8, 200, 6, 7, 8, 9, 10, 11, 12]  # past one 16-key attention segment
PROMPTS = [OPENING + [7, 8, 9, 44], OPENING[:5] + [1, 2, 3]]  # the second shares only part of it


def same_rows(a, b) -> bool:
    n = a.length
    return n == b.length and torch.equal(a.keys[:, :, :n], b.keys[:, :, :n]) and \
        torch.equal(a.values[:, :, :n], b.values[:, :, :n])


def test_the_opening_on_the_gpu_path_changes_no_bit():
    target, draft = tiny_target_and_draft()
    tokenizer = fake_tokenizer(target.config.vocab_size)
    on, off = (Engine(as_loaded(target, tokenizer, "target"), as_loaded(draft, tokenizer, "draft"), max_context=CONTEXT,
                      check_invariants=True, opening=ids) for ids in (OPENING, []))
    assert on.opening.cache.length == on.draft_opening.cache.length == len(OPENING)
    alone = {}
    for prompt in PROMPTS:
        a, b = (engine.generate(prompt, drafter="draft", k=4, max_new_tokens=6) for engine in (on, off))
        assert a.token_ids == b.token_ids, prompt
        assert same_rows(on.cache, off.cache), prompt
        assert same_rows(on.drafter("draft").cache, off.drafter("draft").cache), prompt
        alone[tuple(prompt)] = a.token_ids
    batch = BatchEngine(on, max_batch=2)
    tickets = [batch.submit(p, drafter="none", max_new_tokens=6, namespace=f"c{i}") for i, p in enumerate(PROMPTS)]
    while batch.busy:
        batch.step()
    for prompt, ticket in zip(PROMPTS, tickets):
        assert ticket.result().token_ids == alone[tuple(prompt)], prompt
