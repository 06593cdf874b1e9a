"""launch_ahead on the GPU path (the interpreter on a CPU): plain requests, greedy or seeded, whose next pass is
launched from the device's tokens (argmaxes, seeded draws) before the pass before it is read get their solo output,
batched (BatchEngine) or alone (Engine), whatever ends them (budget, EOS, a stop string, a cancel, a full context)
and whoever joins or leaves the batch meanwhile. Twins that feed a pass launched ahead another request's argmaxes,
the next token + 1, or draws raced one position late must change an output."""
from __future__ import annotations

import functools

import torch

from specdecode import accept
from specdecode.batch import BatchEngine
from specdecode.engine import Engine
from specdecode.sampling import SamplingParams, choose_rows
from gpu_models import CONTEXT, tiny_target_and_draft
from testlib import as_loaded, fake_tokenizer

PROMPTS = [[17, 3, 99, 250, 3, 17, 42, 8], [5, 6, 7, 5, 6, 7, 5], [200, 5, 17, 3, 11], [42, 42, 9, 1, 250, 77]]
NEW_TOKENS = 6
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)


@functools.lru_cache(maxsize=None)
def engine(eos: tuple = ()) -> Engine:
    target, draft = models()
    tokenizer = fake_tokenizer(target.config.vocab_size, eos_ids=eos)
    return Engine(as_loaded(target, tokenizer, "target"), as_loaded(draft, tokenizer, "draft"), max_context=CONTEXT)


@functools.lru_cache(maxsize=None)
def models():
    return tiny_target_and_draft()


@functools.lru_cache(maxsize=None)
def eos() -> tuple:
    """An EOS that ends the second prompt's answer after its third token (the engine without it decides)."""
    return (engine().generate(PROMPTS[1], drafter="none", max_new_tokens=4).token_ids[3],)


@functools.lru_cache(maxsize=None)
def solo(prompt: int, stop: tuple = (), max_new_tokens: int = NEW_TOKENS, sampled: bool = False) -> list[int]:
    return engine(eos()).generate(PROMPTS[prompt], drafter="none", max_new_tokens=max_new_tokens, stop=list(stop),
                                  sampling=SEEDED if sampled else SamplingParams()).token_ids


def test_plain_requests_launched_ahead_get_their_solo_output():
    """Four requests ending at different passes: a stop string, an EOS, budgets of 1 and 6 tokens (seeded
    sampling); each step's event handed out during the next pass (overlap), as on a GPU."""
    answer = solo(0)
    cut = next(i for i in range(2, NEW_TOKENS) if answer[i] not in answer[:i])
    stop = (f"<t{answer[cut]}>",)  # (token i's text is <ti>): ends the first answer before its token `cut`
    settings = [dict(stop=stop), dict(), dict(max_new_tokens=1), dict(sampled=True)]
    expected = [solo(i, **s) for i, s in enumerate(settings)]
    assert [len(e) for e in expected] == [cut, 3, 1, NEW_TOKENS]
    batch = BatchEngine(engine(eos()), max_batch=4, overlap=True, launch_ahead=True)
    tickets = [batch.submit(p, drafter="none", max_new_tokens=s.get("max_new_tokens", NEW_TOKENS), stop=s.get("stop"),
                            sampling=SEEDED if s.get("sampled") else SamplingParams()) for p, s in zip(PROMPTS, settings)]
    batch.run()
    assert [t.result().token_ids for t in tickets] == expected
    assert [t.result().stats.finish_reason for t in tickets] == ["stop", "stop", "length", "length"]
    assert batch.passes_ahead == NEW_TOKENS - 1  # each pass after the first went ahead (a row was still wanted)


def test_requests_joining_leaving_and_drafting_beside_passes_launched_ahead():
    """Two requests go ahead; a third arrives (the batch stops going ahead to admit it) with a drafting one (no
    pass goes ahead while it runs), one is cancelled mid-answer; the plain ones go ahead again once alone."""
    batch = BatchEngine(engine(eos()), max_batch=4, prefill_rows=8, launch_ahead=True)
    first = [batch.submit(PROMPTS[i], drafter="none", max_new_tokens=NEW_TOKENS) for i in (0, 3)]
    batch.step()
    batch.step()
    assert batch.passes_ahead > 0
    late = batch.submit(PROMPTS[2], drafter="none", max_new_tokens=NEW_TOKENS)
    drafting = batch.submit(PROMPTS[1], drafter="draft", k=2, max_new_tokens=2)
    batch.step()
    batch.step()
    batch.cancel(first[1])
    before = batch.passes_ahead
    batch.run()
    assert batch.passes_ahead > before  # ahead again once the drafting request ended
    assert first[0].result().token_ids == solo(0)
    assert late.result().token_ids == solo(2)
    assert drafting.result().token_ids == solo(1, max_new_tokens=2)
    cancelled = first[1].result()
    assert cancelled.stats.finish_reason == "cancelled"
    assert cancelled.token_ids == solo(3)[: len(cancelled.token_ids)]


def test_the_check_catches_a_pass_launched_ahead_with_another_requests_tokens(monkeypatch):
    model = engine(eos()).target.model
    steps = model.steps_from_device
    monkeypatch.setattr(model, "steps_from_device", lambda caches, tokens: steps(caches, torch.roll(tokens, 1)))
    batch = BatchEngine(engine(eos()), max_batch=2, launch_ahead=True)
    got = [r.token_ids for r in batch.generate_many([PROMPTS[0], PROMPTS[3]], drafter="none", max_new_tokens=3)]
    assert got != [solo(0)[:3], solo(3)[:3]]


def ahead_engine(eos: tuple = ()) -> Engine:
    """engine(eos)'s models and tokenizer, one request at a time with launch_ahead, checking its caches each step."""
    base = engine(eos)
    return Engine(base.target, base.draft, max_context=CONTEXT, check_invariants=True, launch_ahead=True)


def test_one_request_launched_ahead_gets_plain_decodings_tokens():
    """Engine alone: an EOS, a budget of one token, and a prompt that fills the context (the answer ends at its
    end); then a drafting request on the same engine, which steps as usual."""
    eng = ahead_engine(eos())
    assert eng.generate(PROMPTS[1], drafter="none", max_new_tokens=NEW_TOKENS).token_ids == solo(1)  # its EOS
    assert eng.generate(PROMPTS[3], drafter="none", max_new_tokens=1).token_ids == solo(3, max_new_tokens=1)
    assert eng.generate(PROMPTS[3], drafter="none", max_new_tokens=NEW_TOKENS, sampling=SEEDED).token_ids \
        == solo(3, sampled=True)
    assert eng.generate(PROMPTS[1], drafter="draft", k=2, max_new_tokens=2).token_ids == solo(1, max_new_tokens=2)
    short = [Engine(engine().target, max_context=16, check_invariants=True, launch_ahead=on) for on in (False, True)]
    plain, ahead = [e.generate((PROMPTS[3] * 3)[:13], drafter="none", max_new_tokens=NEW_TOKENS) for e in short]
    assert ahead.token_ids == plain.token_ids and ahead.stats.finish_reason == plain.stats.finish_reason == "length"
    assert len(plain.token_ids) < NEW_TOKENS  # the context ended it


def test_the_check_catches_one_request_launched_ahead_with_a_wrong_token(monkeypatch):
    eng = ahead_engine(eos())
    steps = eng.target.model.steps_from_device
    monkeypatch.setattr(eng.target.model, "steps_from_device", lambda caches, tokens: steps(caches, tokens + 1))
    assert eng.generate(PROMPTS[3], drafter="none", max_new_tokens=3).token_ids != solo(3)[:3]


def test_the_check_catches_draws_launched_ahead_one_position_late(monkeypatch):
    late = lambda probs, positions, noises, **kw: choose_rows(probs, [p + 1 for p in positions], noises, **kw)
    monkeypatch.setattr(accept, "choose_rows", late)  # where the draws race (accept.seeded_draws)
    got = ahead_engine(eos()).generate(PROMPTS[3], drafter="none", max_new_tokens=NEW_TOKENS, sampling=SEEDED)
    assert got.token_ids != solo(3, sampled=True)
