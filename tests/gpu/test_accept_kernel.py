"""The Triton kernel of accept.py (gpu/accept_kernel.py, the interpreter on a CPU) gives every request of a pass the
verdict the torch reference gives and verify_greedy gives on its rows alone, on tests/test_accept.py's random
passes and on blocks longer than its smallest block of rows; a kernel one token off is caught by the same check."""
from __future__ import annotations

import pytest
import torch

from specdecode import accept
from specdecode.gpu import accept_kernel
from test_accept import check_verdicts, expected, off_by_one


def triton_judge(logits, firsts, drafts):
    return accept.greedy_verdicts(logits, firsts, drafts, method="triton")[0]


def test_the_kernel_gives_each_requests_verdict_alone():
    check_verdicts(triton_judge, seeds=range(12))


def test_the_kernel_equals_the_torch_reference_on_long_blocks():
    """Blocks of 1..40 rows (the kernel's block of rows grows past MIN_BLOCK), rejected anywhere or accepted whole."""
    gen = torch.Generator().manual_seed(7)
    lengths = [0, 15, 16, 3, 39, 31]  # the odd ones rejected halfway
    logits = torch.randn(sum(lengths) + len(lengths), 11, generator=gen)
    choice, firsts, drafts, at = logits.argmax(dim=-1).tolist(), [], [], 0
    for index, length in enumerate(lengths):
        draft = choice[at : at + length]
        if index % 2 and length:
            draft[length // 2] = (draft[length // 2] + 1) % 11
        firsts.append(at)
        drafts.append(draft)
        at += length + 1
    want = expected(logits, firsts, drafts)
    assert triton_judge(logits, firsts, drafts) == want
    assert accept.greedy_verdicts(logits, firsts, drafts, method="torch")[0] == want
    assert {v.accepted for v in want} == {0, 7, 16, 1, 39, 15}


def break_the_kernel(monkeypatch) -> None:
    """Broken twin: the kernel's verdicts with a rejected draft token accepted too."""
    real = accept_kernel.verdicts_triton

    def broken(choice, meta, requests, longest):
        return off_by_one(lambda c, m, r: real(c, m, r, longest))(choice, meta, requests)

    monkeypatch.setattr(accept_kernel, "verdicts_triton", broken)


def test_the_check_catches_a_kernel_one_token_off(monkeypatch):
    break_the_kernel(monkeypatch)
    with pytest.raises(AssertionError):
        check_verdicts(triton_judge, seeds=range(12))


def test_a_batch_on_the_gpu_path_catches_a_kernel_one_token_off(monkeypatch):
    """End to end through the Triton path with device verdicts: two requests drafting with the draft model get
    their solo tokens in one batch, and not with the kernel one token off."""
    from specdecode import batch as batch_module
    from specdecode.batch import BatchEngine
    from test_triton_identity import PROMPT, engine

    monkeypatch.setattr(batch_module, "trim_drafts", lambda *args: None)  # every draft verified, whatever the timings
    eng, prompts = engine(), [PROMPT, PROMPT[::-1]]
    solo = [eng.generate(p, drafter="none", max_new_tokens=6).token_ids for p in prompts]

    def batched():
        batch = BatchEngine(eng, max_batch=2, device_verdicts=True)
        return [r.token_ids for r in batch.generate_many(prompts, drafter="draft", k=3, max_new_tokens=6)]

    assert batched() == solo
    break_the_kernel(monkeypatch)
    assert batched() != solo
