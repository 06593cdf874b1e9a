"""Greedy verdicts of many requests at once, on the device that holds their logits, read back in one transfer.

A batched pass's greedy chains are each judged by their longest prefix equal to the target's argmaxes
(verify.verify_greedy). Judged one by one on the host, every request needs its argmaxes read back and compared in
Python: on a GPU the host's per-request work bounds a batch (review turn5 P5). Here the comparison runs on the device
for all of them, after one argmax over the pass's rows, and the host reads two integers a request (how many draft
tokens were accepted, and the target's next token) in one read. On CUDA, and where Triton's interpreter runs the GPU
path (the tests), one Triton kernel compares (gpu/accept_kernel.py); elsewhere a few vectorized torch operations
compute the same thing (`verdicts_torch`, also the kernel's reference). An argmax takes no arithmetic and the
comparison only integers, so a verdict is the same bits as the host's.

The drafts travel as one int64 array (`pack`): per request the first row of its block in the logits, the block's
rows (its draft's tokens plus one), where its tokens start; then every request's draft tokens each followed by -1,
which no argmax equals (so every block's last row ends its scan: the bonus row), and for the torch path per token
its row in the logits and its request (so that it spends no operation on finding them).
"""
from __future__ import annotations

import os

import torch

from .sampling import choose_rows, int64_to_device, probabilities
from .verify import Verdict

# the kernel's block of rows a request: at least this many (fewer sizes to compile), else the next power of two
MIN_BLOCK = 16


def one_tensor(blocks: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The blocks ([rows_i, V] each) as one [rows, V] tensor and each block's first row in it. Where they are views
    of one pass's logits (Transformer.forward_batch hands them out so), a view spanning them, which copies nothing
    (the rows between them, other requests', come along); else their concatenation."""
    first = blocks[0]
    storage, stride = first.untyped_storage().data_ptr(), first.stride()
    if first.dim() != 2 or stride[1] < 1 or stride[0] < first.shape[1] * stride[1]:  # not rows of one array
        return torch.cat(blocks), _starts([block.shape[0] for block in blocks])
    base = min(block.storage_offset() for block in blocks)
    firsts, end = [], 0
    for block in blocks:
        offset = block.storage_offset() - base
        if (block.untyped_storage().data_ptr() != storage or block.stride() != stride or block.dtype != first.dtype
                or block.shape[1:] != first.shape[1:] or offset % stride[0]):
            return torch.cat(blocks), _starts([block.shape[0] for block in blocks])
        firsts.append(offset // stride[0])
        end = max(end, firsts[-1] + block.shape[0])
    # every block lies in one array of rows `stride[0]` apart, so the rows between the first and the last do too
    return first.as_strided((end, *first.shape[1:]), stride, base), firsts


def _starts(counts: list[int]) -> list[int]:
    starts, at = [], 0
    for count in counts:
        starts.append(at)
        at += count
    return starts


def pack(firsts: list[int], drafts: list[list[int]], token_rows: bool = True) -> list[int]:
    """The requests' blocks as one int64 array: firsts, counts, token offsets (R each), then each draft + [-1], and
    with token_rows each token's row and each token's request (T each)."""
    counts = [len(draft) + 1 for draft in drafts]
    tokens = [token for draft in drafts for token in (*draft, -1)]
    if not token_rows:
        return [*firsts, *counts, *_starts(counts), *tokens]
    rows = [row for first, count in zip(firsts, counts) for row in range(first, first + count)]
    owners = [request for request, count in enumerate(counts) for _ in range(count)]
    return [*firsts, *counts, *_starts(counts), *tokens, *rows, *owners]


def greedy_verdicts(logits: torch.Tensor, firsts: list[int], drafts: list[list[int]], argmaxes: bool = False,
                    method: str | None = None, draws: tuple[list[int], torch.Tensor] | None = None
                    ) -> tuple[list[Verdict], list[int] | None]:
    """logits [rows, V]; request i's block is rows firsts[i] .. firsts[i] + len(drafts[i]) (row j scores the token
    after block position j: its last confirmed token, then its draft). Per request its greedy Verdict (what
    verify_greedy gives on those rows), and with `argmaxes` every row's argmax too (a token tree's verdict walks
    them on the host), all from one read. method: "triton" or "torch" (default: Triton where it runs, see
    `kernel_runs`). draws: (rows, tokens on the device) that stand for those rows' argmaxes: sampled chains'
    seeded draws (batch.py), judged by the same comparison."""
    choice = logits.argmax(dim=-1)  # [rows]: one launch for every request
    if draws is not None:
        choice = choice.index_copy(0, int64_to_device(draws[0], logits.device), draws[1])
    requests = len(drafts)
    read = []
    if requests:
        method = method or ("triton" if kernel_runs(logits.device) else "torch")
        meta = int64_to_device(pack(firsts, drafts, token_rows=method == "torch"), logits.device)
        if method == "triton":
            from .gpu.accept_kernel import verdicts_triton

            judged = verdicts_triton(choice, meta, requests, max(len(draft) for draft in drafts) + 1)
        else:
            judged = verdicts_torch(choice, meta, requests)
        read.append(judged.flatten())
    if argmaxes:
        read.append(choice)
    values = (read[0] if len(read) == 1 else torch.cat(read)).tolist() if read else []  # the one read
    verdicts = [Verdict(values[i], values[requests + i]) for i in range(requests)]
    return verdicts, values[2 * requests :] if argmaxes else None


def kernel_runs(device: torch.device) -> bool:
    """Where the Triton kernel compares: CUDA, or a CPU where Triton's interpreter runs the GPU path (the tests)."""
    if device.type != "cuda" and not (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def verdicts_torch(choice: torch.Tensor, meta: torch.Tensor, requests: int) -> torch.Tensor:
    """choice [rows] (each row's argmax), meta as `pack` lays it out. [2, requests] int64: accepted counts, then next
    tokens. A fixed number of operations whatever the requests (none reads back to the host)."""
    firsts = meta[:requests]
    proposed, rows, owners = meta[3 * requests :].view(3, -1)  # [tokens] each: the drafts (then -1), rows, requests
    never = torch.iinfo(torch.int64).max
    differs = torch.where(choice[rows] != proposed, rows, never)  # -1 always differs: every block has a row here
    stop = torch.full((requests,), never, dtype=torch.int64, device=meta.device)
    stop.scatter_reduce_(0, owners, differs, "amin")
    return torch.stack([stop - firsts, choice[stop]])  # the first differing row: accepted tokens, next token


def seeded_draws(generations: list, logits, sampled: list[int], first_of: dict
                 ) -> tuple[list[int], torch.Tensor] | None:
    """The sampled generations' rows (logits[i], a list or a dict by i: generation i's block, its first row
    first_of[i] in the pass's tensor) and their draws on the device: each row processed alone by its request's
    settings, all raced in one launch at the rows' sequence positions (as each one's verify races them)."""
    if not sampled:
        return None
    probs, rows, positions, noises = [], [], [], []
    for i in sampled:
        generation, block = generations[i], logits[i]
        start = len(generation.sequence)  # row j scores the token at sequence position start + j
        for j in range(block.shape[0]):
            probs.append(probabilities(block[j : j + 1], generation.sampling))
            rows.append(first_of[i] + j)
            positions.append(start + j)
            noises.append(generation.noise)
    device_kernel = kernel_runs(probs[0].device)  # (else the host's race, row by row: the same tokens)
    return rows, choose_rows(torch.cat(probs), positions, noises, device_kernel=device_kernel)
