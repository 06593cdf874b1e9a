"""Choosing the draft length K each step from measured costs and the running acceptance rate.

On a CPU neither drafting nor verifying is free, so K comes from Leviathan et al.'s model fed
with measured numbers: maximise E[tokens per pass](alpha, K) / (K * draft cost + cost of a
(K+1)-token target pass). K = 0 is plain decoding, which the policy picks when speculation
cannot pay; it then probes now and then so a recovering acceptance rate is noticed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .stats import expected_tokens_per_pass


class CostModel:
    """Running estimates (seconds) of target pass cost per block size and draft pass cost per drafter."""

    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self.target: dict[int, float] = {}
        self.draft: dict[str, float] = {}

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def record_target(self, block: int, seconds: float) -> None:
        self.target[block] = self._mix(self.target.get(block), seconds)

    def record_draft(self, drafter: str, seconds_per_pass: float) -> None:
        self.draft[drafter] = self._mix(self.draft.get(drafter), seconds_per_pass)

    def target_cost(self, block: int) -> float | None:
        """Measured, or linearly interpolated/extrapolated from the nearest measured sizes."""
        if block in self.target:
            return self.target[block]
        sizes = sorted(self.target)
        if not sizes:
            return None
        if len(sizes) == 1:
            return self.target[sizes[0]]
        lower = [s for s in sizes if s < block]
        upper = [s for s in sizes if s > block]
        a = lower[-1] if lower else sizes[0]
        b = upper[0] if upper else sizes[-1]
        if a == b:
            a, b = (sizes[-2], sizes[-1]) if not upper else (sizes[0], sizes[1])
        slope = (self.target[b] - self.target[a]) / (b - a)
        return max(self.target[a] + slope * (block - a), self.target[sizes[0]])

    def known(self, max_k: int) -> bool:
        return 1 in self.target and (max_k + 1) in self.target


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability from (accepted, drafted) outcomes, recent steps weighted more."""

    prior: float = 0.6
    prior_weight: float = 2.0
    decay: float = 0.95
    successes: float = field(default=0.0)
    trials: float = field(default=0.0)

    def update(self, accepted: int, drafted: int) -> None:
        if drafted == 0:
            return
        # Positions after the first rejection were never tested, so they are not trials.
        trials = accepted + (1 if accepted < drafted else 0)
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + trials

    @property
    def value(self) -> float:
        return (self.successes + self.prior * self.prior_weight) / (self.trials + self.prior_weight)


class DraftLengthPolicy:
    def __init__(self, costs: CostModel, drafter: str, fixed_k: int | None, max_k: int = 8, probe_every: int = 16):
        self.costs = costs
        self.drafter = drafter
        self.fixed_k = fixed_k
        self.max_k = max_k
        self.probe_every = probe_every
        self.acceptance = AcceptanceEstimate()
        self.plain_streak = 0
        self.plain_steps = 0

    def choose(self) -> int:
        if self.fixed_k is not None:
            return self.fixed_k
        best_k, best_rate = 0, self._rate(0)
        for k in range(1, self.max_k + 1):
            rate = self._rate(k)
            if rate is not None and best_rate is not None and rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self.plain_streak += 1
            self.plain_steps += 1
            if self.plain_streak >= self.probe_every:
                self.plain_streak = 0
                return 2  # a cheap probe: is the draft agreeing again?
            return 0
        self.plain_streak = 0
        return best_k

    def _rate(self, k: int) -> float | None:
        """Expected tokens per second with K = k."""
        verify = self.costs.target_cost(k + 1)
        if verify is None:
            return None
        draft = self.costs.draft.get(self.drafter, 0.0)
        return expected_tokens_per_pass(self.acceptance.value, k) / (k * draft + verify)

    def update(self, accepted: int, drafted: int) -> None:
        self.acceptance.update(accepted, drafted)
