"""The greedy verdicts of a batched pass in one launch (accept.py lays out its input and reads its output).

One program per request: its block's argmaxes against its draft tokens (each draft ends with -1, which no argmax
equals), the first row that differs is the accepted count, and that row's argmax the next token (the correction,
or the bonus token after a fully accepted draft). Integers only: the verdict is the host's, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import accept


# `requests` sizes the metadata's sections: not specialised, or each batch size would compile its own binary
@triton.jit(do_not_specialize=["requests"])
def greedy_verdict_kernel(choice_ptr, meta_ptr, out_ptr, requests, BLOCK: tl.constexpr):
    request = tl.program_id(0)
    first = tl.load(meta_ptr + request)  # the block's first row in the pass's logits
    count = tl.load(meta_ptr + requests + request)  # its rows: draft tokens + 1
    offset = tl.load(meta_ptr + 2 * requests + request)  # where its draft tokens start
    row = tl.arange(0, BLOCK)
    inside = row < count
    wanted = tl.load(choice_ptr + first + row, mask=inside, other=0)
    proposed = tl.load(meta_ptr + 3 * requests + offset + row, mask=inside, other=-1)
    differs = (wanted != proposed) & inside
    accepted = tl.min(tl.where(differs, row, BLOCK), axis=0)  # the scan's stop: its first differing row
    tl.store(out_ptr + request, accepted)
    tl.store(out_ptr + requests + request, tl.load(choice_ptr + first + accepted))


def verdicts_triton(choice: torch.Tensor, meta: torch.Tensor, requests: int, longest: int) -> torch.Tensor:
    """As accept.verdicts_torch: [2, requests] int64 (accepted counts, next tokens). longest: the most rows a block
    has (its draft + 1); the kernel's block is the next power of two, at least accept.MIN_BLOCK."""
    out = torch.empty((2, requests), dtype=torch.int64, device=choice.device)
    block = max(accept.MIN_BLOCK, triton.next_power_of_2(longest))
    greedy_verdict_kernel[(requests,)](choice, meta, out, requests, BLOCK=block)
    return out
