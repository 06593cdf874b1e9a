"""The drafter interface: propose up to k tokens that the target is likely to produce next."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator

import torch

from ..sampling import PositionNoise, SamplingParams


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    forward_passes: int = 0  # draft-model passes spent (0 for model-free drafters)
    # Token trees: parents[i] is the block index of token i's parent, where block index 0 is the
    # last accepted token and token i sits at block index i + 1. None means a plain chain.
    parents: list[int] | None = None
    chain_length: int = 0  # for trees: the depth of the main chain (what counts as drafted)
    catch_up: int = 0  # context tokens the drafter had to consume before drafting
    # Per drafted token, a score that predicts its acceptance (NaN when not computed): the draft model's
    # top probability, or prompt lookup's match-length score. The engine calibrates it per drafter.
    confidences: list[float] = field(default_factory=list)
    # Where the tokens came from when a drafter has several sources ("lookup": this request's text, "store":
    # earlier requests, "draft": the draft model); "" for the drafter itself. Calibrated and costed apart.
    source: str = ""
    forced: int = 0  # trailing tokens a grammar forces (controls.py), not the drafter's

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @property
    def drafted(self) -> int:
        """Draft tokens that count as drafted: all of a chain, the main chain of a tree."""
        return self.chain_length if self.is_tree else len(self.tokens)


# A proposal written as a generator of the draft-model passes it needs: it yields (model, Segment) for each pass,
# is sent that pass's logits (as Transformer.forward_batch gives them), and returns its Draft. It may also yield
# (model, ChainRound): several greedy passes in a row that the device runs without the host (answered by
# answer_rounds below).
DraftSteps = Generator[tuple, "torch.Tensor | None", Draft]


@dataclass
class ChainRound:
    """`steps` draft passes in a row over one sequence's draft cache: the first fed `token`, each next one fed the
    token chosen from the pass before on the device (gpu/draft_round.py): its argmax, or where `sampling` samples,
    `noise`'s draw at the sequence position (`position` for the round's first choice, then one more a step).
    Answered with (the chosen tokens, their top probabilities) read once at the end, or None where the model
    cannot run rounds (the proposal then drafts pass by pass). A tree's round (`tree`, greedy) chooses each step's
    first of its two top tokens, as the tree drafter's loop does, and is answered with (those tokens, the runner-up
    probabilities, the runner-up tokens)."""

    cache: object
    token: int
    steps: int
    sampling: SamplingParams = SamplingParams()
    noise: PositionNoise | None = None
    position: int = 0
    tree: bool = False


def run_alone(steps: DraftSteps):
    """Drive a proposal by itself: each pass it asks for is one forward call of its model (the solo path)."""
    try:
        model, segment = next(steps)
        while True:
            if isinstance(segment, ChainRound):
                answer = answer_rounds(model, [segment])[0]
            elif getattr(model, "exact_pass", None) is not None:  # its tokens go to the device once, as metadata
                answer = model.forward_batch([segment])[0]
            else:
                answer = model(torch.tensor(segment.tokens, device=model.device), segment.cache, logits=segment.logits)
            model, segment = steps.send(answer)
    except StopIteration as done:
        return done.value


def answer_rounds(model, rounds: list[ChainRound]) -> list:
    """Each round's (tokens, confidences), run together where the model runs rounds on the device (one pass per
    step for every round still going); [None, ...] where it does not."""
    run = getattr(model, "chain_rounds", None)
    answers = run(rounds) if run is not None else None
    return answers if answers is not None else [None] * len(rounds)


class StopRule:
    """Ends a draft chain token by token (see policy.DraftStopRule): keep the next token? draft one more?"""

    def keep(self, drafted: int, chain_prob: float, confidence: float) -> bool:
        return True

    def extend(self, drafted: int, chain_prob: float, confidence: float) -> bool:
        return True

    def acceptance(self, confidence: float) -> float:
        """Predicted chance that a token of this confidence is accepted."""
        return 1.0

    def chance(self, position: int, confidence: float) -> float:
        """Predicted chance that the draft's token at `position` (of this confidence) is accepted once every token
        before it is: what a chain's chance is the product of (drafters, the stop rule and the batch planner alike)."""
        return self.acceptance(confidence)

    def for_source(self, source: str) -> "StopRule":
        """The rule for drafts from one source of a multi-source drafter (each learns its own calibration)."""
        return self

    def allows(self, source: str, context: list[int]) -> bool:
        """Whether drafting from a costly source (a draft model) pays at this point of the generation."""
        return True


@dataclass(frozen=True)
class DrafterTraits:
    """What the engine and the tuner read about a drafter, in one record (each drafter class sets its own)."""

    stop_rule: bool = False  # propose honours a StopRule: the chain ends token by token where drafting stops paying
    max_k: int = 8  # the largest K an adaptive policy may pick when the caller sets none
    greedy_only: bool = False  # token trees: verified by greedy matching only
    tokens_per_depth: int = 1  # block tokens per draft position (a tree adds a runner-up beside each)
    # A draft model drafting alone: the engine reads the prompt into it before the first step (where that pays),
    # and each drafted token costs one of its passes. Not `auto`, whose model catches up only when it drafts.
    reads_prompt: bool = False


class Drafter:
    """Base class. Drafters keep their own state in step with the engine through `sync`."""

    name = "base"
    traits = DrafterTraits()
    sources: tuple[str, ...] = ()  # several for a drafter that copies or drafts from more than one source

    def reset(self) -> None:
        """Forget everything about the previous generation."""

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        """Up to k tokens to follow context; a drafter that supports it ends early where stop_rule says."""
        raise NotImplementedError

    def propose_steps(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                      stop_rule: StopRule | None = None) -> DraftSteps:
        """`propose` as a generator of the draft-model passes it needs (see DraftSteps), so that a batch can run
        many sequences' passes together. A drafter without a model needs none: it just proposes."""
        return self.propose(context, k, sampling, noise, stop_rule)
        yield  # never reached: it makes this function a generator

    @property
    def model_drafter(self):
        """The DraftModelDrafter this drafter drafts with, if any (its costs are measured up front)."""
        return None

    def begin(self, context: list[int], namespace: str | None = "") -> None:
        """A generation starts from context (the prompt but its last token). namespace: whose request it is,
        for drafters that remember earlier requests (see suffix.py); None for a request to remember nothing of."""
        self.sync(context)

    def end(self, sequence: list[int]) -> None:
        """The generation finished with this whole sequence (prompt and answer)."""

    def prefill(self, context: list[int]) -> None:
        """Called once per generation with the prompt, before the first proposal (model drafters read it here)."""

    def unread_tokens(self, context: list[int]) -> int:
        """How many tokens of context (all but its last) `prefill` would still have to read."""
        return 0

    def sync(self, context: list[int]) -> None:
        """After verification: context is every token now confirmed; drop state past it."""
