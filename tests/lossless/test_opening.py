"""The chat template's opening, read into each model at load (opening.py), changes no bit: a prompt that starts with
it leaves in the target's cache and in the draft model's the rows a fresh read computes, and the answer is plain
decoding's, alone, drafted and batched, whoever asked before. Broken twins: an opening whose rows are another
token's, and one copied a row short; the checks must catch both."""
import pytest
import torch

from specdecode.batch import BatchEngine
from specdecode.engine import Engine
from specdecode.generation import Generation
from specdecode.opening import Opening, opening_ids
from testlib import as_loaded, kquant_model, make_tiny_model, perturbed_copy, reference_greedy

OPENING = [5, 61, 17, 3, 99, 250, 3, 17, 42, 8, 200]
TAILS = [[7, 8, 9, 44, 45, 46, 7, 8], [12, 250, 3, 17], [61]]  # the last: all but one token from the opening
NEW_TOKENS = 24


def models():
    """A float32 model (prompt chunks of row-exact size) and a GGUF-block model on the int8 kernel."""
    float32 = make_tiny_model(seed=3)
    blocks, _ = kquant_model(seed=4)
    return [("float32", float32, perturbed_copy(float32, 0.05, seed=5)), ("int8", blocks, None)]


def engines(target, draft, opening):
    """Engines on one target with and without the opening (and a draft model where given)."""
    loaded = as_loaded(target)
    draft_loaded = as_loaded(draft) if draft is not None else None
    on = Engine(loaded, draft_loaded, max_context=128, check_invariants=True, opening=opening)
    off = Engine(loaded, draft_loaded, max_context=128, check_invariants=True, opening=[])
    return on, off


def rows(cache, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    return cache.keys[:, :, :length].clone(), cache.values[:, :, :length].clone()


def check_same_bits(on: Engine, off: Engine, drafter: str) -> None:
    """Every prompt answered by both engines: the same tokens as plain decoding from scratch, the same bits in the
    target cache and (where the drafter is a model) in the draft's."""
    for tail in TAILS:
        prompt = OPENING + tail
        k = 0 if drafter == "none" else 4  # a fixed K: both engines draft the same chains
        a = on.generate(prompt, drafter=drafter, k=k, max_new_tokens=NEW_TOKENS)
        b = off.generate(prompt, drafter=drafter, k=k, max_new_tokens=NEW_TOKENS)
        assert a.token_ids == b.token_ids == reference_greedy(on.target.model, prompt, NEW_TOKENS), tail
        for x, y in zip(rows(on.cache, on.cache.length), rows(off.cache, off.cache.length)):
            assert torch.equal(x, y), tail
        if drafter == "draft":
            da, db = on.drafter("draft"), off.drafter("draft")
            assert da.cached == db.cached and len(da.cached) >= len(prompt)
            for x, y in zip(rows(da.cache, da.cache.length), rows(db.cache, db.cache.length)):
                assert torch.equal(x, y), tail
        on.reset()
        off.reset()


@pytest.mark.parametrize("name,target,draft", models(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("drafter", ["none", "lookup", "draft"])
def test_a_prompt_starting_with_the_opening_gets_the_rows_and_answer_of_a_fresh_read(name, target, draft, drafter,
                                                                                     monkeypatch):
    draft = draft if draft is not None else target  # the int8 case drafts with the target's own model
    on, off = engines(target, draft, OPENING)
    assert on.opening.cache.length == len(OPENING)  # read at load, before any request
    assert on.drafter("draft").opening.cache.length == len(OPENING)
    assert on.drafter("draft").unread_tokens(OPENING + TAILS[0]) == len(TAILS[0]) - 1
    check_same_bits(on, off, drafter)
    # what the opening saves: only the tail is read (the last prompt token is the first step's)
    read = []
    real = Generation.reuse_prefix
    monkeypatch.setattr(Generation, "reuse_prefix", lambda self: read.append(real(self)) or read[-1])
    on.generate(OPENING + TAILS[0], drafter="none", max_new_tokens=1)
    assert read == [TAILS[0][:-1]]


@pytest.mark.parametrize("twin", ["other token", "a row short"])
def test_the_checks_catch_an_opening_with_wrong_rows(twin, monkeypatch):
    """Broken twins: the opening's rows read from another first token, or copied one row short (the last copied
    row left as the cache had it) while the cache claims to hold it."""
    target = make_tiny_model(seed=3)
    if twin == "other token":
        real_read = Opening.read.__func__

        def read_other(cls, model, ids, chunk):
            opening = real_read(cls, model, [ids[0] + 1] + ids[1:], chunk) if ids else None
            if opening is not None:
                opening.ids = list(ids)
            return opening

        monkeypatch.setattr(Opening, "read", classmethod(read_other))
    else:
        def copy_short(self, cache, cached, tokens):
            shared = self.covers(tokens, cache)
            if shared > len(cached):
                cache.copy_prefix(self.cache, shared - 1)
                cache.length = shared
                cached.extend(tokens[len(cached) : shared])

        monkeypatch.setattr(Opening, "restore", copy_short)
    on, off = engines(target, target, OPENING)
    with pytest.raises(AssertionError):
        check_same_bits(on, off, "none")


def test_batched_requests_of_any_client_get_their_solo_answers(smollm2):
    """A real chat template (SmolLM2's default system message): every client's request starts with the opening's
    rows, whatever ran before, and a batch gives each request what it gets alone without the opening."""
    on = Engine(smollm2, max_context=512)
    off = Engine(smollm2, max_context=512, opening=[])
    assert len(on.opening.ids) >= 20 and off.opening is None
    prompts = ["Name three planets.", "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
               "\n\nWrite a haiku", "'quoted' text"]
    batch = BatchEngine(on, max_batch=3, prefill_rows=16)
    tickets = [batch.submit(p, drafter=d, max_new_tokens=16, namespace=f"client{i}")
               for i, (p, d) in enumerate(zip(prompts, ["none", "lookup", "auto", "suffix"]))]
    while batch.busy:
        batch.step()
    for prompt, ticket in zip(prompts, tickets):
        alone = off.generate(prompt, drafter="none", max_new_tokens=16)
        assert ticket.result().token_ids == alone.token_ids, prompt
        assert ticket.reused >= len(on.opening.ids) - 1  # the opening, taken whoever ran in the slot before


def test_the_opening_is_what_every_one_message_chat_starts_with(smollm2):
    engine = Engine(smollm2, max_context=512, opening=[])
    ids = opening_ids(engine.encode_prompt)
    for text in ["x", "\n", "  indented", "1. a list", "日本語", "<|im_start|>"]:
        assert engine.encode_prompt([{"role": "user", "content": text}])[: len(ids)] == ids, text
    assert engine.tokenizer.decode(ids).startswith("system") or "assistant" in engine.tokenizer.decode(ids)
