"""accept.py: a batched pass's greedy verdicts computed together equal verify_greedy's on each request's rows alone,
on random passes (drafts accepted whole, rejected at the first token or later, empty drafts among others, rows of
other requests between the blocks); the logits' blocks as one tensor without a copy where they are views of one.
The broken twins (one token accepted too many; the next token from the wrong row) must fail the same check.
tests/gpu/test_accept_kernel.py checks the Triton kernel against the same cases."""
from __future__ import annotations

import pytest
import torch

from specdecode import accept
from specdecode.verify import Verdict, verify_greedy
from testlib import random_pass


def expected(logits, firsts, drafts) -> list[Verdict]:
    return [verify_greedy(logits[first : first + len(draft) + 1], draft) for first, draft in zip(firsts, drafts)]


def check_verdicts(judge, seeds=range(40)) -> None:
    """judge(logits, firsts, drafts) -> verdicts; equal to verify_greedy's per request on every case."""
    kinds = set()
    for seed in seeds:
        logits, firsts, drafts = random_pass(seed)
        want = expected(logits, firsts, drafts)
        assert judge(logits, firsts, drafts) == want, f"seed {seed}"
        kinds |= {"empty" if not d else "whole" if v.accepted == len(d) else "first" if v.accepted == 0 else "later"
                  for d, v in zip(drafts, want)}
    assert kinds == {"empty", "whole", "first", "later"}  # every kind of verdict was checked


def torch_judge(logits, firsts, drafts):
    return accept.greedy_verdicts(logits, firsts, drafts, method="torch")[0]


def test_verdicts_together_are_each_requests_verdict_alone():
    check_verdicts(torch_judge)


def test_the_argmaxes_come_with_the_verdicts_in_the_same_read():
    logits, firsts, drafts = random_pass(3)
    verdicts, argmaxes = accept.greedy_verdicts(logits, firsts, drafts, argmaxes=True, method="torch")
    assert verdicts == expected(logits, firsts, drafts)
    assert argmaxes == logits.argmax(dim=-1).tolist()
    assert accept.greedy_verdicts(logits, [], [], argmaxes=True) == ([], argmaxes)  # trees only: no verdicts


def off_by_one(verdicts):
    """Broken twin: a rejected draft token accepted too (the next token then taken from the row after it)."""
    def broken(choice, meta, requests):
        judged = verdicts(choice, meta, requests)
        counts = meta[requests : 2 * requests]
        accepted = torch.minimum(judged[0] + 1, counts - 1)
        return torch.stack([accepted, choice[meta[:requests] + accepted]])
    return broken


def next_from_the_first_row(verdicts):
    """Broken twin: the next token taken from the block's first row, whatever was accepted."""
    def broken(choice, meta, requests):
        judged = verdicts(choice, meta, requests)
        return torch.stack([judged[0], choice[meta[:requests]]])
    return broken


@pytest.mark.parametrize("twin", [off_by_one, next_from_the_first_row])
def test_the_check_catches_a_broken_twin(twin, monkeypatch):
    monkeypatch.setattr(accept, "verdicts_torch", twin(accept.verdicts_torch))
    with pytest.raises(AssertionError):
        check_verdicts(torch_judge)


def test_views_of_one_pass_are_one_tensor_without_a_copy():
    logits = torch.randn(12, 7)
    rows, firsts = accept.one_tensor([logits[1:3], logits[5:9], logits[9:10]])
    assert rows.data_ptr() == logits[1:].data_ptr() and firsts == [0, 4, 8] and torch.equal(rows, logits[1:10])
    padded = torch.randn(12, 9)[:, :7]  # a padded vocabulary's view: rows 9 apart
    rows, firsts = accept.one_tensor([padded[4:6], padded[0:2]])
    assert firsts == [4, 0] and torch.equal(rows, padded[:6])
    apart = [logits[0:2], logits[3:5].clone()]  # not one array: concatenated
    rows, firsts = accept.one_tensor(apart)
    assert firsts == [0, 2] and torch.equal(rows, torch.cat(apart))
