"""One request while it generates: its tokens, its cache, its drafter, its tuning, noise, stopper and statistics.

The same object runs a request alone (`Engine.stream`: `step_alone` per step) and beside others in a batched
pass (`batch.BatchEngine`: `plan`, then one target pass for every request, then `apply` with its rows'
logits). Both paths draft, judge and learn through the same functions, so a request's tokens depend only on
its own rows' logits, which the row-exact kernels make the same in any pass.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .controls import RowControls
from .drafters.base import Draft, Drafter, DraftSteps, run_alone
from .drafters.draft_model import common_prefix_len
from .sampling import SamplingParams
from .stats import GenerationStats
from . import step as steps
from .batch_plan import AcceptanceRecord
from .step import StepResult, block_segment, finish_step, judge_block
from .text import Stopper, TextStep
from .tuner import GenerationTuning
from .tuning_params import DEFAULT as DEFAULT_TUNING, TuningParams
from .verify import Verdict


@dataclass
class StreamEvent:
    text: str  # new text since the previous event
    tokens: list[int]  # new tokens of this step (a stop string completed a step later can end the answer
    # before the last of them: the final stats.generated_tokens is the answer's length)
    origins: list[str]  # per token: accepted / recovered / bonus / plain (see step.py)
    stats: GenerationStats
    finished: bool = False
    pieces: list[str] = field(default_factory=list)  # per token, its text
    sources: list[str] = field(default_factory=list)  # per token: the source of an accepted draft token, else ""
    logprobs: list = field(default_factory=list)  # per token, a controls.TokenLogprob where the request asked


class Generation:
    """slot: what holds this request's target cache (`cache`, `cached_ids`: the tokens it holds)."""

    def __init__(self, slot, request, drafter: Drafter | None, stopper: Stopper, controls: RowControls | None = None,
                 tuning_params: TuningParams = DEFAULT_TUNING):
        """request: the engine's checked, frozen Request (engine.py): prompt, sampling, K, largest K, stop check."""
        self.slot = slot
        self.request = request
        self.prompt_ids = prompt_ids = list(request.prompt_ids)
        self.drafter = drafter
        self.sampling: SamplingParams = request.sampling
        self.noise = request.sampling.noise()
        self.stopper = stopper
        self.should_stop = request.should_stop
        self.controls = controls  # penalties, logit bias, grammar, logprobs: what shapes and records each row
        self.stats = GenerationStats(drafter=drafter.name if drafter else "none", prompt_tokens=len(prompt_ids),
                                     origins=stopper.origin_counts)  # the stopper counts the answer's tokens
        self.sequence = list(prompt_ids)  # every token the target has confirmed; its cache holds all but the last
        self.tuning: GenerationTuning | None = None  # from the engine once the prompt is read
        self.unread = 0  # prompt tokens the draft model has yet to read
        self.acceptance_record = AcceptanceRecord(tuning_params)  # its drafts' record in batched passes (batch_plan.py)
        self.started = time.perf_counter()
        self.draft = Draft()
        self.draft_seconds = 0.0
        self.draft_alone = True  # whether this step's draft passes held this sequence only (their time is its cost)
        self.finished = False

    # ------------------------------------------------------------------ the prompt
    def reuse_prefix(self) -> list[int]:
        """Roll the slot's cache back to the prefix it shares with this prompt; returns the tokens still to read
        (the prompt but its last token, which the first step feeds)."""
        slot, read = self.slot, self.prompt_ids[:-1]
        keep = common_prefix_len(slot.cached_ids, read)
        slot.cache.truncate(keep)
        del slot.cached_ids[keep:]
        if slot.opening is not None:  # the template's opening, read at load (opening.py)
            slot.opening.restore(slot.cache, slot.cached_ids, read)
        return read[len(slot.cached_ids):]

    def read(self, chunk: list[int]) -> None:
        """`chunk` was just written to the cache by a target pass."""
        self.slot.cached_ids.extend(chunk)

    # ------------------------------------------------------------------ a step
    def plan(self) -> Draft | None:
        """Choose K and draft; None when the context is full (the answer then ends: see end_now)."""
        proposal = self.plan_steps()
        if proposal is None:
            return None
        t0 = time.perf_counter()
        self.draft = run_alone(proposal)
        self.draft_seconds = time.perf_counter() - t0
        self.draft_alone = True
        return self.draft

    def plan_steps(self) -> DraftSteps | None:
        """Choose K and return the proposal as a generator of its draft-model passes (drafters/base.py), which
        `plan` runs alone and a batch runs beside other sequences'; None when the context is full."""
        cache = self.slot.cache
        room = cache.max_len - cache.length - 1  # positions left after the pending token
        if room < 0:
            return None
        tuning, stopper = self.tuning, self.stopper
        k = tuning.choose_k(stopper.budget, room, len(stopper.tokens))
        if k > 0 and tuning.draft_needs_prompt:
            self.stats.time_draft += self._read_prompt_into_draft()
        forced_limit = min(room, self.request.max_k, stopper.budget - 1)  # grammar-forced drafts: at most max_k
        return steps.propose_steps(self.drafter, self.sequence, k, self.sampling, self.noise, tuning.stop_rule,
                                   self.controls, forced_limit)

    def segment(self):
        return block_segment(self.slot.cache, self.sequence, self.draft)

    def apply(self, logits, start: int, verify_seconds: float, solo: bool, choice: list[int] | None = None) -> StreamEvent:
        """The target's logits of this request's block (written to its cache at `start`): judge, roll back,
        learn, and hand out the step's text. solo: the pass held this block only (its cost is the block's).
        choice: the rows' argmaxes where the pass read them already (judges_by_argmax)."""
        self.settle(logits, start, verify_seconds, solo, choice)
        return self.publish()

    def settle(self, logits, start: int, verify_seconds: float, solo: bool, choice: list[int] | None = None,
               verdict: Verdict | None = None) -> None:
        """`apply` but the text: everything the next step needs (the verdict, the caches rolled back, the tuning,
        the statistics, and whether the tokens ended the answer). `publish` then hands out the step's event.
        verdict: a greedy chain's verdict where the pass judged it already (accept.py)."""
        judged = judge_block(logits, self.slot.cache, start, self.sequence, self.draft, self.sampling, self.noise,
                             self.controls, choice, verdict)
        step = finish_step(self.drafter, self.sequence, judged, self.draft, self.draft_seconds, verify_seconds,
                           self.controls)
        self.acceptance_record.judged(len(judged.accepted))
        self._settle(step, solo)

    def publish(self) -> StreamEvent:
        """The event of the steps settled since the last one: their tokens, text and origins."""
        return self._event(self.stopper.release())

    @property
    def event_can_wait(self) -> bool:
        """Whether the event of the step just settled may be handed out later (a batch on a GPU publishes it while
        the next pass runs): the answer goes on whatever its text says. EOS, the budget and a cancel are in the
        tokens, known already; a stop string is in the text, which must be read before the request drafts again."""
        return self.stopper.finish is None and not self.stopper.stops

    @property
    def judges_by_argmax(self) -> bool:
        return steps.judges_by_argmax(self.draft, self.sampling, self.controls)

    def step_alone(self, target) -> StreamEvent:
        """One step in a pass of its own (plain single-request decoding and speculation)."""
        if self.plan() is None:
            return self.end_now("length")
        t0 = time.perf_counter()
        judged = steps.verify_block(target, self.slot.cache, self.sequence, self.draft, self.sampling, self.noise,
                                    self.controls)
        step = finish_step(self.drafter, self.sequence, judged, self.draft, self.draft_seconds, time.perf_counter() - t0,
                           self.controls)
        self._settle(step, solo=True)
        return self.publish()

    def _settle(self, step: StepResult, solo: bool) -> None:
        self.slot.cached_ids += [self.sequence[-1]] + step.tokens[:-1]
        self.sequence += step.tokens
        self.tuning.observe(step, record_cost=solo, record_draft_cost=self.draft_alone)
        self.stats.record_step(step)
        # which source drafted the accepted tokens: lookup / store / draft for auto, else the drafter
        sources = [step.draft.source or self.stats.drafter] * step.accepted + [""]
        cancel = self.should_stop is not None and self.should_stop()
        self.stopper.take(step.tokens, step.origins, cancel=cancel, sources=sources, logprobs=step.logprobs)

    def end_now(self, reason: str) -> StreamEvent:
        """End the answer before another step (the context is full, or the request was cancelled)."""
        return self._event(self.stopper.end(reason))

    def _event(self, out: TextStep) -> StreamEvent:
        stats = self.stats
        stats.generated_tokens = len(self.stopper.tokens)
        stats.time_total = time.perf_counter() - self.started
        if out.finish is not None:
            self._finish(out.finish)
        return StreamEvent(out.text, out.tokens, out.origins, stats, out.finish is not None, out.pieces, out.sources,
                           out.logprobs)

    def _finish(self, reason: str) -> None:
        self.finished = True
        self.stats.finish_reason = reason
        if self.tuning is not None:
            self.tuning.end(self.stats)
        if self.drafter is not None:
            self.drafter.end(self.sequence)

    def _read_prompt_into_draft(self) -> float:
        """The draft model's lazy prefill; its time counts in the total but not in the per-step costs."""
        t0 = time.perf_counter()
        self.drafter.prefill(self.prompt_ids)
        seconds = time.perf_counter() - t0
        self.tuning.observe_draft_prefill(seconds)
        return seconds
