"""What a request does to each row of target logits before its token is chosen, and what it records of it.

Penalties, logit bias and a grammar's mask make a row's distribution depend on the tokens before it. A verify
block's row i stands for the position after the draft's first i tokens, so it is processed with the state
those tokens give (pushed tentatively while the block is judged, undone after), exactly as plain decoding
processes its single row at that position: the output is plain decoding's with the same controls, for any
drafter and K. Order, as vLLM's sampler: logit bias, repetition penalty, frequency and presence penalties,
the grammar's mask; then temperature, min-p, top-k, top-p (sampling.py).

Log-probabilities are of the model's own distribution: log-softmax of the row's raw logits, before bias,
penalties, grammar and temperature (what vLLM returns by default). Each comes from its row alone, so it is
bitwise the value plain decoding reports.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import InputError
from .grammar import GrammarSpec
from .sampling import finite_number

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat; completions allow 5


@dataclass(frozen=True)
class LogitControls:
    """A request's per-row settings (checked here; the server maps OpenAI's fields onto them)."""

    presence_penalty: float = 0.0  # subtracted once from every token already in the answer
    frequency_penalty: float = 0.0  # subtracted per occurrence in the answer
    repetition_penalty: float = 1.0  # divides positive / multiplies negative logits of tokens in prompt or answer
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    grammar: GrammarSpec | None = None
    logprobs: int | None = None  # None: none recorded; n: the chosen token's and the n most likely tokens'

    def __post_init__(self):
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not finite_number(value) or not -2.0 <= value <= 2.0:
                raise InputError(f"{name} must be a number in -2..2, got {value!r}")
        if not finite_number(self.repetition_penalty) or not 0 < self.repetition_penalty <= 10:
            raise InputError(f"repetition_penalty must be a number in (0, 10], got {self.repetition_penalty!r}")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InputError(f"logit_bias keys must be token ids, got {token!r}")
            if not finite_number(bias) or not -100 <= bias <= 100:
                raise InputError(f"logit_bias values must be numbers in -100..100, got {bias!r} for token {token}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or isinstance(self.logprobs, bool)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InputError(f"logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}, got {self.logprobs!r}")

    @property
    def shapes_rows(self) -> bool:
        """Whether any row's distribution differs from the model's own."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.grammar is not None)


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the most likely tokens at that position, most likely first


@dataclass
class RowControls:
    """One generation's controls with their state: the tokens confirmed so far (and, while a block is judged, the
    draft tokens pushed on top of them)."""

    spec: LogitControls
    vocab_size: int
    matcher: object | None = None  # an llguidance LLMatcher at the state after the confirmed tokens
    eos_ids: frozenset[int] = frozenset()
    answer: Counter = field(default_factory=Counter)  # token -> occurrences in the answer
    seen: Counter = field(default_factory=Counter)  # token -> occurrences in prompt and answer
    pushed: list[int] = field(default_factory=list)
    bias_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    bias_values: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @classmethod
    def start(cls, spec: LogitControls, prompt_ids, vocab_size: int, matcher=None, eos_ids=frozenset()):
        bias = [(token, value) for token, value in spec.logit_bias if token < vocab_size]
        controls = cls(spec, vocab_size, matcher, frozenset(eos_ids),
                       bias_ids=torch.tensor([t for t, _ in bias], dtype=torch.long),
                       bias_values=torch.tensor([v for _, v in bias], dtype=torch.float32))
        if spec.repetition_penalty != 1.0:
            controls.seen.update(prompt_ids)
        return controls

    # ------------------------------------------------------------------ state
    def push(self, token: int) -> None:
        """The next token is `token` (a confirmed one, or a draft token while its block is judged)."""
        self.pushed.append(token)
        self.answer[token] += 1
        if self.spec.repetition_penalty != 1.0:
            self.seen[token] += 1
        if self.matcher is not None and token not in self.eos_ids:
            self.matcher.consume_token(token)

    def undo(self, count: int) -> None:
        """Take back the last `count` pushed tokens."""
        if count <= 0:
            return
        tokens = self.pushed[-count:]
        del self.pushed[-count:]
        self.answer.subtract(tokens)
        self.seen.subtract(tokens)
        self.answer, self.seen = +self.answer, +self.seen  # drop tokens whose count fell to 0
        if self.matcher is not None:
            grammar_tokens = sum(1 for t in tokens if t not in self.eos_ids)
            if grammar_tokens:
                self.matcher.rollback(grammar_tokens)

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            self.push(token)

    # ------------------------------------------------------------------ rows
    def process(self, row: torch.Tensor) -> torch.Tensor:
        """row [1, V]: the model's logits at the position after the pushed tokens -> the logits a token is chosen
        from (a new float32 tensor)."""
        out = row.float().clone()
        spec = self.spec
        if self.bias_ids.numel():
            out[0, self.bias_ids] += self.bias_values
        if spec.repetition_penalty != 1.0 and self.seen:
            ids = torch.tensor(sorted(self.seen), dtype=torch.long)
            values = out[0, ids]
            out[0, ids] = torch.where(values > 0, values / spec.repetition_penalty, values * spec.repetition_penalty)
        if (spec.frequency_penalty or spec.presence_penalty) and self.answer:
            ids = sorted(self.answer)
            counts = torch.tensor([self.answer[t] for t in ids], dtype=torch.float32)
            out[0, torch.tensor(ids, dtype=torch.long)] -= spec.frequency_penalty * counts + spec.presence_penalty
        if self.matcher is not None:
            out[0, ~self.allowed()] = float("-inf")
        return out

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (end-of-text once it is complete)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        if allowed.size < self.vocab_size:
            allowed = np.concatenate([allowed, np.zeros(self.vocab_size - allowed.size, dtype=bool)])
        if not allowed.any():  # the grammar is finished or broken: only the end of the answer remains
            allowed[[t for t in self.eos_ids if t < self.vocab_size]] = True
        return torch.from_numpy(allowed)

    # ------------------------------------------------------------------ drafts
    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of these draft tokens the grammar allows, one after another (all of them without a grammar)."""
        if self.matcher is None or not tokens:
            return len(tokens)
        upto = next((i for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
        valid = self.matcher.validate_tokens(tokens[:upto])
        if valid == upto < len(tokens):  # an end-of-text token: valid where the grammar is complete
            self.matcher.consume_tokens(tokens[:upto])
            complete = self.matcher.is_accepting()
            if upto:
                self.matcher.rollback(upto)
            return upto + 1 if complete else upto
        return valid

    def forced_after(self, tokens: list[int], limit: int) -> list[int]:
        """Tokens the grammar forces after `tokens` (valid ones): free drafts, at most `limit`."""
        if self.matcher is None or limit <= 0 or any(t in self.eos_ids for t in tokens):
            return []
        if tokens and not self.matcher.consume_tokens(tokens):
            raise AssertionError("forced_after: the draft tokens must be valid")
        try:
            return list(self.matcher.compute_ff_tokens())[:limit]
        finally:
            if tokens:
                self.matcher.rollback(len(tokens))


def record_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits [>= len(tokens), V]: row i scored tokens[i]. Each row's log-softmax computed on its own copy, as a
    single-row pass computes it (bitwise the same values whatever block the row came from)."""
    records = []
    for i, token in enumerate(tokens):
        row = torch.log_softmax(logits[i : i + 1].float().clone(), dim=-1)[0]
        best = ()
        if top:
            values, ids = torch.topk(row, min(top, row.shape[0]))
            best = tuple(zip(ids.tolist(), values.tolist()))
        records.append(TokenLogprob(token, float(row[token]), best))
    return records
