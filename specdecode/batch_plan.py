"""How much each request of a batched pass drafts: the whole pass's expected tokens per second.

A pass costs what its rows cost together (measured: `CostModel.target_cost(rows)`), and every request in it
gets at least one token. A draft token is worth its chance of being accepted along with every token before
it in its chain (the drafter's calibrated confidence). Sorting every request's draft tokens by that chance,
the pass keeps the prefix of that order that maximises (tokens expected) / (cost of the rows): few requests
leave cheap rows to fill with long copies, a full batch keeps only the surest tokens, and where the rows the
batch already has are all the pass can pay for, nobody drafts. Which tokens are verified never changes what
is output (a rejected or unverified token is replaced by the target's own), only how fast.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .policy import CostModel
from .tuning_params import DEFAULT, TuningParams


class AcceptanceRecord:
    """How one request's drafts fare in the batch against what the calibration predicted for them.

    The calibration pools every request; where a request's drafts fail far more often than predicted (an
    answer that paraphrases rather than copies), its predictions are scaled down by its own recent record,
    so its failing drafts stop taking rows from the others. Never above 1: doing better than predicted says
    little about the weak tokens."""

    def __init__(self, params: TuningParams = DEFAULT):
        self.decay = params.batch_record_decay
        self.prior = params.batch_record_prior
        self.predicted = 0.0
        self.accepted = 0.0
        self.pending: list[float] = []  # the per-token predictions of the draft now being verified

    def factor(self) -> float:
        return min(1.0, (self.accepted + self.prior) / (self.predicted + self.prior))

    def judged(self, accepted: int) -> None:
        """The target judged the draft: tokens up to the first rejection were tested."""
        tested = self.pending[: accepted + 1]
        if tested:
            self.predicted = self.decay * self.predicted + sum(tested)
            self.accepted = self.decay * self.accepted + min(accepted, len(tested))
        self.pending = []


def chain_acceptance(generation) -> list[float]:
    """Per draft token of `generation.draft`: the predicted chance that it and every token before it are accepted."""
    draft, tuning = generation.draft, generation.tuning
    rule = tuning.stop_rule.for_source(draft.source or tuning.name) if tuning.stop_rule is not None else None
    fallback = tuning.policy.acceptance.value  # drafters that give no confidence: the running acceptance rate
    confidences = draft.confidences if len(draft.confidences) == len(draft.tokens) else [float("nan")] * len(draft.tokens)
    record = generation.acceptance_record
    chain, out, each = 1.0, [], []
    for position, confidence in enumerate(confidences):
        accept = rule.chance(position, confidence) if rule is not None and confidence == confidence else fallback
        accept = min(1.0, max(0.0, accept * record.factor()))
        each.append(accept)
        chain *= accept
        out.append(chain)
    record.pending = each
    return out


def trimmable(generation) -> bool:
    """Chains whose length the engine chooses (not a pinned K, not a token tree)."""
    draft = generation.draft
    return bool(draft.tokens) and not draft.is_tree and generation.tuning.fixed_k is None


def trim_drafts(generations: list, costs: CostModel, other_rows: int = 0) -> None:
    """Cut each generation's draft (in place) to the tokens that pay for their rows in this pass.

    other_rows: rows the pass holds besides these generations' blocks (a prompt chunk being read)."""
    base_rows = other_rows + sum(1 + (0 if trimmable(g) else len(g.draft.tokens)) for g in generations)
    base_cost = costs.target_cost(base_rows)
    if base_cost is None:
        return  # nothing measured yet: every draft goes as its own stop rule chose
    candidates = sorted((-chance, position, index)
                        for index, g in enumerate(generations) if trimmable(g)
                        for position, chance in enumerate(chain_acceptance(g)))
    expected = float(len(generations))  # each request's own next token
    best_count, best_rate = 0, expected / base_cost
    cost = base_cost
    for count, (neg_chance, _, _) in enumerate(candidates, start=1):
        expected -= neg_chance
        # A pass with more rows never costs less (timings of neighbouring sizes can say otherwise by noise).
        cost = max(cost, costs.target_cost(base_rows + count))
        rate = expected / cost
        if rate > best_rate:
            best_count, best_rate = count, rate
    keep = Counter(index for _, _, index in candidates[:best_count])
    for index, g in enumerate(generations):
        if trimmable(g) and keep[index] < len(g.draft.tokens):
            n = keep[index]
            g.draft = replace(g.draft, tokens=g.draft.tokens[:n], confidences=g.draft.confidences[:n])
