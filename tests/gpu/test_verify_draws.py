"""A sampled verify block's draws raced together on the device (verify.draws_together, the Triton race of
gpu/noise_kernel.py in the interpreter here) give the verdict of the host's row-by-row verify_sampling: the same
accepted count and next token on random blocks whose drafts are partly the target's own draws. A twin that races
each row one position late must give another verdict somewhere."""
from __future__ import annotations

import pytest
import torch

from specdecode.sampling import PositionNoise, SamplingParams, probabilities
from specdecode.verify import draws_together, verify_sampling

SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
            SamplingParams(temperature=1.3, top_k=20, min_p=0.02)]


def blocks(count: int = 24, vocab: int = 300):
    """(logits [K+1, V], draft, params, noise, position): drafts copy the host's draws up to a random point."""
    generator = torch.Generator().manual_seed(5)
    for case in range(count):
        k = case % 6
        logits = torch.randn(k + 1, vocab, generator=generator) * 3
        params, noise, position = SETTINGS[case % len(SETTINGS)], PositionNoise(case * 7919), 17 + case * 1000
        draws = [noise.choose(probabilities(logits[i : i + 1], params)[0], position + i) for i in range(k + 1)]
        keep = int(torch.randint(0, k + 1, (1,), generator=generator))
        draft = draws[:keep] + [(t + 1) % vocab for t in draws[keep:k]]
        yield logits, draft, params, noise, position


def test_draws_together_give_the_row_by_row_verdict():
    accepted = []
    for logits, draft, params, noise, position in blocks():
        host = verify_sampling(logits, draft, params, noise, position, device_kernel=False)
        assert draws_together(logits, draft, params, noise, position) == host
        accepted.append(host.accepted)
    assert max(accepted) >= 3 and min(accepted) == 0  # whole drafts, and first tokens refused, are both checked


def test_the_check_catches_draws_one_position_late():
    verdicts = [(draws_together(logits, draft, params, noise, position + 1),
                 verify_sampling(logits, draft, params, noise, position, device_kernel=False))
                for logits, draft, params, noise, position in blocks()]
    assert any(late != host for late, host in verdicts)


def test_a_row_without_mass_fails_where_verify_sampling_reaches_it():
    logits = torch.randn(3, 50)
    logits[1] = float("nan")
    params, noise = SamplingParams(temperature=1.0), PositionNoise(3)
    first = noise.choose(probabilities(logits[:1], params)[0], 10)
    refused = [(first + 1) % 50, 0]  # the first draw refuses the draft: row 1 is never reached
    assert draws_together(logits, refused, params, noise, 10) == verify_sampling(logits, refused, params, noise, 10)
    with pytest.raises(ValueError, match="no mass"):
        draws_together(logits, [first, 0], params, noise, 10)
