"""The default drafter: per step, copy when the text offers a match, else the draft model where it pays.

Copies (this request's text, or the same client's earlier requests: suffix.py) cost nothing, so a
step takes one whenever the stop rule keeps at least one copied token. Otherwise, when the engine has
a draft model and its stop rule allows that source (the model's measured speedup and the cost of
reading the prompt into it, see tuner.SourceRules), the model drafts a chain; else the step is plain.
Each source's confidence is calibrated apart, and each draft says which source it came from.
"""
from __future__ import annotations

from ..sampling import PositionNoise, SamplingParams
from .base import Draft, Drafter, DrafterTraits, DraftSteps, StopRule, run_alone
from .draft_model import DraftModelDrafter
from .suffix import SuffixDrafter


class AutoDrafter(Drafter):
    name = "auto"
    # The engine does not read the prompt into the draft model up front: the model drafter catches up
    # on its first proposal, which the stop rule allows only where reading the prompt pays.
    traits = DrafterTraits(stop_rule=True, max_k=15)

    def __init__(self, copier: SuffixDrafter, model: DraftModelDrafter | None = None):
        self.copier = copier
        self.model = model
        self.sources = copier.sources + (("draft",) if model is not None else ())

    @property
    def model_drafter(self) -> DraftModelDrafter | None:
        return self.model

    def reset(self) -> None:
        self.copier.reset()
        if self.model is not None:
            self.model.reset()

    def begin(self, context: list[int], namespace: str | None = "") -> None:
        self.copier.begin(context, namespace)
        if self.model is not None:
            self.model.sync(context)

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        return run_alone(self.propose_steps(context, k, sampling, noise, stop_rule))

    def propose_steps(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                      stop_rule: StopRule | None = None) -> DraftSteps:
        draft = self.copier.propose(context, k, sampling, noise, stop_rule)
        if draft.tokens or self.model is None or (stop_rule is not None and not stop_rule.allows("draft", context)):
            return draft
        draft = yield from self.model.propose_steps(context, k, sampling, noise,
                                                    stop_rule.for_source("draft") if stop_rule else None)
        draft.source = "draft"
        return draft

    def sync(self, context: list[int]) -> None:
        self.copier.sync(context)
        if self.model is not None:
            self.model.sync(context)

    def end(self, sequence: list[int]) -> None:
        self.copier.end(sequence)
