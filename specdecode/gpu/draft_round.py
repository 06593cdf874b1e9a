"""Greedy draft rounds on the device: each draft pass fed the token the pass before chose, with no host read between.

A draft model drafting K tokens pass by pass reads every pass's argmax (and its top probability, for the stop
rule) back to the host before it can launch the next: on a GPU each read waits for the device to drain, and the
device then waits for the host's next launch (the review of the GPU path, P1: 8 host reads per target pass). Here
the host decides everything a round's passes need before the first one runs: each step's metadata (positions,
cache entries: a chain's are the step's index past its start) goes to the device in one copy, the passes are
launched back to back, each one's token written into its metadata on the device from the argmax before it, and
the chosen tokens and their probabilities come back in one read at the end.

The passes are the same passes (ExactPass.prepare/launch, the same captured graphs): a row's bits depend on its
token, position and cache alone, so a round drafts exactly the tokens the pass-by-pass loop drafts. Several
sequences' rounds run in lockstep (a batch's drafting): each step one pass over every round still going.

With ExactPass.round_graphs a greedy round is one CUDA graph (RoundGraph): its passes, their argmaxes feeding the
next pass's tokens and its choices captured together, so the host launches one replay where it launched a replay
per step (the same kernels with the same arguments as the passes' own graphs: the same bits).
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.transformer import Segment
from ..sampling import int64_to_device, probabilities
from . import noise_kernel
from .exact_pass import META, TOKEN, _padding


def chain_rounds(model, rounds: list) -> list[tuple[list[int], list[float]]] | None:
    """Run the rounds (drafters.base.ChainRound) on the model's GPU path: per round its chosen tokens and their top
    probabilities, in the rounds' order. None, with nothing run, where they cannot run as rounds (caches of
    several pools, a step wider than one pass)."""
    exact = model.exact_pass
    if exact is None or not rounds or len({id(r.cache.pool) for r in rounds}) > 1:
        return None
    order = sorted(range(len(rounds)), key=lambda i: -rounds[i].steps)  # each step's rounds: a prefix of them
    ordered = [rounds[i] for i in order]
    plans = _plan_steps(exact, ordered)
    if plans is None:
        return None
    with exact.on_device():
        chosen, probs, seconds = _launch_steps(model, plans, ordered)
        parts = [chosen, probs] + ([seconds] if seconds else [])
        values = torch.cat([torch.cat(part).double() for part in parts]).tolist()  # the one read
    size = len(values) // len(parts)
    tokens, confidences, runners = values[:size], values[size : 2 * size], values[2 * size :]
    if any(token < 0 for token in tokens):  # a sampled row without mass: as PositionNoise.choose refuses it
        raise ValueError("sampling from a distribution with no mass")
    offsets = _step_offsets(ordered)
    answers: list = [None] * len(rounds)
    for rank, index in enumerate(order):
        # step s holds the rounds still going at s, in their order: this round's result of step s sits at its rank
        picked = [offsets[step] + rank for step in range(ordered[rank].steps)]
        answers[index] = ([int(tokens[i]) for i in picked], [confidences[i] for i in picked])
        if ordered[rank].tree:  # its probabilities are the runner-ups', and their tokens come with them
            answers[index] += ([int(runners[i]) for i in picked],)
    return answers


def _live(ordered: list, step: int) -> list[bool]:
    return [r.steps > step for r in ordered]


def _step_offsets(ordered: list) -> list[int]:
    """Where each step's chosen tokens start in the rounds' flat results."""
    offsets, total = [], 0
    for step in range(ordered[0].steps):
        offsets.append(total)
        total += sum(_live(ordered, step))
    return offsets


def _plan_steps(exact, ordered: list):
    """Each step's pass planned on the host (ExactPass.prepare), the caches advanced as its pass will advance
    them; None, with the caches as they were, where a step does not fit one pass."""
    starts = [r.cache.length for r in ordered]
    plans = []
    for step in range(ordered[0].steps):
        segments = [Segment([0], r.cache, "last") for r in ordered if r.steps > step]  # tokens: set on the device
        if len(exact.plan(segments)) > 1:
            for r, start in zip(ordered, starts):
                r.cache.length = start
            return None
        plans.append(exact.prepare(segments))
        for seg in segments:
            seg.cache.length += 1
    return plans


def _launch_steps(model, plans: list, ordered: list) -> tuple[list[torch.Tensor], list[torch.Tensor], list]:
    """Every step's pass, back to back on the device: its metadata from one copy, its first rows' tokens the
    choices of the pass before. Per step (device tensors), the choices and top probabilities, a tree round's rows
    their runner-up probabilities instead; and where any round is a tree, the runner-up tokens (else [])."""
    device = model.device
    flat = np.concatenate([plan.meta.ravel() for plan in plans])
    metas, at = [], 0
    on_device = model.exact_pass.upload(flat)  # copies from pinned memory: none waits for the device's queue
    for plan in plans:
        metas.append(on_device[at : at + plan.meta.size].view(plan.meta.shape))
        at += plan.meta.size
    current = int64_to_device([r.token for r in ordered], device)
    draws = _draws(ordered, device)
    trees = int64_to_device([r.tree for r in ordered], device).bool() if any(r.tree for r in ordered) else None
    if draws is None and trees is None and model.exact_pass.round_graphs:
        return (*RoundGraph.of(model, plans).run(on_device, current), [])
    chosen, probs, seconds = [], [], []
    for step, (plan, meta) in enumerate(zip(plans, metas)):
        logits = model._finish_logits(model.exact_pass.launch(plan, meta, tokens=current[: plan.rows]))
        current = _choose(logits, ordered, step, draws)
        top = torch.softmax(logits.float(), -1)
        if trees is None:
            probs.append(top.amax(dim=-1))
        else:  # a tree's rows: the first of the two top tokens (as its loop's topk), the runner-up's probability
            top = torch.topk(top, 2)
            tree = trees[: plan.rows]
            current = torch.where(tree, top.indices[:, 0], current)
            probs.append(torch.where(tree, top.values[:, 1], top.values[:, 0]))
            seconds.append(top.indices[:, 1])
        chosen.append(current)
    return chosen, probs, seconds


def _draws(ordered: list, device) -> tuple[list[int], torch.Tensor] | None:
    """The sampled rounds' ranks and, on the device in one copy, [3, steps, ranks]: each step's noise keys,
    positions (a round's draw at step s is at its position + s) and the ranks themselves (the rows its draws go
    to). None where every round is greedy."""
    sampled = [rank for rank, r in enumerate(ordered) if not r.sampling.greedy]
    if not sampled:
        return None
    steps = ordered[0].steps
    keys = [[ordered[rank].noise.key_bits for rank in sampled]] * steps
    positions = [[ordered[rank].position + step for rank in sampled] for step in range(steps)]
    return sampled, int64_to_device([keys, positions, [sampled] * steps], device)


def _choose(logits: torch.Tensor, ordered: list, step: int, draws) -> torch.Tensor:
    """Each row's next token on the device: its argmax, or its sampled round's draw (each row's probabilities
    processed alone, as the pass-by-pass loop processes its one row, then raced on the device)."""
    current = logits.argmax(dim=-1)
    if draws is None:
        return current
    sampled, table = draws
    live = [rank for rank in sampled if rank < logits.shape[0]]  # the rounds still going are the first rows
    if not live:
        return current
    probs = torch.cat([probabilities(logits[rank : rank + 1], ordered[rank].sampling) for rank in live])
    count = len(live)  # the sampled ranks ascend: the live ones are the first of them
    drawn = noise_kernel.choose_rows(probs, table[0, step, :count], table[1, step, :count])
    return current.index_copy(0, table[2, step, :count], drawn)


class RoundGraph:
    """A greedy round's passes as one CUDA graph (ExactPass.round_graphs): static metadata for every step, the first
    tokens, and per step the argmaxes (each written into the next step's metadata on the device) and top
    probabilities. Captured once per the steps' shapes (rows, keys and metadata width per step, the pool and its
    version, the head); without CUDA the same launches run uncaptured each time, which is what the interpreter's
    tests check."""

    def __init__(self, model, plans: list):
        self.model, self.exact = model, model.exact_pass
        self.steps = [(plan.rows, plan.bucket[1] if plan.bucket else plan.keys, plan.meta.shape) for plan in plans]
        self.pool = plans[0].pool
        # padding rows until the first run (the scratch slot 0, position 0): what capture runs writes nothing real
        padding = [_padding(plan.meta.shape[1], plan.meta.shape[0] - META).ravel() for plan in plans]
        self.meta = torch.from_numpy(np.concatenate(padding)).to(model.device)
        self.first = torch.zeros(plans[0].rows, dtype=torch.long, device=model.device)
        self.graph, self.out = None, None
        if model.device.type == "cuda":
            self.graph, self.out = self.exact.capture(self._passes)

    @classmethod
    def of(cls, model, plans: list) -> "RoundGraph":
        """The round graph of these steps' shapes, made once."""
        exact = model.exact_pass
        key = (tuple((p.rows, p.bucket, p.keys if p.bucket is None else None, p.meta.shape) for p in plans),
               id(plans[0].pool), plans[0].pool.version, id(exact.head_weight()))
        if key not in exact.rounds:
            exact.rounds[key] = cls(model, plans)
        return exact.rounds[key]

    def run(self, meta: torch.Tensor, first: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The round over every step's metadata (flat, on the device) from the first tokens: per step the argmaxes
        and top probabilities (copies: the next replay overwrites the graph's)."""
        self.meta.copy_(meta)
        self.first.copy_(first[: self.first.shape[0]])
        if self.graph is None:
            chosen, probs = self._passes()
        else:
            self.graph.replay()
            chosen, probs = self.out
        return [c.clone() for c in chosen], [p.clone() for p in probs]

    def _passes(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model, at = self.model, 0
        current = self.first
        chosen, probs = [], []
        for rows, keys, shape in self.steps:
            size = int(np.prod(shape))
            meta = self.meta[at : at + size].view(shape)
            at += size
            meta[TOKEN, :rows].copy_(current[:rows])
            logits = model._finish_logits(self.exact.forward(meta, self.pool, keys)[:rows])
            current = logits.argmax(dim=-1)
            chosen.append(current)
            probs.append(torch.softmax(logits.float(), -1).amax(dim=-1))
        return chosen, probs
