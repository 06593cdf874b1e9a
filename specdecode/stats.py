"""Statistics of one generation, named the field's way (alpha, tau, speedup)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Leviathan et al.: with i.i.d. acceptance alpha and K drafts, E[tokens per target pass]."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speedup over plain decoding: E[tokens] / (K*c + verify cost of K+1 tokens in single steps).

    verify_ratio = 1 is the textbook assumption that a block costs one step; pass the measured one.
    """
    return expected_tokens_per_pass(alpha, k) / (k * cost_ratio + verify_ratio)


@dataclass
class GenerationStats:
    drafter: str = "none"
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0  # decoding passes, the prefill not counted
    # Tokens those passes confirmed: the output plus an EOS or tokens past a stop string, which a pass
    # produced even though the answer leaves them out. tau is per pass, so plain decoding's is exactly 1.
    decoded_tokens: int = 0
    draft_passes: int = 0
    steps_by_k: Counter = field(default_factory=Counter)  # target passes by the number of tokens drafted
    accepted_by_k: Counter = field(default_factory=Counter)  # accepted draft tokens, by the same key
    # Passes that verified a chain, by (tokens drafted, tokens accepted): how deep into its drafts the target agreed
    # (acceptance by depth, bench/runner.acceptance_by_depth)
    outcomes: Counter = field(default_factory=Counter)
    origins: Counter = field(default_factory=Counter)  # accepted / recovered / bonus / plain (see step.py)
    # Accepted draft tokens by the source that drafted them (lookup / store / draft; the drafter's name else).
    accepted_by_source: Counter = field(default_factory=Counter)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    # Costs measured during this generation (seconds), for the predicted speedup.
    single_step_cost: float | None = None  # one target pass over one token
    draft_step_cost: float | None = None  # one draft-model pass over one token
    verify_cost_by_block: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # False where the target's blocks are not row-exact (Engine.inexact): greedy identity is then not guaranteed.
    exact: bool = True
    finish_reason: str = ""

    def record_step(self, step) -> None:
        """Count one speculative step (a step.StepResult)."""
        drafted = step.draft.drafted
        self.drafted += drafted
        self.accepted += step.accepted
        self.target_passes += 1
        self.decoded_tokens += len(step.tokens)
        self.draft_passes += step.draft.forward_passes
        self.steps_by_k[drafted] += 1
        self.accepted_by_k[drafted] += step.accepted
        if drafted and not step.draft.is_tree:  # a chain: its accepted tokens are its first ones
            self.outcomes[drafted, step.accepted] += 1
            self.accepted_by_source[step.draft.source or self.drafter] += step.accepted
        self.time_draft += step.draft_seconds
        self.time_verify += step.verify_seconds

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return self.decoded_tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.time_total if self.time_total > 0 else 0.0

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_verify)

    @property
    def mean_k(self) -> float:
        steps = sum(self.steps_by_k.values())
        return sum(k * n for k, n in self.steps_by_k.items()) / steps if steps else 0.0

    @property
    def cost_ratio(self) -> float | None:
        if self.single_step_cost and self.draft_step_cost is not None:
            return self.draft_step_cost / self.single_step_cost
        return None

    def predicted(self) -> dict:
        """Leviathan's prediction at the mean K, textbook (block = one step) and with measured verify cost."""
        alpha, c = self.alpha, self.cost_ratio
        k = round(self.mean_k)
        if alpha is None or c is None or k == 0:
            return {}
        block = self.verify_cost_by_block.get(k + 1)
        out = {"k": k, "c": c, "textbook": predicted_speedup(alpha, k, c)}
        if block and self.single_step_cost:
            out["verify_ratio"] = block / self.single_step_cost
            out["measured_costs"] = predicted_speedup(alpha, k, c, out["verify_ratio"])
        return out

    def brief(self) -> dict:
        """The headline figures, cheap enough to copy after every step (the server streams them)."""
        return {
            "drafter": self.drafter,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "alpha": self.alpha,
            "tau": self.tau,
            "target_passes": self.target_passes,
            "tokens_per_s": self.tokens_per_s,
        }

    def to_dict(self) -> dict:
        return {
            **self.brief(),
            "draft_passes": self.draft_passes,
            "mean_k": self.mean_k,
            "steps_by_k": {str(k): n for k, n in sorted(self.steps_by_k.items())},
            "accepted_by_k": {str(k): n for k, n in sorted(self.accepted_by_k.items())},
            "time": {
                "prefill": self.time_prefill,
                "draft": self.time_draft,
                "verify": self.time_verify,
                "other": self.time_other,
                "total": self.time_total,
            },
            "origins": dict(self.origins),
            "accepted_by_source": dict(self.accepted_by_source),
            "predicted_speedup": self.predicted(),
            "notes": list(self.notes),
            "exact": self.exact,
            "finish_reason": self.finish_reason,
        }

    def summary_lines(self) -> list[str]:
        lines = [f"{self.generated_tokens} tokens in {self.time_total:.2f}s = {self.tokens_per_s:.2f} tok/s"
                 f" (prompt {self.prompt_tokens} tokens, prefill {self.time_prefill:.2f}s)"]
        if self.drafted:
            lines.append(
                f"drafter {self.drafter}: drafted {self.drafted}, accepted {self.accepted}, alpha {self.alpha:.2f},"
                f" tau {self.tau:.2f} tokens/target pass, mean K {self.mean_k:.1f},"
                f" target passes {self.target_passes}, draft passes {self.draft_passes}"
            )
        elif self.target_passes:
            lines.append(f"drafter {self.drafter}: {self.target_passes} target passes, tau {self.tau:.2f}")
        lines.append(
            f"time: draft {self.time_draft:.2f}s, verify {self.time_verify:.2f}s, prefill {self.time_prefill:.2f}s,"
            f" other {self.time_other:.2f}s"
        )
        pred = self.predicted()
        if pred:
            text = f"predicted speedup (Leviathan, K={pred['k']}, c={pred['c']:.2f}): textbook {pred['textbook']:.2f}x"
            if "measured_costs" in pred:
                text += f", with measured verify cost ({pred['verify_ratio']:.2f} steps) {pred['measured_costs']:.2f}x"
            lines.append(text)
        lines.extend(self.notes)
        return lines
