"""Sampling parameters, logit processing (temperature, top-k, top-p) and seeded sampling."""
import math

import numpy as np
import pytest
import torch

from specdecode.engine import Engine
from specdecode.errors import InputError
from specdecode import sampling
from specdecode.sampling import PositionNoise, SamplingParams, neg_log, nucleus_floor, probabilities, token_words
from testlib import as_loaded, make_tiny_model


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(temperature=-1e-9),
        dict(temperature=math.nan),
        dict(temperature="0.7"),
        dict(temperature=None),
        dict(top_p=0.0),
        dict(top_p=-0.5),
        dict(top_p=1.0001),
        dict(top_p=math.nan),
        dict(top_k=-1),
        dict(top_k=1.5),
        dict(top_k=True),
        dict(seed="42"),
        dict(seed=True),
        dict(seed=1.0),
        dict(seed=-1),
        dict(seed=2**63),
        dict(seed=2**64 + 5),
    ],
)
def test_invalid_sampling_values_raise_input_error(kwargs):
    with pytest.raises(InputError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(temperature=0.7, top_k=40, top_p=0.95, seed=0), dict(temperature=2, top_p=1), dict(top_p=1e-6), dict(top_k=0),
     dict(temperature=1, seed=2**63 - 1)],
)
def test_valid_sampling_values(kwargs):
    params = SamplingParams(**kwargs)
    assert params.greedy == (params.temperature == 0)


def test_defaults_are_greedy():
    assert SamplingParams().greedy


def rand_logits(rows=3, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_temperature_scales_logits_before_softmax():
    logits = rand_logits()
    for t in (0.3, 1.0, 2.5):
        probs = probabilities(logits, SamplingParams(temperature=t))
        torch.testing.assert_close(probs, torch.softmax(logits / t, -1))
        torch.testing.assert_close(probs.sum(-1), torch.ones(3))


@pytest.mark.parametrize("temperature", [1e-40, 1e-46, 4e-244, 5e-324])
def test_a_temperature_past_float32s_range_is_greedy_not_nan(temperature):
    """Below float32's smallest normal the temperature became 0 in the division: the top token's 0 / 0 was NaN, the
    row had no mass, and sampling raised on the engine thread (a server's whole pass failed: every request a 500)."""
    logits = rand_logits()
    probs = probabilities(logits, SamplingParams(temperature=temperature))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float())


@pytest.mark.parametrize("k", [1, 3, 10, 49])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = rand_logits()
    probs = probabilities(logits, SamplingParams(temperature=0.8, top_k=k))
    for row in range(3):
        kept = set(torch.nonzero(probs[row]).flatten().tolist())
        assert kept == set(torch.topk(logits[row], k).indices.tolist())
        expected = torch.softmax(logits[row, sorted(kept)] / 0.8, -1)
        torch.testing.assert_close(probs[row, sorted(kept)], expected)


def test_top_k_at_least_vocab_is_a_no_op():
    logits = rand_logits()
    plain = probabilities(logits, SamplingParams(temperature=1.0))
    for k in (50, 51, 1000):
        torch.testing.assert_close(probabilities(logits, SamplingParams(temperature=1.0, top_k=k)), plain)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p):
    logits = rand_logits(rows=4, vocab=30, seed=2)
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=top_p))
    full = torch.softmax(logits, -1)
    for row in range(4):
        order = torch.argsort(full[row], descending=True).tolist()
        cumulative, expected = 0.0, []
        for token in order:  # nucleus: tokens until the mass reaches top_p (the one crossing it included)
            expected.append(token)
            cumulative += float(full[row, token])
            if cumulative >= top_p:
                break
        kept = torch.nonzero(probs[row]).flatten().tolist()
        assert set(kept) == set(expected)
        torch.testing.assert_close(probs[row, expected], full[row, expected] / full[row, expected].sum())


@pytest.mark.parametrize("top_p", [1e-6, 0.3, 0.9, 0.95, 0.999, 0.9999999])
def test_the_nucleus_found_in_a_partial_ranking_is_the_full_sorts(top_p, monkeypatch):
    """On the host the nucleus is looked for in the top 64, then 1024 ranks before the whole vocabulary is sorted;
    each row's floor must be the bits the full sort gives, whatever the other rows of the call need: here rows from
    a one-token peak to nearly uniform over 151,936 tokens (Qwen's vocabulary), in one call and one at a time."""
    generator = torch.Generator().manual_seed(5)
    scales = torch.tensor([[40.0], [6.0], [3.0], [1.0], [0.05]])
    probs = (torch.randn(5, 151936, generator=generator) * scales).softmax(-1)
    together = nucleus_floor(probs, top_p)
    alone = torch.cat([nucleus_floor(probs[row : row + 1], top_p) for row in range(5)])
    monkeypatch.setattr(sampling, "NUCLEUS_HEADS", ())
    full = nucleus_floor(probs, top_p)
    assert torch.equal(together, full) and torch.equal(alone, full)


def test_equal_probabilities_at_the_nucleus_edge_are_kept_together():
    """Tokens 3, 7 and 9 tie for second place; the nucleus reaches top_p at the first of them in any order, so all
    three stay (a sort orders ties as it likes: keeping one of them would make the kept set depend on it)."""
    logits = torch.full((1, 12), -30.0)
    logits[0, 5], logits[0, [3, 7, 9]] = 2.0, 1.0
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert sorted(torch.nonzero(probs[0]).flatten().tolist()) == [3, 5, 7, 9]


def test_tiny_top_p_is_argmax_and_top_p_one_is_a_no_op():
    logits = rand_logits()
    near_greedy = probabilities(logits, SamplingParams(temperature=1.0, top_p=1e-6))
    assert torch.equal(near_greedy.argmax(-1), logits.argmax(-1))
    assert torch.equal((near_greedy > 0).sum(-1), torch.ones(3, dtype=torch.long))
    torch.testing.assert_close(probabilities(logits, SamplingParams(temperature=1.0, top_p=1.0)), torch.softmax(logits, -1))


def test_top_k_then_top_p_combined():
    logits = rand_logits(rows=1, vocab=20, seed=3)
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=5, top_p=0.6))[0]
    top5 = torch.topk(logits[0], 5).indices
    renorm = torch.softmax(logits[0, top5], -1)  # top-p acts on the top-k distribution
    cumulative, expected = 0.0, []
    for index in torch.argsort(renorm, descending=True).tolist():
        expected.append(int(top5[index]))
        cumulative += float(renorm[index])
        if cumulative >= 0.6:
            break
    assert set(torch.nonzero(probs).flatten().tolist()) == set(expected)


def test_choose_is_reproducible_for_a_seed_and_position():
    probs = torch.softmax(rand_logits(rows=1)[0] / 6, -1)  # a flat distribution
    draws = [SamplingParams(temperature=1, seed=s).noise().choose(probs, 5) for s in range(20)]
    again = [SamplingParams(temperature=1, seed=s).noise().choose(probs, 5) for s in range(20)]
    assert draws == again
    assert len(set(draws)) > 1
    noise = SamplingParams(temperature=1, seed=7).noise()
    assert len({noise.choose(probs, position) for position in range(30)}) > 1  # positions draw independently
    assert SamplingParams(temperature=1).noise().seed != SamplingParams(temperature=1).noise().seed  # no seed: fresh


GOLDEN = 0x9E3779B97F4A7C15


def test_related_seeds_do_not_share_draws_at_other_positions():
    """Seeds that differ by a multiple of the golden constant once shared their noise shifted by whole
    positions (seed + c * position was the key): seed 2c mod 2**64 drew seed 0's values two positions later."""
    shifted = 2 * GOLDEN % 2**64
    assert shifted == 4354685564936845354
    ids = np.arange(512)
    for position in range(4):
        assert not np.array_equal(PositionNoise(shifted).exponentials(position, ids),
                                  PositionNoise(0).exponentials(position + 2, ids))
    # No value repeats across a family of related seeds (multiples of the constant, neighbours, single bits)
    # and positions; independent 53-bit draws collide by chance with probability ~1e-9 here.
    seeds = {m * GOLDEN % 2**64 for m in range(8)} | {1, 2, 3, 2**62, 2**32, 12345, 12346}
    seeds = sorted(seed for seed in seeds if seed < 2**63)
    draws = np.concatenate([PositionNoise(seed).exponentials(position, ids) for seed in seeds for position in range(10)])
    assert np.unique(draws).size == draws.size


def test_noise_is_exponential_and_independent_across_positions_and_seeds():
    ids = np.arange(20_000)
    first, next_position, next_seed = (PositionNoise(seed).exponentials(position, ids)
                                       for seed, position in ((5, 100), (5, 101), (6, 100)))
    for draws in (first, next_position, next_seed):
        assert abs(draws.mean() - 1) < 0.03 and abs(draws.var() - 1) < 0.08  # Exp(1): mean 1, variance 1
        assert abs((draws > 1).mean() - math.exp(-1)) < 0.015
    for other in (next_position, next_seed):
        assert abs(np.corrcoef(first, other)[0, 1]) < 0.03


def test_choose_never_draws_a_zero_probability_token():
    probs = torch.zeros(10)
    probs[[2, 7]] = torch.tensor([0.25, 0.75])
    noise = SamplingParams(temperature=1, seed=0).noise()
    assert {noise.choose(probs, position) for position in range(200)} == {2, 7}


@pytest.mark.parametrize("drafter", ["none", "draft", "lookup"])
def test_seed_reproducibility_through_the_engine(drafter):
    target = make_tiny_model(seed=20, vocab_size=64)
    draft = make_tiny_model(seed=21, vocab_size=64)
    engine = Engine(as_loaded(target), as_loaded(draft), max_context=128, check_invariants=True)
    prompt = [1, 2, 3, 4, 1, 2, 3]

    def run(seed):
        sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, seed=seed)
        return engine.generate(prompt, drafter=drafter, k=3, sampling=sampling, max_new_tokens=20).token_ids

    first = run(123)
    assert len(first) == 20
    assert run(123) == first  # same seed, same engine (warm caches): same tokens
    fresh = Engine(as_loaded(target), as_loaded(draft), max_context=128, check_invariants=True)
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, seed=123)
    assert fresh.generate(prompt, drafter=drafter, k=3, sampling=sampling, max_new_tokens=20).token_ids == first
    assert any(run(seed) != first for seed in (1, 2, 3))


def test_a_seeded_generation_is_the_same_text_whatever_k_drafter_or_history():
    """The randomness is a function of (seed, position): plain decoding, any drafter, fixed or adaptive
    K, and an engine that served other requests first all give the seeded plain output, token for token."""
    target = make_tiny_model(seed=20, vocab_size=64)
    draft = make_tiny_model(seed=21, vocab_size=64)
    prompt = [1, 2, 3, 4, 1, 2, 3]
    sampling = SamplingParams(temperature=0.8, top_k=30, top_p=0.95, seed=99)
    fresh = Engine(as_loaded(target), as_loaded(draft), max_context=128, check_invariants=True)
    plain = fresh.generate(prompt, drafter="none", sampling=sampling, max_new_tokens=24).token_ids
    busy = Engine(as_loaded(target), as_loaded(draft), max_context=128, check_invariants=True)
    for other in range(3):  # other requests first: learned costs, calibrations and caches differ
        busy.generate([5, 6, 7, other], drafter="draft", sampling=SamplingParams(temperature=1.0), max_new_tokens=10)
    for drafter in ("draft", "lookup"):
        for k in (1, 3, 8, "auto"):
            for engine in (fresh, busy):
                got = engine.generate(prompt, drafter=drafter, k=k, sampling=sampling, max_new_tokens=24).token_ids
                assert got == plain, (drafter, k)


@pytest.mark.parametrize("temperature", [1e-40, 1e-12, 1e308])
def test_extreme_temperatures_give_a_distribution_not_nan(temperature):
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0 - 1e-6]])
    probs = probabilities(logits, SamplingParams(temperature=temperature))
    assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1.0) < 1e-5
    if temperature < 1:
        assert int(probs.argmax()) == 1 and float(probs[0, 1]) > 0.5


@pytest.mark.slow
def test_a_seeded_generation_on_the_real_int8_model_is_the_same_text_after_the_store_learned_it():
    """The real smollm2 on the int8 kernel: seeded plain decoding, then suffix and auto with K 1, 3, 8 and auto,
    fresh and after the same client's earlier requests filled the store (with this very answer among them, so
    the copies are long): the same tokens every time."""
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    engine = Engine(load_model(SMOLLM2, device="cpu", dtype="int8", max_context=512), max_context=512)
    assert engine.target.model.int8
    prompt = "Write three short sentences about rivers, then repeat them."
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    plain = engine.generate(prompt, drafter="none", sampling=sampling, max_new_tokens=40).token_ids
    for round_ in ("fresh", "after the store"):
        for drafter in ("suffix", "auto", "lookup"):
            for k in (1, 3, 8, "auto"):
                got = engine.generate(prompt, drafter=drafter, k=k, sampling=sampling, max_new_tokens=40,
                                      namespace="client").token_ids
                assert got == plain, (round_, drafter, k)
        assert len(engine.suffix_store) > 0


def test_neg_log_is_within_an_ulp_of_numpys_log():
    """The noise's -log (written in correctly rounded operations so the device can draw the same bits) stays within
    one ulp of np.log's over PositionNoise's uniforms, both ends of their range, and where its reduction switches
    (powers of two, sqrt(1/2) * 2**e): the draws are Exp(1) to ~1e-16."""
    k = np.random.default_rng(0).integers(0, 2**53, 200_000, dtype=np.uint64)
    ends = np.concatenate([np.arange(64, dtype=np.uint64), np.uint64(2**53) - np.arange(1, 64, dtype=np.uint64)])
    u = (np.concatenate([k, ends]).astype(np.float64) + 0.5) * 2.0**-53
    root = np.sqrt(0.5) * 2.0 ** -np.arange(54.0)
    u = np.concatenate([u, 2.0 ** -np.arange(55.0), np.nextafter(root, 0), root, np.nextafter(root, 1)])
    reference = -np.log(u)
    assert np.all(np.abs(neg_log(u) - reference) <= np.spacing(reference))
    one = neg_log(np.array([1.0]))[0]
    assert one == 0.0 and not np.signbit(one)  # u = 1 (a rounding of the top k) races p / +0 = inf, never -inf


def test_the_hosts_race_is_the_exact_race_at_a_near_tie():
    """PositionNoise.race races with NumPy's log first (neg_log costs ~50x more over a vocabulary) and re-races the
    tokens near the leader exactly: on a row built so that the two logs pick different tokens, the exact race's
    token wins; a race with NumPy's log alone (the twin) picks the other."""
    from testlib import near_tie

    noise, position, ids = PositionNoise(11), 5, np.arange(64)
    uniform = noise._uniforms(position, ids)
    exact, fast = noise.exponentials(position, ids), 0.0 - np.log(uniform)
    found = near_tie(exact, fast)
    assert found is not None
    tokens, p = found
    row = np.zeros(64, dtype=np.float32)
    row[tokens] = p
    support = np.flatnonzero(row > 0)
    wanted = int(support[np.argmax(row[support] / exact[support])])
    assert noise.race(row, position) == wanted
    assert int(support[np.argmax(row[support] / fast[support])]) != wanted


@pytest.mark.parametrize("kept", ["all", "some"])
def test_the_race_with_hashed_token_words_is_the_definitions_race(kept):
    """The race reads the tokens' half of each draw's hash from a table built once per vocabulary (token_words) and
    hashes in place; its winners must be those of the draws' definition, argmax p / exponentials(position, ids),
    over a whole Qwen-size row and over a row with most tokens cut (top-p's support), at 300 positions."""
    generator = torch.Generator().manual_seed(8)
    p = torch.softmax(torch.randn(151936, generator=generator) * 2, -1).numpy()
    if kept == "some":
        p[p < 2e-6] = 0
    noise, support = PositionNoise(2**40 + 3), np.flatnonzero(p > 0)
    assert np.array_equal(noise._uniforms(7, support, token_words(p.size)[support]), noise._uniforms(7, support))
    for position in range(300):
        wanted = int(support[np.argmax(p[support] / noise.exponentials(position, support))])
        assert noise.race(p, position) == wanted
