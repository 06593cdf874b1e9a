"""Verifier: pure functions from target scores and a draft to the accepted prefix and next token."""
import pytest
import torch

from specdecode.sampling import SamplingParams
from specdecode.verify import Verdict, _residual, verify_greedy, verify_sampling


def one_hot_logits(choices, vocab=10):
    """Logits whose argmax in row i is choices[i]."""
    logits = torch.zeros(len(choices), vocab)
    for row, token in enumerate(choices):
        logits[row, token] = 5.0
    return logits


def gen(seed=0):
    return SamplingParams(temperature=1.0, seed=seed).generator()


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


def test_sampling_empty_draft_samples_from_first_row():
    probs = torch.zeros(1, 10)
    probs[0, 4] = 1.0
    assert verify_sampling(probs, [], None, gen()) == Verdict(0, 4)


def test_sampling_identical_p_and_q_always_accepts():
    p = torch.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(0)), -1)
    for seed in range(50):
        draft = [int(torch.multinomial(p[i], 1, generator=gen(seed + 100))) for i in range(3)]
        assert verify_sampling(p, draft, p[:3].clone(), gen(seed)).accepted == 3


def test_sampling_rejects_a_token_the_target_gives_zero_probability():
    p = torch.full((3, 10), 0.1)
    p[0] = 0.0
    p[0, 1:3] = 0.5  # row 0 allows only tokens 1 and 2
    q = torch.full((2, 10), 0.1)
    for seed in range(50):
        verdict = verify_sampling(p, [7, 7], q, gen(seed))
        assert verdict.accepted == 0 and verdict.next_token in (1, 2)


def test_sampling_point_mass_draft_accepted_when_target_is_certain():
    p = torch.zeros(4, 10)
    p[0, 3] = p[1, 5] = p[2, 8] = p[3, 0] = 1.0
    assert verify_sampling(p, [3, 5, 8], None, gen()) == Verdict(3, 0)


def test_sampling_point_mass_rejection_never_resamples_the_rejected_token():
    p = torch.zeros(2, 10)
    p[0, [2, 5]] = torch.tensor([0.5, 0.5])
    p[1, 0] = 1.0
    for seed in range(100):
        verdict = verify_sampling(p, [5], None, gen(seed))
        assert verdict in (Verdict(1, 0), Verdict(0, 2))  # accepted with prob 1/2, else token 2


def test_residual_is_normalised_positive_part_of_p_minus_q():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1]])
    residual = _residual(p, q, 0, 1)
    torch.testing.assert_close(residual, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    point = _residual(p, None, 0, 0)
    torch.testing.assert_close(point, torch.tensor([0.0, 0.6, 0.4, 0.0]))


def test_sampling_is_reproducible_for_a_seed():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5, 12), -1)
    q = torch.softmax(torch.randn(4, 12), -1)
    draft = [1, 2, 3, 4]
    first = [verify_sampling(p, draft, q, gen(s)) for s in range(30)]
    assert first == [verify_sampling(p, draft, q, gen(s)) for s in range(30)]
    assert len({v.accepted for v in first}) > 1


def test_verify_does_not_modify_its_inputs():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(3, 8), -1)
    q = torch.softmax(torch.randn(2, 8), -1)
    p0, q0 = p.clone(), q.clone()
    for seed in range(20):
        verify_sampling(p, [0, 1], q, gen(seed))
        verify_sampling(p, [0, 1], None, gen(seed))
    assert torch.equal(p, p0) and torch.equal(q, q0)
