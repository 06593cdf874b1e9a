"""A bounded store of earlier requests' token sequences (prompt and answer), searchable by suffix.

The suffix drafter copies from it what followed the longest earlier occurrence of the current
context's last tokens, as SuffixDecoding does across requests: agents, retries and repeated
questions restate what an earlier answer said. Each sequence belongs to a namespace (in the server,
one client's key and user), and a lookup sees only its own namespace: one client's text is never
proposed for another's request, so the speed of a request says nothing about other clients' text.
The store holds at most `max_tokens` tokens. Past that, the owner holding the most gives up its least recently
added or matched sequence: a client's traffic pushes out its own text first, so how long one client's text stays
(and so how fast its repeats draft) does not tell it how much the others sent unless it is itself the largest. The
owner of a namespace "owner/name" is its part before the slash (the server's namespaces name the client's fair-queue
lane there: key id and peer address), so the namespaces a client mints with `user` fields or bearer tokens share one
owner's holding instead of each counting as a small holder; a namespace without a slash is its own owner.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from ..errors import InputError

# Length of the n-grams the store indexes: a match starts from the context's last STORE_NGRAM tokens.
STORE_NGRAM = 3


def owner_of(namespace: str) -> str:
    """Whose share of the store a namespace's text counts against: its part before the first slash."""
    return namespace.partition("/")[0]


@dataclass(frozen=True)
class StoreMatch:
    tokens: list[int]  # the earlier sequence
    end: int  # index in tokens of the last matched token
    length: int  # matched tokens, counted back from end


class SuffixStore:
    def __init__(self, max_tokens: int = 262_144, max_candidates: int = 64):
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise InputError(f"the suffix store holds a whole number >= 0 of tokens, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.max_candidates = max_candidates
        self.tokens = 0  # tokens held, over every namespace
        self._held: Counter[str] = Counter()  # tokens held per owner (owner_of)
        self._docs: OrderedDict[int, tuple[str, list[int]]] = OrderedDict()  # oldest first
        self._latest: dict[str, int] = {}  # namespace -> its most recently added sequence
        # (namespace, n-gram) -> {sequence id: end positions of that n-gram in it}
        self._index: dict[tuple, dict[int, list[int]]] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, namespace: str, tokens: list[int]) -> None:
        """Keep a finished sequence. One that continues the namespace's latest sequence (the next turn of
        a chat) replaces it, so a conversation is held once."""
        tokens = list(tokens[-self.max_tokens :]) if self.max_tokens else []
        if len(tokens) <= STORE_NGRAM:
            return
        latest = self._latest.get(namespace)
        if latest is not None and latest in self._docs:
            previous = self._docs[latest][1]
            if tokens[: len(previous)] == previous:
                self._evict(latest)
            elif previous[: len(tokens)] == tokens:
                self._docs.move_to_end(latest)
                return
        while self._docs and self.tokens + len(tokens) > self.max_tokens:
            self._evict(self._oldest_of_largest(namespace, len(tokens)))
        doc_id = self._next_id
        self._next_id += 1
        self._docs[doc_id] = (namespace, tokens)
        self._latest[namespace] = doc_id
        self.tokens += len(tokens)
        self._held[owner_of(namespace)] += len(tokens)
        for end in range(STORE_NGRAM - 1, len(tokens)):
            key = (namespace, *tokens[end - STORE_NGRAM + 1 : end + 1])
            self._index.setdefault(key, {}).setdefault(doc_id, []).append(end)

    def _oldest_of_largest(self, adding: str, incoming: int) -> int:
        """The sequence to evict: the least recent one of the owner that would hold the most (the one adding
        counted with what it adds, and first on a tie)."""
        mine = owner_of(adding)
        largest = max(self._held, key=lambda owner: (self._held[owner] + (incoming if owner == mine else 0), owner == mine))
        return next(doc_id for doc_id, (namespace, _) in self._docs.items() if owner_of(namespace) == largest)

    def _evict(self, doc_id: int) -> None:
        namespace, tokens = self._docs.pop(doc_id)
        self.tokens -= len(tokens)
        owner = owner_of(namespace)
        self._held[owner] -= len(tokens)
        if not self._held[owner]:
            del self._held[owner]
        for end in range(STORE_NGRAM - 1, len(tokens)):
            key = (namespace, *tokens[end - STORE_NGRAM + 1 : end + 1])
            holders = self._index.get(key)
            if holders is not None:
                holders.pop(doc_id, None)
                if not holders:
                    del self._index[key]
        if self._latest.get(namespace) == doc_id:
            del self._latest[namespace]

    def best_match(self, namespace: str, context: list[int], max_match: int) -> StoreMatch | None:
        """The earlier occurrence of context's last tokens that matches furthest back (the most recent
        sequence on a tie), with at least one token after it to copy."""
        if len(context) < STORE_NGRAM:
            return None
        holders = self._index.get((namespace, *context[-STORE_NGRAM:]))
        if not holders:
            return None
        best: tuple[int, int, int] | None = None  # (length, doc id, end)
        seen = 0
        last = len(context) - 1
        for doc_id in reversed(list(holders)):  # newest sequences first
            tokens = self._docs[doc_id][1]
            for end in reversed(holders[doc_id]):
                if end + 1 >= len(tokens):
                    continue
                length = STORE_NGRAM
                while length < max_match and end - length >= 0 and length <= last and tokens[end - length] == context[last - length]:
                    length += 1
                if best is None or length > best[0]:
                    best = (length, doc_id, end)
                seen += 1
                if seen >= self.max_candidates:
                    break
            if seen >= self.max_candidates:
                break
        if best is None:
            return None
        length, doc_id, end = best
        self._docs.move_to_end(doc_id)  # a sequence that keeps matching stays
        return StoreMatch(self._docs[doc_id][1], end, length)
