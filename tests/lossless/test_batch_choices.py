"""n answers to one prompt (BatchEngine.submit_choices): the prompt is read once and its keys and values copied
into the other choices' caches; choice i samples with seed + i, so it equals the request alone with that seed
and plain decoding. Broken twins: a copy that leaves the last prompt row stale, and choices that all take the
request's own seed."""
import pytest

from specdecode.batch import BatchEngine
from specdecode.cache import KVCache
from specdecode.errors import InputError
from specdecode.sampling import MAX_SEED, SamplingParams

PROMPT = "Write a short poem about a lighthouse keeper and the sea."
OTHER = "List five fruits and their colours."


@pytest.fixture(scope="module")
def engine():
    """The real smollm2 on the int8 kernel (the default target's path)."""
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    return Engine(load_model(SMOLLM2, device="cpu", dtype="int8", max_context=512), max_context=512)


SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)


def choices_beside_another(engine, n, sampling, drafter="auto"):
    """n choices of PROMPT submitted after another request is running, so they share passes with it."""
    batch = BatchEngine(engine, max_batch=6, prefill_rows=16)
    other = batch.submit(OTHER, drafter="lookup", max_new_tokens=20, namespace="someone else")
    batch.step()
    tickets = batch.submit_choices(PROMPT, n, drafter=drafter, max_new_tokens=24, sampling=sampling, namespace=None)
    batch.run()
    return [t.result() for t in tickets], tickets, other.result()


def solo(engine, sampling, index):
    return engine.generate(PROMPT, drafter="none", max_new_tokens=24, sampling=sampling.for_choice(index))


@pytest.mark.parametrize("drafter", ["auto", "none"])
def test_each_seeded_choice_is_the_request_alone_with_seed_plus_its_index(engine, drafter):
    results, tickets, _ = choices_beside_another(engine, 4, SEEDED, drafter)
    for index, result in enumerate(results):
        assert solo(engine, SEEDED, index).token_ids == result.token_ids, f"choice {index}"
    assert len({tuple(r.token_ids) for r in results}) > 1  # sampling: the choices differ
    prompt_rows = len(engine.encode_prompt(PROMPT)) - 1
    assert [t.reused for t in tickets[1:]] == [prompt_rows] * 3  # the prompt was read once, then copied


def test_greedy_choices_are_all_the_plain_answer(engine):
    results, _, other = choices_beside_another(engine, 3, SamplingParams())
    expected = solo(engine, SamplingParams(), 0).token_ids
    assert all(r.token_ids == expected for r in results)
    assert other.token_ids == engine.generate(OTHER, drafter="none", max_new_tokens=20).token_ids


def test_the_check_catches_a_copy_that_leaves_a_prompt_row_stale(engine, monkeypatch):
    """Broken twin: the copy takes all but the last prompt row (which keeps what the cache held: zeros)."""
    real = KVCache.copy_prefix

    def short_copy(self, source, end):
        real(self, source, end - 1)
        self.length = end

    monkeypatch.setattr(KVCache, "copy_prefix", short_copy)
    results, _, _ = choices_beside_another(engine, 3, SamplingParams())
    expected = solo(engine, SamplingParams(), 0).token_ids
    assert any(r.token_ids != expected for r in results[1:])


def test_the_check_catches_choices_that_share_one_seed(engine, monkeypatch):
    """Broken twin: every choice samples with the request's own seed (the choices are then all choice 0)."""
    monkeypatch.setattr(SamplingParams, "for_choice", lambda self, index: self)
    results, _, _ = choices_beside_another(engine, 3, SEEDED, "none")
    monkeypatch.undo()
    assert any(solo(engine, SEEDED, i).token_ids != r.token_ids for i, r in enumerate(results))


def test_choice_seeds_and_bad_n(engine):
    assert SEEDED.for_choice(0) is SEEDED and SEEDED.for_choice(3).seed == 14
    assert SamplingParams(temperature=1.0, seed=MAX_SEED).for_choice(1).seed == 0  # wraps within the seed range
    assert SamplingParams(temperature=1.0).for_choice(2).seed is None  # no seed: each choice its own randomness
    batch = BatchEngine(engine, max_batch=4)
    for bad in (0, 5, True, 2.0):
        with pytest.raises(InputError, match="n must be"):
            batch.submit_choices(PROMPT, bad)
    assert not batch.waiting
