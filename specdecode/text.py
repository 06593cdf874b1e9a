"""From tokens to the answer's text: incremental detokenising and where the answer stops.

The token loop hands each step's tokens to a `Stopper`, which ends the answer at EOS, at the token
budget or before a stop string, and hands back only text that no stop string can still take back.
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field


class IncrementalDetokenizer:
    """Text of each token as it arrives, without splitting UTF-8 characters.

    Decodes a short window around the new token, as vLLM and TGI do, so the cost per token is constant.
    A token that ends inside a multi-byte character gets "" and its text comes with the token that
    completes it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if full.endswith("\ufffd") or len(full) < len(prefix):
            return ""  # an incomplete character: its text comes with a later token
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """At the end of the answer: the text still held back, an unfinished character as U+FFFD (as a
        decode of all the tokens gives it)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]


@dataclass
class TextStep:
    text: str  # new text safe to show
    tokens: list[int]  # this step's tokens that belong to the answer
    origins: list[str]
    pieces: list[str]  # per token, its text (for colouring by origin)
    finish: str | None  # "stop", "length" or "cancelled" once the answer is over
    sources: list[str] = field(default_factory=list)  # per token: the source of an accepted draft token, else ""
    logprobs: list = field(default_factory=list)  # per token, a controls.TokenLogprob where the request asked


class Stopper:
    """Owns the answer: its tokens, their origins and text, and the reason it ended."""

    def __init__(self, tokenizer, max_new_tokens: int, stops=()):
        self.eos_ids = tokenizer.eos_ids
        self.max_new_tokens = max_new_tokens
        self.stops = [s for s in stops if s]
        # Text that could be the start of a stop string is shown only once the next tokens rule that out.
        self.held_back = max((len(s) for s in self.stops), default=1) - 1
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.tokens: list[int] = []
        self.origins: list[str] = []
        self.sources: list[str] = []
        self.logprobs: list = []
        self.starts: list[int] = []  # per token, where its text starts in self.text
        self.origin_counts: Counter = Counter()
        self.text = ""
        self.shown = 0  # characters of text already handed out
        self.finish: str | None = None

    @property
    def budget(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def push(self, tokens: list[int], origins: list[str], cancel: bool = False, sources: list[str] | None = None,
             logprobs: list | None = None) -> TextStep:
        """Add one step's tokens, in the order the target produced them; cancel ends the answer after them.
        sources: per token, which source drafted it (accepted tokens of a multi-source drafter), else "".
        logprobs: per token, its log-probability record (where the request asked for them)."""
        first = len(self.tokens)
        for i, (token, origin, source) in enumerate(zip(tokens, origins, sources or [""] * len(tokens))):
            if token in self.eos_ids:
                self.finish = "stop"
                break
            self.starts.append(len(self.text))
            self.text += self.detokenizer.push(token)
            self.tokens.append(token)
            self.origins.append(origin)
            self.sources.append(source)
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
            self.origin_counts[origin] += 1
            # Token by token, as plain decoding checks: the stop string that completes first ends the answer,
            # whatever else a step's later tokens would complete (["\nUser:", "User"] stops at "User").
            if self._cut_at_stop_string(self.starts[-1]):
                break
            if len(self.tokens) >= self.max_new_tokens:
                self.finish = "length"
                break
        if self.finish is None and cancel:
            self.finish = "cancelled"
        if self.finish is not None:
            self._flush()
        pieces = [self.text[start:end] for start, end in zip(self.starts[first:], self.starts[first + 1 :] + [len(self.text)])]
        return TextStep(self._release(), self.tokens[first:], self.origins[first:], pieces, self.finish,
                        self.sources[first:], self.logprobs[first:])

    def end(self, reason: str) -> TextStep:
        """End the answer where it stands (the context is full): hand out what was held back."""
        self.finish = self.finish or reason
        self._flush()
        return TextStep(self._release(), [], [], [], self.finish)

    def _flush(self) -> None:
        """The answer is over: the bytes of an unfinished character join the text, as a decode of its tokens."""
        new_from = len(self.text)
        self.text += self.detokenizer.flush()
        if len(self.text) > new_from:
            self._cut_at_stop_string(new_from)

    def _cut_at_stop_string(self, new_from: int) -> bool:
        """End the answer before a stop string that the text from new_from on completes (none ended earlier:
        the text is checked after each token). Of several, the one that starts first."""
        found = [pos for s in self.stops if (pos := self.text.find(s, max(0, new_from - len(s) + 1))) >= 0]
        if not found:
            return False
        self.text = self.text[: min(found)]
        self.finish = "stop"
        # The answer ends where the stop string starts: tokens whose text starts at or after it are not output.
        keep = bisect.bisect_left(self.starts, len(self.text))
        self.origin_counts.subtract(self.origins[keep:])
        self.origin_counts = +self.origin_counts  # drop kinds whose count fell to 0
        del self.tokens[keep:], self.origins[keep:], self.sources[keep:], self.starts[keep:], self.logprobs[keep:]
        return True

    def _release(self) -> str:
        end = len(self.text) if self.finish is not None else max(self.shown, len(self.text) - self.held_back)
        delta = self.text[self.shown : end]
        self.shown = end
        return delta
