"""Choosing the draft length K each step from measured costs and the running acceptance rate.

On a CPU neither drafting nor verifying is free, so K comes from Leviathan et al.'s model fed
with measured numbers: maximise E[tokens per pass](alpha, K) / (K * draft cost + cost of a
(K+1)-token target pass). K = 0 is plain decoding, which the policy picks when speculation
cannot pay; it then probes now and then so a recovering acceptance rate is noticed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .drafters.base import StopRule
from .stats import expected_tokens_per_pass
from .tuning_params import DEFAULT, TuningParams


# Timings of other block sizes, with no single step between them, after which the single step's estimate is stale
# and those timings move it (CostModel). While single steps come at least this often they show the level
# themselves, and another size's timing refines that size's ratio to them; four is a few drafting steps in a row.
SINGLE_STALE_AFTER = 4


def unstalled(timing: float, estimate: float, stall: float) -> float:
    """A timing as it counts against its estimate: at most `stall` times it (more was a stall, not a cost)."""
    return min(timing, stall * estimate)


class CostModel:
    """Running estimates (seconds) of target pass cost per block size and draft pass cost per drafter.

    Each block size's estimate is kept with the single step's estimate at the time it was timed, and is
    read scaled by how the single step has moved since. Single steps run all the time, longer blocks only
    when the policy drafts that far: without the scaling, timings taken while another process had the
    cores (the engine's cost measurement at start-up, say) would keep the block sizes the policy then
    avoids looking that much dearer for good, since an avoided size is never timed again. A machine that
    is busy for a while slows every block size alike, so the ratios hold. A draft pass's cost is kept and
    read the same way (`draft_cost`): a draft timed on a busy machine looked dearer than a target step, so
    the draft model never drafted again and its cost was never timed again.

    The single step is the machine's level only while single steps are timed. A drafter that drafts a token
    almost every step (auto copies one nearly always; a batch's passes hold several requests' rows) runs blocks
    of 2+ rows, and the single step's estimate, read from a start-up measurement taken busy or cold, stayed
    where it was: a plain step looked 1.45x dearer than it was, and a draft model that lost looked faster than
    plain decoding. So once `SINGLE_STALE_AFTER` timings of other sizes have come with no single step between
    them, a block's timing moves the level: the single step's estimate moves by the factor the block's own
    estimate moves (one `smoothing` step toward the timing, as ever), and every size and draft pass, read in
    single-step terms, moves with it; the block's ratio to the single step holds.
    """

    def __init__(self, smoothing: float = DEFAULT.cost_smoothing, stall: float = DEFAULT.cost_stall):
        self.smoothing = smoothing
        self.stall = stall
        self.target: dict[int, float] = {}  # as timed (smoothed); read through target_cost
        self.single_at: dict[int, float] = {}  # block size -> the single step's estimate when it was timed
        self.draft: dict[str, float] = {}  # as timed (smoothed); read through draft_cost
        self.draft_single_at: dict[str, float] = {}  # drafter -> the single step's estimate when it was timed
        # Timings of other sizes in decoding since the last single step timed in decoding; none yet counts as stale.
        self.since_single = SINGLE_STALE_AFTER

    def _mix(self, old: float | None, new: float) -> float:
        """One timing's step toward `new`. A pass that took over `stall` times its estimate was stalled (another
        process had the cores, page faults): it counts as `stall` times. Unclipped, one 5x stall of a two-row verify
        makes a one-token copy look dear for good, as a size the policy then avoids is never timed again."""
        if old is None:
            return new
        return (1 - self.smoothing) * old + self.smoothing * unstalled(new, old, self.stall)

    def _scaled(self, block: int) -> float:
        """The estimate for block in today's single-step terms."""
        single, at = self.target.get(1), self.single_at.get(block)
        return self.target[block] * (single / at) if single and at else self.target[block]

    def set_measured(self, block: int, seconds: float) -> None:
        """A timing taken apart from decoding (the engine's cost measurement): replaces the estimate.

        A single step measured so leaves the level stale: the measurement may be another process's, kept on disk,
        or taken while the machine was busy. Its sizes' ratios to each other hold (timed together), so decoding's
        first timings of other sizes move the level rather than refine those ratios against a level that was never
        today's (refined, a start-up single step 1.8x too dear stayed 1.2x too dear)."""
        self.target[block] = seconds
        if block == 1:
            self.since_single = SINGLE_STALE_AFTER
        self._timed(block)

    def record_target(self, block: int, seconds: float) -> None:
        old = self._scaled(block) if block in self.target else None
        stale = self.since_single >= SINGLE_STALE_AFTER
        self.since_single = 0 if block == 1 else self.since_single + 1
        single = self.target.get(1)
        if block != 1 and stale and old and single and block in self.single_at:
            # The machine's level: the single step moves as this block's scaled estimate would, and so does every
            # size and draft pass read through it; target[block] / single_at[block], its ratio, is left as it was.
            self.target[1] = single * self._mix(old, seconds) / old
            return
        self.target[block] = self._mix(old, seconds)
        self._timed(block)

    def _timed(self, block: int) -> None:
        if block != 1:
            if 1 in self.target:
                self.single_at[block] = self.target[1]
            return
        for other in self.target:  # sizes timed before any single step: taken as timed alongside this one
            if other != 1 and other not in self.single_at:
                self.single_at[other] = self.target[1]

    def record_draft(self, drafter: str, seconds_per_pass: float) -> None:
        self.draft[drafter] = self._mix(self.draft_cost(drafter), seconds_per_pass)
        self._draft_timed(drafter)

    def set_measured_draft(self, drafter: str, seconds_per_pass: float) -> None:
        """A draft pass timed apart from decoding, beside the target blocks of the same measurement."""
        self.draft[drafter] = seconds_per_pass
        self._draft_timed(drafter)

    def _draft_timed(self, drafter: str) -> None:
        if 1 in self.target:
            self.draft_single_at[drafter] = self.target[1]
        else:
            self.draft_single_at.pop(drafter, None)

    def draft_cost(self, drafter: str) -> float | None:
        """A draft pass of this drafter in today's single-step terms (None: never timed)."""
        if drafter not in self.draft:
            return None
        single, at = self.target.get(1), self.draft_single_at.get(drafter)
        return self.draft[drafter] * (single / at) if single and at else self.draft[drafter]

    def target_cost(self, block: int) -> float | None:
        """Measured, or linearly interpolated/extrapolated from the nearest measured sizes."""
        if block in self.target:
            return self._scaled(block)
        sizes = sorted(self.target)
        if not sizes:
            return None
        if len(sizes) == 1:
            return self._scaled(sizes[0])
        lower = [s for s in sizes if s < block]
        upper = [s for s in sizes if s > block]
        a = lower[-1] if lower else sizes[0]
        b = upper[0] if upper else sizes[-1]
        if a == b:
            a, b = (sizes[-2], sizes[-1]) if not upper else (sizes[0], sizes[1])
        cost_a, cost_b = self._scaled(a), self._scaled(b)
        slope = (cost_b - cost_a) / (b - a)
        return max(cost_a + slope * (block - a), self._scaled(sizes[0]))

    def known(self, max_k: int) -> bool:
        return 1 in self.target and (max_k + 1) in self.target


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability from (accepted, drafted) outcomes, recent steps weighted more."""

    prior: float = DEFAULT.acceptance_prior
    prior_weight: float = DEFAULT.acceptance_prior_weight
    decay: float = DEFAULT.acceptance_decay
    successes: float = field(default=0.0)
    trials: float = field(default=0.0)

    def update(self, accepted: int, drafted: int, wasted: int = 0) -> None:
        """wasted: draft passes spent on tokens the drafter then chose not to propose (a miss, for the policy)."""
        if drafted == 0 and wasted == 0:
            return
        # Positions after the first rejection were never tested, so they are not trials.
        trials = accepted + (1 if accepted < drafted else 0) + wasted
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + trials

    @property
    def value(self) -> float:
        return (self.successes + self.prior * self.prior_weight) / (self.trials + self.prior_weight)


class DraftLengthPolicy:
    """K for the next step. Two modes:

    - i.i.d. model (lookup, trees): the K maximising Leviathan's expected tokens per second from the
      running acceptance estimate and the measured costs;
    - self-stopping chains (draft model with the stop rule): the chain decides its own length, so the
      policy only decides whether drafting pays at all, by comparing the measured tokens per second of
      recent drafting steps (draft + verify time) with a plain step's. A prior worth `params.prior_steps`
      steps at `prior_speedup` keeps one unlucky step from switching drafting off.
    """

    def __init__(self, costs: CostModel, drafter: str, fixed_k: int | None, max_k: int = 8,
                 chain_stops_itself: bool = False, drafts_are_free: bool = False, params: TuningParams = DEFAULT):
        self.costs = costs
        self.drafter = drafter
        self.fixed_k = fixed_k
        self.max_k = max_k
        self.params = params
        self.chain_stops_itself = chain_stops_itself
        self.prior_speedup = params.prior_speedup  # a generation starts from what earlier ones measured
        # A model-free drafter's refusal costs nothing, so its stop rule alone decides, step by step, how much
        # of a match to verify (nothing when no token pays); a measured-rate off switch would also silence the
        # long, confident matches it exists for.
        self.drafts_are_free = drafts_are_free
        self.acceptance = AcceptanceEstimate(params.acceptance_prior, params.acceptance_prior_weight, params.acceptance_decay)
        self.plain_streak = 0
        self.plain_steps = 0
        self.drafting_steps = 0
        self.draft_tokens = 0.0  # decayed sums over drafting steps
        self.draft_seconds = 0.0

    def choose(self) -> int:
        if self.fixed_k is not None:
            return self.fixed_k
        best_k = self._best_k()
        if best_k == 0:
            self.plain_streak += 1
            self.plain_steps += 1
            if self.plain_streak >= self.params.probe_every:
                self.plain_streak = 0
                # a probe: is the draft agreeing again?
                return self.max_k if self.chain_stops_itself else min(self.params.probe_k, self.max_k)
            return 0
        self.plain_streak = 0
        return best_k

    def measured_speedup(self) -> float | None:
        """Tokens per second of this generation's drafting steps over a plain step's (None before any)."""
        plain = self.costs.target_cost(1)
        if not self.draft_seconds or plain is None:
            return None
        return self.draft_tokens / self.draft_seconds * plain

    def _best_k(self) -> int:
        if self.chain_stops_itself and self.drafts_are_free:
            return self.max_k
        if self.chain_stops_itself:
            plain = self.costs.target_cost(1)
            if plain is None:
                return self.max_k
            prior_steps = self.params.prior_steps
            tokens = self.draft_tokens + prior_steps * self.prior_speedup
            seconds = self.draft_seconds + prior_steps * plain
            return self.max_k if tokens / seconds > 1.0 / plain else 0
        best_k, best_rate = 0, self._rate(0)
        for k in range(1, self.max_k + 1):
            rate = self._rate(k)
            if rate is not None and best_rate is not None and rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def _rate(self, k: int) -> float | None:
        """Expected tokens per second with K = k."""
        verify = self.costs.target_cost(k + 1)
        if verify is None:
            return None
        draft = self.costs.draft_cost(self.drafter) or 0.0
        return expected_tokens_per_pass(self.acceptance.value, k) / (k * draft + verify)

    def update(self, accepted: int, drafted: int, wasted: int = 0, seconds: float | None = None, tokens: int = 0) -> None:
        """One step's outcome; seconds (draft + verify) and tokens (new tokens) of drafting steps feed the
        measured drafting rate."""
        self.acceptance.update(accepted, drafted, wasted)
        if seconds is not None and (drafted or wasted):
            self.drafting_steps += 1
            decay = self.params.rate_decay
            self.draft_tokens = decay * self.draft_tokens + tokens
            self.draft_seconds = decay * self.draft_seconds + seconds


class ConfidenceCalibration:
    """P(target accepts a draft token | the draft's top probability), learned online in bins.

    The draft's own top probability is a good but not perfectly calibrated predictor of
    acceptance, so each bin starts at its centre and moves toward the measured rate.
    """

    def __init__(self, bins: int = DEFAULT.calibration_bins, prior_weight: float = DEFAULT.calibration_prior_weight):
        self.bins = bins
        self.prior_weight = prior_weight
        self.successes = [0.0] * bins
        self.trials = [0.0] * bins

    def _bin(self, confidence: float) -> int:
        return min(self.bins - 1, max(0, int(confidence * self.bins)))

    def update(self, confidence: float, accepted: bool) -> None:
        b = self._bin(confidence)
        self.successes[b] += accepted
        self.trials[b] += 1

    def __call__(self, confidence: float) -> float:
        b = self._bin(confidence)
        centre = (b + 0.5) / self.bins
        return (self.successes[b] + centre * self.prior_weight) / (self.trials[b] + self.prior_weight)


class ChainCap:
    """How long a draft model's chain may grow in this request: short while nothing is known, longer as drafts land.

    The stop rule's calibration pools earlier requests, so on text the draft predicts badly it still drafts long
    chains whose passes are wasted. A request's first model draft is therefore a cheap probe of `start` tokens;
    the cap doubles each time a whole chain is accepted (up to `limit`) and halves when a chain's first token is
    rejected (a request that keeps missing probes one token at a time; one that drafts well loses little to a
    single miss). Chains that are partly accepted keep the cap: the stop rule already ends them.
    """

    def __init__(self, start: int, limit: int):
        self.start = max(1, start)
        self.limit = max(self.start, limit)
        self.value = self.start

    def observe(self, accepted: int, drafted: int) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.value = min(self.limit, max(self.value, drafted) * 2)
        elif accepted == 0:
            self.value = max(1, self.value // 2)


class DraftStopRule(StopRule):
    """Decides, token by token, how far a draft model's chain is worth taking (adaptive K within a step).

    With chain_prob the predicted chance that every drafted token so far is accepted, a token whose
    draft pass is already paid for is worth verifying if its expected gain (chain_prob tokens, each
    worth a plain target step) beats the extra verify cost of a longer block; one more draft pass is
    worth running if the next token, predicted as likely as this one, also repays that pass.
    """

    def __init__(self, costs: CostModel, drafter: str, calibration: ConfidenceCalibration, min_confidence: float = 0.0,
                 params: TuningParams = DEFAULT, cap: ChainCap | None = None, probes: bool = False):
        self.costs = costs
        self.params = params
        self.drafter = drafter
        self.calibration = calibration
        self.min_confidence = min_confidence
        self.cap = cap  # a draft model's chains: at most cap.value tokens (None: no cap)
        self.first_expected = 0.0  # decayed sums over this generation's first draft tokens
        self.first_accepted = 0.0
        self.probes = probes  # copies: a refused first token is verified anyway now and then (first_or_probe)
        self.refused = 0  # first tokens refused in a row

    def acceptance(self, confidence: float) -> float:
        return self.calibration(confidence)

    def chance(self, position: int, confidence: float) -> float:
        """The pooled calibration's, and for a draft's first token this generation's first-token factor too: counted
        once, it scales every chain through that token (see first_token_factor)."""
        return self.acceptance(confidence) * (self.first_token_factor() if position == 0 else 1.0)

    def first_token_factor(self) -> float:
        """How this generation's first draft tokens fare against the pooled calibration (at most 1).

        The calibration pools every prompt, so where copies fail far more often than usual (an answer that
        paraphrases its prompt rather than repeating it) it keeps predicting the pooled rate and the copier
        goes on verifying one-token matches that fail. The factor corrects the chance that a draft's first token
        is accepted, and so, once, the chance of every chain through it; the tokens after it are judged by the
        pooled calibration alone: once a copy is accepted it tends to run on, which that calibration knows (a
        factor compounded on every token cut long copies short: HumanEval tau 3.7 -> 1.9). Never above 1:
        drafts that start well say little about the weak ones."""
        w = self.params.first_token_prior
        return min(1.0, (self.first_accepted + w) / (self.first_expected + w))

    def start_from(self, record: tuple[float, float] | None) -> None:
        """Begin this generation's first-token sums from its client's earlier generations' (`record`: decayed
        expected and accepted first tokens), worth at most `params.first_token_carry` expected tokens: a client whose
        copies keep failing (translations copying names from their source text) starts its next request wary, and
        that request's own drafts outweigh the record within a few steps."""
        carry = self.params.first_token_carry
        if record is None or carry <= 0 or record[0] <= 0:
            return
        scale = min(1.0, carry / record[0])
        self.first_expected, self.first_accepted = record[0] * scale, record[1] * scale

    @property
    def record(self) -> tuple[float, float]:
        return self.first_expected, self.first_accepted

    def judged_first(self, confidence: float, accepted: bool) -> None:
        """The target judged the first token of one of this generation's drafts (before calibrating on it)."""
        decay = self.params.first_token_decay
        self.first_expected = decay * self.first_expected + self.calibration(confidence)
        self.first_accepted = decay * self.first_accepted + accepted

    def _marginal_verify(self, drafted: int) -> float:
        now, more = self.costs.target_cost(drafted + 1), self.costs.target_cost(drafted + 2)
        return max(0.0, (more or 0.0) - (now or 0.0))

    def keep(self, drafted: int, chain_prob: float, confidence: float) -> bool:
        """drafted tokens are kept so far; should the next one (probability `confidence`) join them?"""
        if confidence < self.min_confidence and drafted > 0:
            return False
        step = self.costs.target_cost(1)
        if step is None:
            return True
        keep = chain_prob * self.chance(drafted, confidence) * step > self._marginal_verify(drafted)
        return self.first_or_probe(keep) if drafted == 0 and self.probes else keep

    def first_or_probe(self, keep: bool) -> bool:
        """A copy's first token: kept where the rule keeps it, and else once `params.copy_probe_every` were refused
        in a row (a probe: one token, one more verify row). The rule learns only from what it lets through, so without
        probes a calibration or a verify cost gone wrong is never corrected: one 54-prompt run had auto draft nothing,
        not even copies, from its 13th prompt on (1.02x plain), and one stalled two-row pass planted at the start
        reproduces that (short copies look dear, the long ones still tried fail too:
        docs/experiments/copy_probes.py)."""
        self.refused = 0 if keep else self.refused + 1
        if self.refused >= self.params.copy_probe_every > 0:
            self.refused = 0
            return True
        return keep

    def extend(self, drafted: int, chain_prob: float, confidence: float) -> bool:
        """After keeping `drafted` tokens with this chain_prob, is another draft pass worth paying?"""
        if self.cap is not None and drafted >= self.cap.value:
            return False
        step = self.costs.target_cost(1)
        draft = self.costs.draft_cost(self.drafter)
        if step is None or draft is None:
            return True
        return chain_prob * self.chance(drafted, confidence) * step > draft + self._marginal_verify(drafted)


class MinConfidenceRule(StopRule):
    """A pinned K with a floor: the chain ends before the first token (after one) the draft is less sure of."""

    def __init__(self, min_confidence: float):
        self.min_confidence = min_confidence

    def keep(self, drafted: int, chain_prob: float, confidence: float) -> bool:
        return drafted == 0 or confidence >= self.min_confidence
