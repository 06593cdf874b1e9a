"""A batch's next pass launched before its last pass is read (BatchEngine's `launch_ahead`; Engine's for one request).

Where every running request decodes plainly (no drafter, nothing shaping its rows), the token each one feeds its
next pass is its row's argmax, or for a sampled request its row's seeded draw (sampling.choose_rows: the race of
its noise at its position, in the device's kernel on the GPU path), which the device computes without the host.
So the batch launches the next pass with those tokens (`Transformer.steps_from_device`: the metadata built on the
host, where positions are known, and copied from pinned memory), then reads the last pass's argmaxes (one pinned
asynchronous copy, queued before the next pass: waiting for it waits for the last pass only) and settles it while
the device runs the next.
On a GPU the host's per-request work (verdicts, stop checks, detokenizing, events) then hides behind the device's.

The tokens are those of the batch without it: each row is computed from its own token, position and cache alone
(the GPU path's kernels), and its token is the one the host reads. A request that ends at the pass being settled
(its EOS, its budget, a stop string, a failure) had a row in the next pass too: that row is dropped and its cache
rolled back to before it, as a rejected draft's rows are. Rows that would surely be wasted (a budget of one token,
no room in the cache) are never launched.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import accept
from .sampling import int64_to_device


class LaterRead:
    """A device tensor's values, copied to pinned host memory behind the work queued so far and read later:
    waiting for them waits for that work only, not for what was launched after the copy. On a CPU: the values."""

    def __init__(self, values: torch.Tensor):
        self.event = None
        if values.device.type == "cuda":
            with torch.cuda.device(values.device):
                self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
                self.host.copy_(values, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
        else:
            self.host = values

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass(eq=False)
class PassInFlight:
    """A launched pass of plain rows (greedy or seeded), one a request, not yet read: per ticket its row and where
    that row was written in its cache."""

    logits: torch.Tensor  # [rows, vocab] on the device
    rows: dict = field(default_factory=dict)  # ticket -> (row, start)
    launched: float = field(default_factory=time.perf_counter)

    @classmethod
    def of(cls, tickets: list, logits: torch.Tensor, starts: list[int]) -> "PassInFlight":
        return cls(logits, {t: (i, start) for i, (t, start) in enumerate(zip(tickets, starts))})


def plain_rows(generation) -> bool:
    """Whether each step of the generation is one row whose token comes from the last row alone (next_tokens): no
    drafter, nothing shaping or recording its rows."""
    return generation is not None and generation.drafter is None and generation.controls is None


def next_tokens(generations: list, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token on the device (generations[i] owns row i; None: a row nobody reads): its argmax, or for a
    sampled generation its seeded draw at its next position, as its verify races it. (tokens to read, tokens to feed
    the next pass): a row without mass reads -1, which its verify refuses (its next row is then dropped), and feeds
    token 0; greedy rows alone are one tensor for both."""
    choice = logits.argmax(dim=-1)
    sampled = [i for i, g in enumerate(generations) if g is not None and not g.sampling.greedy]
    if not sampled:
        return choice, choice
    blocks = {i: logits[i : i + 1] for i in sampled}  # a one-row block each: only the sampled rows are read
    rows, drawn = accept.seeded_draws(generations, blocks, sampled, {i: i for i in sampled})
    choice = choice.index_copy(0, int64_to_device(rows, logits.device), drawn)
    return choice, choice.clamp(min=0)


def decodes_plainly(ticket) -> bool:
    """plain_rows, its prompt read, not cancelled or finished."""
    return (plain_rows(ticket.generation) and not ticket.cancelled and not ticket.pending and ticket.donor is None
            and not ticket.finished)


def next_row_pays(generation, cache) -> bool:
    """Whether a row launched now for the step after the one in flight can be kept: a token of the generation's
    budget left after that step, and room for the row in its cache."""
    return generation.stopper.budget >= 2 and has_room(cache)


def has_room(cache) -> bool:
    """Whether the cache takes a step's row (as Generation.plan_steps decides)."""
    return cache.max_len - cache.length - 1 >= 0
