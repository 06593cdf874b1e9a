"""Verifier: pure functions from target scores and a draft to the accepted prefix and next token."""
import numpy as np
import pytest
import torch

from specdecode.sampling import PositionNoise, SamplingParams
from specdecode.verify import Verdict, verify_greedy, verify_sampling


def one_hot_logits(choices, vocab=10):
    """Logits whose argmax in row i is choices[i]."""
    logits = torch.zeros(len(choices), vocab)
    for row, token in enumerate(choices):
        logits[row, token] = 5.0
    return logits


def test_verdict_tokens():
    assert Verdict(2, 9).tokens([4, 5, 6]) == [4, 5, 9]
    assert Verdict(0, 9).tokens([4, 5, 6]) == [9]
    assert Verdict(0, 9).tokens([]) == [9]


def test_greedy_all_accepted_gives_bonus_token():
    verdict = verify_greedy(one_hot_logits([1, 2, 3, 7]), [1, 2, 3])
    assert verdict == Verdict(3, 7)
    assert verdict.tokens([1, 2, 3]) == [1, 2, 3, 7]


@pytest.mark.parametrize("mismatch", [0, 1, 2])
def test_greedy_stops_at_first_mismatch_with_target_correction(mismatch):
    target = [1, 2, 3, 7]
    draft = [1, 2, 3]
    draft[mismatch] = 9
    verdict = verify_greedy(one_hot_logits(target), draft)
    assert verdict == Verdict(mismatch, target[mismatch])


def test_greedy_later_matches_after_a_mismatch_do_not_count():
    assert verify_greedy(one_hot_logits([1, 2, 3, 4]), [0, 2, 3]) == Verdict(0, 1)


def test_greedy_empty_draft_is_plain_decoding():
    assert verify_greedy(one_hot_logits([6]), []) == Verdict(0, 6)


PARAMS = SamplingParams(temperature=1.0)


def sample_rows(probs, draft, seed=0, position=0):
    return verify_sampling(probs.log(), draft, PARAMS, PositionNoise(seed), position)


def test_sampling_empty_draft_samples_from_first_row():
    probs = torch.zeros(1, 10)
    probs[0, 4] = 1.0
    assert sample_rows(probs, []) == Verdict(0, 4)


def test_sampling_a_draft_drawn_with_the_same_noise_from_the_same_distribution_is_always_accepted():
    p = torch.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(0)), -1)
    for seed in range(50):
        noise = PositionNoise(seed)
        draft = [noise.choose(p[i], 3 + i) for i in range(3)]
        assert sample_rows(p, draft, seed, position=3).accepted == 3


def test_sampling_never_emits_a_token_the_target_gives_zero_probability():
    p = torch.full((3, 10), 0.1)
    p[0] = 0.0
    p[0, 1:3] = 0.5  # row 0 allows only tokens 1 and 2
    for seed in range(200):
        verdict = sample_rows(p, [7, 7], seed)
        assert verdict.accepted == 0 and verdict.next_token in (1, 2)


def test_a_zero_probability_token_loses_even_against_the_smallest_noise(monkeypatch):
    """The race p / E: a token with p = 0 scores 0 whatever its draw, even E = +inf / a zero uniform."""
    p = torch.zeros(10)
    p[[2, 5]] = 0.5
    monkeypatch.setattr(PositionNoise, "exponentials", lambda self, position, ids: np.zeros(len(ids)) + 1e-300)
    assert PositionNoise(0).choose(p, 0) in (2, 5)


def test_sampling_point_mass_draft_accepted_when_target_is_certain():
    p = torch.zeros(4, 10)
    p[0, 3] = p[1, 5] = p[2, 8] = p[3, 0] = 1.0
    assert sample_rows(p, [3, 5, 8]) == Verdict(3, 0)


def test_sampling_point_mass_rejection_never_repeats_the_rejected_token():
    p = torch.zeros(2, 10)
    p[0, [2, 5]] = torch.tensor([0.5, 0.5])
    p[1, 0] = 1.0
    seen = set()
    for seed in range(100):
        verdict = sample_rows(p, [5], seed)
        assert verdict in (Verdict(1, 0), Verdict(0, 2))  # accepted with prob 1/2, else token 2
        seen.add(verdict)
    assert len(seen) == 2


def test_the_emitted_tokens_are_the_seeded_draws_whatever_the_draft():
    """Speculation changes nothing in the output: every emitted token is the target's own draw at its position."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5, 12), -1)
    for seed in range(30):
        noise = PositionNoise(seed)
        own = [noise.choose(p[i], 40 + i) for i in range(5)]
        for draft in ([], own[:1], own[:4], [1, 2, 3, 4], own[:2] + [(own[2] + 1) % 12]):
            verdict = sample_rows(p, draft, seed, position=40)
            emitted = verdict.tokens(draft)
            assert emitted == own[: len(emitted)]


def test_noise_depends_on_seed_position_and_token_only():
    noise = PositionNoise(7)
    ids = np.arange(50)
    first = noise.exponentials(3, ids)
    assert np.array_equal(first, PositionNoise(7).exponentials(3, ids))
    assert np.array_equal(first[[4, 9]], noise.exponentials(3, np.array([4, 9])))  # a subset draws the same values
    assert not np.array_equal(first, noise.exponentials(4, ids))
    assert not np.array_equal(first, PositionNoise(8).exponentials(3, ids))
    assert (first > 0).all()


def test_verify_does_not_modify_its_inputs():
    torch.manual_seed(1)
    logits = torch.randn(3, 8)
    before = logits.clone()
    for seed in range(20):
        verify_sampling(logits, [0, 1], PARAMS, PositionNoise(seed), 0)
    assert torch.equal(logits, before)
