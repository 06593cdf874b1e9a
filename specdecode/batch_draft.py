"""The draft model's passes for every sequence of a batched step, one pass per draft position.

Each sequence that drafts with a draft model proposes through a generator of the passes it needs
(drafters/base.py, `DraftSteps`): it catches its own draft cache up with its confirmed tokens, then asks for
one pass per draft token. Here all of them advance in lockstep: at each round, the passes every unfinished
proposal asks for run as one `forward_batch` of the draft model (each over its own draft cache, attention per
sequence), so R sequences drafting K tokens cost about K draft passes, not R*K. A proposal that needs no
model pass (a copy, K = 0) finishes at once. The draft model's rows are computed as they would be alone (the
kernels are row-exact; float32 passes are split within the rows computed exactly), and each proposal reads
only its own rows' logits, so every sequence drafts exactly what it drafts alone, and rolls back on its own.
"""
from __future__ import annotations

import time

import torch

from . import pass_timings
from .drafters.base import ChainRound, DraftSteps, answer_rounds
from .drafters.draft_model import top_tensors


class Proposal:
    """One sequence's proposal in progress: the generation it drafts for, its steps, and the pass it awaits."""

    def __init__(self, generation, steps: DraftSteps):
        self.generation = generation
        self.steps = steps
        self.waiting = None  # (model, Segment) it asked for, None once it has its draft

    def advance(self, logits) -> None:
        """Resume the proposal with its last pass's logits (None to start it); time spent here is its own."""
        t0 = time.perf_counter()
        try:
            self.waiting = self.steps.send(logits)
        except StopIteration as done:
            self.generation.draft = done.value
            self.waiting = None
        self.generation.draft_seconds += time.perf_counter() - t0


def draft_together(proposals: list[tuple[object, DraftSteps]]) -> int:
    """Run every (generation, steps) proposal to its draft (set as generation.draft, with draft_seconds: its own
    time plus its rows' share of each shared pass). Returns the draft passes run (rounds of the lockstep)."""
    active = []
    for generation, steps in proposals:
        generation.draft_seconds, generation.draft_alone = 0.0, True
        proposal = Proposal(generation, steps)
        proposal.advance(None)
        if proposal.waiting is not None:
            active.append(proposal)
    rounds = 0
    while active:
        for model, members in _by_model(active).items():
            chained = [p for p in members if isinstance(p.waiting[1], ChainRound)]
            others = [p for p in members if not isinstance(p.waiting[1], ChainRound)]
            passes = _device_rounds(model, chained) if chained else 0
            if others:
                _one_pass(model, others)
            rounds += max(passes, 1 if others else 0)
        active = [p for p in active if p.waiting is not None]
    return rounds


def _by_model(active: list[Proposal]) -> dict:
    """The waiting proposals grouped by the model whose pass they ask for (one draft model in practice)."""
    groups: dict = {}
    for proposal in active:
        model = proposal.waiting[0]
        groups.setdefault(model, []).append(proposal)
    return groups


def _device_rounds(model, members: list[Proposal]) -> int:
    """The members' device rounds (drafters.base.ChainRound) in lockstep, one pass per step for every round still
    going, read once at the end; each member's time is its steps' share. Returns the passes run (0 where the model
    runs no rounds: each member then goes on pass by pass)."""
    rounds = [p.waiting[1] for p in members]
    t0 = time.perf_counter()
    answers = answer_rounds(model, rounds)
    pass_timings.wait_for_device(model.device)
    seconds = time.perf_counter() - t0
    steps = sum(r.steps for r in rounds) if answers[0] is not None else 0
    for proposal, chain, answer in zip(members, rounds, answers):
        proposal.generation.draft_seconds += seconds * chain.steps / steps if steps else 0.0
        proposal.generation.draft_alone = proposal.generation.draft_alone and len(members) == 1
        proposal.advance(answer)
    return max(r.steps for r in rounds) if steps else 0


class ReadAhead:
    """A draft pass's logits with their last row's top choice (top probability, argmax), read with the other
    sequences' of the pass (DraftModelDrafter._received takes it)."""

    def __init__(self, logits, top: tuple[float, int]):
        self.logits, self.top = logits, top


def _read_ahead(model, members: list[Proposal], outputs: list) -> list:
    """On the GPU path, where several sequences' draft models choose their next token from this pass: every such
    choice read at once (on a GPU each read waits for the device), each row's own operations as top_choice runs
    them (the same bits as alone)."""
    if getattr(model, "exact_pass", None) is None:
        return outputs
    wanted = [i for i, (p, out) in enumerate(zip(members, outputs))
              if out is not None and getattr(p.generation.drafter.model_drafter, "read_ahead", False) is not False]
    if len(wanted) < 2:
        return outputs
    values = torch.stack([v for i in wanted for v in top_tensors(outputs[i][-1])]).tolist()
    outputs = list(outputs)
    for n, i in enumerate(wanted):
        outputs[i] = ReadAhead(outputs[i], (values[2 * n], int(values[2 * n + 1])))
    return outputs


def _one_pass(model, members: list[Proposal]) -> None:
    """One pass of `model` over every member's segment; each member resumes with its own logits."""
    segments = [p.waiting[1] for p in members]
    t0 = time.perf_counter()
    if hasattr(model, "forward_batch") and (len(segments) > 1 or getattr(model, "exact_pass", None) is not None):
        outputs = model.forward_batch(segments)
    else:  # one sequence, or a model without batched passes (the transformers adapter): each alone
        outputs = [model(torch.tensor(s.tokens, device=model.device), s.cache, logits=s.logits) for s in segments]
    outputs = _read_ahead(model, members, outputs)
    pass_timings.wait_for_device(model.device)
    seconds = time.perf_counter() - t0
    rows = sum(s.rows for s in segments)
    for proposal, segment, logits in zip(members, segments, outputs):
        # A pass several sequences share costs each its rows' share (as the target's pass does in batch.py);
        # the tuner then must not take that share for what a draft pass costs.
        proposal.generation.draft_seconds += seconds * segment.rows / rows
        proposal.generation.draft_alone = proposal.generation.draft_alone and len(segments) == 1
        proposal.advance(logits)
