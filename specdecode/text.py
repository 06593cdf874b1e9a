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
    """Owns the answer: its tokens, their origins and text, and the reason it ended.

    Of the text it keeps only what a stop string may still cut (`window`: the text not yet handed out), so each
    token costs the same however long the answer has grown; the handed-out text is the events' to keep."""

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
        self.starts: list[int] = []  # per token, where its text starts in the answer's text
        self.origin_counts: Counter = Counter()
        self.shown = 0  # characters of text already handed out
        self.window = ""  # the text from `shown` on
        self.released: list[str] = []  # the text handed out, as it was (only `text` reads it)
        self.finish: str | None = None

    @property
    def text(self) -> str:
        """The answer's text so far (held-back text included)."""
        return "".join(self.released) + self.window

    @property
    def budget(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def push(self, tokens: list[int], origins: list[str], cancel: bool = False, sources: list[str] | None = None,
             logprobs: list | None = None) -> TextStep:
        """Add one step's tokens, in the order the target produced them, and hand out their text (`take`, then
        `release`); cancel ends the answer after them."""
        self.take(tokens, origins, cancel, sources, logprobs)
        return self.release()

    def take(self, tokens: list[int], origins: list[str], cancel: bool = False, sources: list[str] | None = None,
             logprobs: list | None = None) -> None:
        """Add one step's tokens up to an EOS or the budget; cancel ends the answer after them. Their text, and a
        stop string in it (which ends the answer at the token that completes it, dropping the tokens after), waits
        for `release`. sources: per token, which source drafted it (accepted tokens of a multi-source drafter),
        else "". logprobs: per token, its log-probability record (where the request asked for them)."""
        for i, (token, origin) in enumerate(zip(tokens, origins)):
            if token in self.eos_ids:
                self.finish = "stop"
                break
            self.tokens.append(token)
            self.origins.append(origin)
            self.sources.append(sources[i] if sources else "")
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
            self.origin_counts[origin] += 1
            if len(self.tokens) >= self.max_new_tokens:
                self.finish = "length"
                break
        if self.finish is None and cancel:
            self.finish = "cancelled"

    def release(self) -> TextStep:
        """The text of the tokens taken since the last release, and those tokens: what is safe to show of it, all
        of it once the answer is over."""
        first = len(self.starts)  # the first token whose text is not known yet
        for token in self.tokens[first:]:
            start = self.shown + len(self.window)
            self.starts.append(start)
            self.window += self.detokenizer.push(token)
            # Token by token, as plain decoding checks: the stop string that completes first ends the answer,
            # whatever else a step's later tokens would complete (["\nUser:", "User"] stops at "User").
            if self.stops and self._cut_at_stop_string(start):
                break
        if self.finish is not None:
            self._flush()
        ends = self.starts[first + 1 :] + [self.shown + len(self.window)]
        pieces = [self.window[start - self.shown : end - self.shown] for start, end in zip(self.starts[first:], ends)]
        return TextStep(self._release(), self.tokens[first:], self.origins[first:], pieces, self.finish,
                        self.sources[first:], self.logprobs[first:])

    def end(self, reason: str) -> TextStep:
        """End the answer where it stands (the context is full): hand out what was held back."""
        self.finish = self.finish or reason
        return self.release()

    def _flush(self) -> None:
        """The answer is over: the bytes of an unfinished character join the text, as a decode of its tokens."""
        new_from = self.shown + len(self.window)
        rest = self.detokenizer.flush()
        self.window += rest
        if rest:
            self._cut_at_stop_string(new_from)

    def _cut_at_stop_string(self, new_from: int) -> bool:
        """End the answer before a stop string that the text from new_from on completes (none ended earlier:
        the text is checked after each token). Of several, the one that starts first. The text handed out is
        never searched again: it was held back while it could start a stop string (held_back), so any stop string
        new text completes starts in the window."""
        def search_from(stop: str) -> int:
            return max(0, new_from - self.shown - len(stop) + 1)

        found = [pos for s in self.stops if (pos := self.window.find(s, search_from(s))) >= 0]
        if not found:
            return False
        self.window = self.window[: min(found)]
        self.finish = "stop"
        # The answer ends where the stop string starts: tokens whose text starts at or after it are not output.
        keep = bisect.bisect_left(self.starts, self.shown + len(self.window))
        for origin in self.origins[keep:]:  # in place: the generation's statistics hold this Counter
            self.origin_counts[origin] -= 1
            if not self.origin_counts[origin]:
                del self.origin_counts[origin]
        del self.tokens[keep:], self.origins[keep:], self.sources[keep:], self.starts[keep:], self.logprobs[keep:]
        return True

    def _release(self) -> str:
        length = self.shown + len(self.window)
        end = length if self.finish is not None else max(self.shown, length - self.held_back)
        delta, self.window = self.window[: end - self.shown], self.window[end - self.shown :]
        if delta:
            self.released.append(delta)
        self.shown = end
        return delta
