"""What the engine learns across steps and generations, and the choices it makes from it.

`Tuner` owns everything learned: the cost of target blocks and draft passes and the draft model's cost to read a
prompt (the machine's), and per namespace (`Learned`: a client's own generations) per drafter the calibration of
draft confidence against acceptance and the speedup drafting reached lately. Each generation gets a
`GenerationTuning` from it, which chooses K before a step (`choose_k`), learns from the step (`observe`) and closes
the books (`end`). Nothing here runs a model; the engine measures and reports.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .drafters.base import Drafter, StopRule
from .drafters.suffix import SuffixDrafter
from .policy import (ChainCap, ConfidenceCalibration, CostModel, DraftLengthPolicy, DraftStopRule, MinConfidenceRule,
                     unstalled)
from .stats import GenerationStats
from .tuning_params import DEFAULT, TuningParams


LEARNED_NAMESPACES = 256  # namespaces whose Learned a Tuner keeps, the most recently used


@dataclass
class Learned:
    """What one namespace's generations taught, kept apart from every other's: how a client's requests draft (and
    so its usage counts: drafted, passes) must not depend on what other clients' texts taught the engine."""

    # Per drafter: how often the target accepts a draft token of a given confidence (the draft model's top
    # probability, or prompt lookup's match-length score).
    calibrations: dict[str, ConfidenceCalibration] = field(default_factory=dict)
    # Per drafter, the speedup its drafting steps reached in recent generations (decayed average): the prior a new
    # generation starts from, so a pair that keeps losing starts with plain decoding.
    drafting_speedup: dict[str, float] = field(default_factory=dict)
    # Per drafter or source, how the first tokens of recent generations' drafts fared against the calibration:
    # decayed (expected, accepted) sums, where the next generation's stop rule starts (DraftStopRule.start_from).
    first_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)


class Tuner:
    def __init__(self, params: TuningParams = DEFAULT):
        self.params = params
        self.costs = CostModel(params.cost_smoothing, params.cost_stall)
        self.draft_prefill_cost: dict[str, float] = {}  # seconds per prompt token, measured on lazy prefills
        self._learned: OrderedDict[str | None, Learned] = OrderedDict()

    def learned(self, namespace: str | None = "") -> Learned:
        """What this namespace's generations taught (a new namespace starts from nothing; the least recently used
        are forgotten past LEARNED_NAMESPACES)."""
        if namespace not in self._learned:
            self._learned[namespace] = Learned()
            while len(self._learned) > LEARNED_NAMESPACES:
                self._learned.popitem(last=False)
        self._learned.move_to_end(namespace)
        return self._learned[namespace]

    def needs_costs(self, drafter: Drafter | None, fixed_k: int | None, max_k: int) -> bool:
        """Whether an adaptive K must first time target blocks up to max_k + 1 tokens (and a draft pass)."""
        if drafter is None or fixed_k is not None:
            return False
        model = drafter.model_drafter
        return not self.costs.known(max_k) or (model is not None and model.name not in self.costs.draft)

    def start(self, drafter: Drafter | None, fixed_k: int | None, max_k: int, min_confidence: float = 0.0,
              unread_prompt: int = 0, prompt_len: int = 0, target_prefill: float = 0.0,
              namespace: str | None = "") -> "GenerationTuning":
        return GenerationTuning(self, drafter, fixed_k, max_k, min_confidence, unread_prompt, prompt_len, target_prefill,
                                self.learned(namespace))


class GenerationTuning:
    """One generation's choices. unread_prompt: prompt tokens the draft model has yet to read (lazy prefill)."""

    def __init__(self, tuner: Tuner, drafter: Drafter | None, fixed_k: int | None, max_k: int,
                 min_confidence: float, unread_prompt: int, prompt_len: int, target_prefill: float,
                 learned: Learned | None = None):
        self.tuner = tuner
        self.learned = learned if learned is not None else tuner.learned()  # this request's namespace's
        self.params = tuner.params
        self.costs = tuner.costs
        self.drafter = drafter
        self.name = drafter.name if drafter is not None else "none"
        self.fixed_k = fixed_k
        self.unread_prompt = unread_prompt
        self.prompt_len = prompt_len
        self.target_prefill = target_prefill
        # A pinned K drafts exactly K; an adaptive one also ends each chain where it stops paying.
        chain_rule = drafter is not None and drafter.traits.stop_rule and fixed_k is None
        # An adaptive draft model's chains start as cheap probes and grow as this request's drafts are accepted.
        self.model_cap = ChainCap(self.params.probe_chain, max_k) if chain_rule and drafter.model_drafter else None
        self.stop_rule = self._stop_rule(chain_rule, min_confidence if drafter is not None and drafter.model_drafter else 0.0)
        self.policy = DraftLengthPolicy(self.costs, self.name, fixed_k if drafter else 0, max_k,
                                        chain_stops_itself=chain_rule,
                                        drafts_are_free=chain_rule and not drafter.traits.reads_prompt, params=self.params)
        self.budget, self.generated = 0, 0
        self.model_steps, self.model_tokens, self.model_seconds, self.model_refusals = 0, 0.0, 0.0, 0
        self.probe_gap = self.params.probe_every  # refused chances before the model probes again (doubles each time)
        if chain_rule and self.name in self.learned.drafting_speedup:
            low, high = self.params.prior_speedup_range
            self.policy.prior_speedup = min(high, max(low, self.learned.drafting_speedup[self.name]))

    def _stop_rule(self, chain_rule: bool, min_confidence: float) -> StopRule | None:
        if chain_rule and len(self.drafter.sources) > 1:
            return SourceRules(self, min_confidence)
        if chain_rule:
            return self.rule_for(self.name, min_confidence)
        if min_confidence > 0 and self.drafter is not None and self.drafter.traits.stop_rule:
            return MinConfidenceRule(min_confidence)
        return None

    def rule_for(self, source: str, min_confidence: float = 0.0) -> DraftStopRule:
        cap = self.model_cap if source == "draft" else None  # "draft": the model's source, alone or in auto
        # copies (this request's text, earlier requests') cost no pass: a refused one is probed now and then
        rule = DraftStopRule(self.costs, source, self._calibration(source), min_confidence, self.params, cap,
                             probes=source in SuffixDrafter.sources)
        rule.start_from(self.learned.first_tokens.get(source))
        return rule

    def _stop_rules(self) -> dict[str, DraftStopRule]:
        """This generation's DraftStopRules by source (one for a single drafter, those auto's sources used)."""
        rule = self.stop_rule
        if isinstance(rule, SourceRules):
            return rule.rules
        return {self.name: rule} if isinstance(rule, DraftStopRule) else {}

    def _calibration(self, source: str) -> ConfidenceCalibration:
        calibrations = self.learned.calibrations
        if source not in calibrations:
            calibrations[source] = ConfidenceCalibration(self.params.calibration_bins, self.params.calibration_prior_weight)
        return calibrations[source]

    @property
    def draft_needs_prompt(self) -> bool:
        return self.unread_prompt > 0

    def choose_k(self, budget: int, room: int, generated: int) -> int:
        """Draft length of the next step. budget: tokens the caller still wants; room: cache positions left."""
        if self.drafter is None:
            return 0
        self.budget, self.generated = budget, generated
        k = min(self.policy.choose(), budget - 1, room // self.drafter.traits.tokens_per_depth)
        if k > 0 and self.draft_needs_prompt and self.fixed_k is None and not self.draft_prefill_pays(
            budget, generated, self.name, self.unread_prompt
        ):
            self.policy.plain_steps += 1
            return 0
        return k

    def draft_prefill_pays(self, budget: int, generated: int, name: str, unread: int, credit: int | None = None,
                           speedup: float | None = None) -> bool:
        """Before the draft model reads the prompt: can drafting the tokens still to come repay that read?

        Saving expected: the tokens still to come, at a plain step each, times (1 - 1/speedup) at the speedup
        the policy's prior expects. How many will come is unknown: the budget overstates it for short answers
        (Spec-Bench RAG answers 9-57 tokens after 600-1000-token prompts, where reading the prompt into the
        draft made speculation slower than plain decoding). So, as when renting before buying, count on as
        many tokens as the answer already has, and at least `credit` (`params.answer_credit`): a short prompt is read
        at once, a long one once the answer has shown it will repay it. Prefill cost: measured per prompt token
        earlier, else estimated from this generation's target prefill scaled by the draft/target step cost ratio.
        speedup: what drafting is expected to reach (the policy's prior unless given).
        """
        plain = self.costs.target_cost(1)
        if plain is None:
            return True
        # A losing history still lets a probe explore, judged at a modest speedup.
        speedup = max(self.policy.prior_speedup if speedup is None else speedup, self.params.probe_speedup_floor)
        per_token = self._read_cost(name)
        if per_token is None:
            return True
        expected_left = min(budget, max(generated, self.params.answer_credit if credit is None else credit))
        saving = expected_left * plain * (1.0 - 1.0 / speedup)
        return saving > per_token * unread

    def _read_cost(self, name: str) -> float | None:
        """Seconds a draft model `name` takes to read a prompt token: measured on earlier reads, else this
        generation's target prefill per token scaled by the draft/target step cost ratio (None: no costs yet)."""
        per_token = self.tuner.draft_prefill_cost.get(name)
        if per_token is not None:
            return per_token
        plain, draft = self.costs.target_cost(1), self.costs.draft_cost(name)
        if plain is None or draft is None:
            return None
        return self.target_prefill / max(1, self.prompt_len) * draft / plain

    def observe_draft_prefill(self, seconds: float) -> None:
        """The draft model has read the prompt, in `seconds`."""
        self._record_prefill_cost(self.name, seconds, self.unread_prompt)
        self.unread_prompt = 0

    def _record_prefill_cost(self, name: str, seconds: float, tokens: int) -> None:
        """A draft model read `tokens` context tokens in `seconds`: its cost per token to read a prompt. A read over
        `params.cost_stall` times the estimate counts as that multiple, as a pass does (CostModel._mix): a stalled
        read made later reads look dear, and the reads refused are the measurements that would have corrected it."""
        if tokens >= self.params.prefill_min_tokens:
            old = self.tuner.draft_prefill_cost.get(name)
            per_token = seconds / tokens
            if old is not None:
                keep = self.params.prefill_cost_keep
                per_token = keep * old + (1 - keep) * unstalled(per_token, old, self.params.cost_stall)
            self.tuner.draft_prefill_cost[name] = per_token

    def _observe_catch_up(self, step, source: str) -> None:
        """auto's draft model reads the prompt on its first proposal: that proposal's time, less its later passes,
        is what reading cost, per token, for the next decision whether reading pays (an estimate from the
        target's prefill put it at two thirds of what the 0.5B draft took on a 2-core EPYC)."""
        draft, per_pass = step.draft, self.costs.draft_cost(source)
        if per_pass is not None and draft.catch_up >= self.params.prefill_min_tokens:
            read = step.draft_seconds - per_pass * max(0, draft.forward_passes - 1)
            self._record_prefill_cost(source, max(0.0, read), draft.catch_up)

    def observe(self, step, record_cost: bool = True, record_draft_cost: bool = True) -> None:
        """Learn from a finished StepResult: block costs, acceptance, confidence calibration. record_cost: the
        step's verify time is its block's cost (not where the pass held other requests' rows: the batch
        records the pass's cost by its total rows); record_draft_cost: likewise for its draft passes (a batch's
        draft passes are shared, and a sequence's share is not what a draft pass costs)."""
        draft = step.draft
        source = draft.source or self.name
        if record_cost:
            self.costs.record_target(step.block_size, step.verify_seconds)
        # A step that first had to consume many context tokens says nothing about a draft pass's cost.
        if self.drafter is not None and draft.tokens and draft.catch_up <= 2 and record_draft_cost:
            self.costs.record_draft(source, step.draft_seconds / max(1, draft.forward_passes or len(draft.tokens)))
        elif draft.source == "draft" and draft.forward_passes and record_draft_cost:
            self._observe_catch_up(step, source)
        if self.drafter is None:
            return
        wasted = draft.forward_passes > len(draft.tokens) and not draft.is_tree
        seconds = self._steady_seconds(step, source)
        self.policy.update(step.accepted, draft.drafted, wasted=int(wasted), seconds=seconds, tokens=len(step.tokens))
        if source == "draft" and self.model_cap is not None:
            self.model_cap.observe(step.accepted, draft.drafted)
        if draft.source == "draft":  # a multi-source drafter's model steps, judged on their own
            self.model_steps += 1
            decay = self.params.rate_decay
            self.model_tokens = decay * self.model_tokens + len(step.tokens)
            self.model_seconds = decay * self.model_seconds + seconds
        self._calibrate_confidence(draft, step.accepted, source)

    def _steady_seconds(self, step, source: str) -> float:
        """Draft + verify time of a step, without a catch-up (a probe after plain steps feeds the draft model
        the tokens it missed): that is the price of probing, not of drafting, so the policy must not judge by it."""
        draft_time = step.draft_seconds
        per_pass = self.costs.draft_cost(source)
        if step.draft.catch_up > 2 and per_pass is not None:
            draft_time = min(draft_time, per_pass * max(1, step.draft.forward_passes))
        return draft_time + step.verify_seconds

    def _calibrate_confidence(self, draft, accepted: int, source: str) -> None:
        if draft.is_tree or not draft.confidences:
            return
        calibration = self._calibration(source)
        rule = self.stop_rule.for_source(source) if self.stop_rule is not None else None
        first = draft.confidences[0]
        if isinstance(rule, DraftStopRule) and first == first:  # judged against the calibration before it learns
            rule.judged_first(first, accepted > 0)
        # Positions after the first rejection were never judged by the target.
        for i, confidence in enumerate(draft.confidences[: accepted + 1]):
            if confidence == confidence:  # NaN when the drafter did not compute it
                calibration.update(confidence, i < accepted)

    def end(self, stats: GenerationStats) -> None:
        """The generation is over: keep its drafting speedup as the next one's prior; costs and notes to stats."""
        policy, params = self.policy, self.params
        plain = self.costs.target_cost(1)
        enough = params.min_steps_to_remember
        if self.model_steps >= enough and plain is not None:  # a multi-source drafter: its model steps' speedup
            self._remember_speedup("draft", self.model_tokens / self.model_seconds * plain)
        elif policy.chain_stops_itself and policy.drafting_steps >= enough and policy.measured_speedup() is not None:
            self._remember_speedup(self.name, policy.measured_speedup())
        for source, rule in self._stop_rules().items():
            self.learned.first_tokens[source] = rule.record
        stats.single_step_cost = self.costs.target_cost(1)
        stats.draft_step_cost = self.costs.draft_cost(self.name) if self.drafter is not None else None
        stats.verify_cost_by_block = {n: self.costs.target_cost(n) for n in sorted(self.costs.target)}
        self._acceptance_notes(stats)

    def _acceptance_notes(self, stats: GenerationStats) -> None:
        params, alpha = self.params, stats.alpha
        if alpha is not None and stats.drafted >= params.min_drafted_for_note:
            if alpha < params.low_alpha:
                stats.notes.append(
                    f"low acceptance (alpha {alpha:.2f}): speculation likely costs more than it saves here"
                    + ("; the adaptive policy fell back to plain decoding" if self.policy.plain_steps else "")
                )
            elif alpha < params.moderate_alpha:
                stats.notes.append(f"moderate acceptance (alpha {alpha:.2f}): expect a modest speedup at best")
        if self.policy.plain_steps:
            stats.notes.append(f"adaptive K chose plain decoding for {self.policy.plain_steps} of {stats.target_passes} steps")

    def _remember_speedup(self, name: str, measured: float) -> None:
        old = self.learned.drafting_speedup.get(name)
        keep = self.params.remembered_speedup_keep
        self.learned.drafting_speedup[name] = measured if old is None else keep * old + (1 - keep) * measured

    def model_pays(self, context: list[int]) -> bool:
        """For a multi-source drafter: is drafting with its model worth it now? Not where its expected speedup
        (`model_speedup`) is below 1, except for a probe now and then (after `params.probe_every` refused chances,
        then twice as many after each probe: a request that keeps losing probes ever more rarely), nor where
        reading the prompt into it would cost more than drafting the rest of the answer can save.

        A probe against a losing record that must first read the prompt waits until that read, with two failed
        probe steps, is at most `params.explore_read_share` of the request's time so far: exploring is what such a
        probe is for, and the record says it will likely lose what it spends, so only long answers, where that is a
        small share, pay for it. A short first-seen answer (a 17-token translation, about a second) otherwise lost
        a tenth of its time to a read and probes on every request of a client whose requests the draft predicts
        badly (issue 66)."""
        speedup = self.model_speedup()
        unread = self.drafter.model.unread_tokens(context)
        if speedup is not None and speedup < 1.0:
            self.model_refusals += 1
            if self.model_refusals < self.probe_gap or (unread > 2 and not self._exploring_read_is_small(unread)):
                return False  # a due probe stays due until its read is small enough
            self.model_refusals = 0
            self.probe_gap *= 2
            return True
        expected = speedup if speedup is not None else self.params.prior_speedup
        return unread <= 2 or self.draft_prefill_pays(self.budget, self.generated, "draft", unread,
                                                      self.params.auto_answer_credit, expected)

    def _exploring_read_is_small(self, unread: int) -> bool:
        """Whether reading `unread` prompt tokens into the draft model and two failed probe steps (a draft pass and
        the verify block's extra row each) cost at most `params.explore_read_share` of this request's time so far
        (its prefill and the steps run). Unknown costs: not small."""
        plain, draft = self.costs.target_cost(1), self.costs.draft_cost("draft")
        pair, per_token = self.costs.target_cost(2), self._read_cost("draft")
        if plain is None or draft is None or pair is None or per_token is None:
            return False
        spent = per_token * unread + 2 * (draft + max(0.0, pair - plain))
        return spent <= self.params.explore_read_share * (self.target_prefill + self.generated * plain)

    def model_speedup(self) -> float | None:
        """The draft model's expected speedup over plain decoding for the rest of this request: its own model
        steps so far (tokens per second against a plain step's), beside a prior worth
        `params.request_prior_steps` steps at what this namespace's earlier requests measured (or
        `params.prior_speedup`); before any model step, that history alone (None: nothing known)."""
        history = self.learned.drafting_speedup.get("draft")
        plain = self.costs.target_cost(1)
        if self.model_steps == 0 or plain is None:
            return history
        low, high = self.params.prior_speedup_range
        prior = min(high, max(low, history if history is not None else self.params.prior_speedup))
        weight = self.params.request_prior_steps
        return (self.model_tokens + weight * prior) / (self.model_seconds + weight * plain) * plain



class SourceRules(StopRule):
    """Stop rules of a multi-source drafter (auto): one DraftStopRule per source, each with its own
    calibration and pass cost, and the decision whether the costly source (the draft model) may draft."""

    def __init__(self, tuning: GenerationTuning, min_confidence: float):
        self.tuning = tuning
        self.min_confidence = min_confidence  # the draft model's knob
        self.rules: dict[str, DraftStopRule] = {}

    def for_source(self, source: str) -> StopRule:
        rule = self.rules.get(source)
        if rule is None:
            rule = self.rules[source] = self.tuning.rule_for(source, self.min_confidence if source == "draft" else 0.0)
        return rule

    def allows(self, source: str, context: list[int]) -> bool:
        return source != "draft" or self.tuning.model_pays(context)
