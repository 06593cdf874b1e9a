"""Which replica serves a request: the one whose cache holds the request's prompt prefix, unless it is much busier.

A replica's engine keeps the keys and values of the sequence it ran last and reuses any prefix a new prompt
shares with it (and prompt lookup drafts from that text). With several replicas the reuse only pays if a chat's
next turn, or a prompt repeating a long system text, reaches the replica that ran the earlier one. The router
cuts the prompt into fixed-size blocks of text, chains a hash over them (block i's hash covers blocks 0..i, so
equal hashes mean equal prefixes), and remembers the chains each replica served most recently. The chain starts
from the request's namespace (its client): a replica's engine reuses a cached prefix for the same client only, and
two clients' equal prompts must not be routed as a shared prefix, or the replica that answers (the response's
`replica` field) would tell one client what another sent. A request goes
to the replica holding its longest prefix when that prefix is long enough and that replica's load is within
`max_imbalance` of the least loaded one; otherwise to the least loaded replica, the least recently used among
equals, so an idle replica's cached conversation is the last one overwritten.

Pure Python, no Ray: `cluster.py` feeds it the live replicas and their loads.
"""
from __future__ import annotations

import hashlib
import itertools
from collections import deque
from dataclasses import dataclass


def prompt_text(prompt) -> str:
    """A string that grows by appending when the prompt grows by appending: text as is, chat messages as
    role + content with separators, token ids as a comma-terminated list."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        return "".join(f"\x1e{m.get('role', '')}\x1f{m.get('content', '')}" for m in prompt)
    if isinstance(prompt, list):
        return "".join(f"{token}," for token in prompt)
    return ""


def prefix_chain(text: str, block_chars: int, namespace: str = "") -> list[bytes]:
    """Chained hashes of the complete blocks of `text`: entry i identifies text[: (i + 1) * block_chars] as
    sent from `namespace` (equal text from another namespace hashes differently)."""
    chain = []
    previous = hashlib.blake2b(namespace.encode("utf-8", "surrogatepass"), digest_size=8, person=b"namespace").digest()
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=8).digest()
        chain.append(previous)
    return chain


@dataclass(frozen=True)
class Route:
    replica: str
    matched_chars: int  # the prompt prefix the chosen replica is known to hold
    reason: str  # "prefix" | "least_loaded" | "prefix_too_busy"


class PrefixRouter:
    """Prefix blocks -> replica, with a load override. Not thread-safe: one router per event loop."""

    def __init__(self, block_chars: int = 64, min_prefix_chars: int = 128, max_imbalance: int = 4,
                 sequences_per_replica: int = 1):
        if block_chars < 1 or min_prefix_chars < 0 or max_imbalance < 0 or sequences_per_replica < 1:
            raise ValueError("block_chars and sequences_per_replica must be >= 1, the others >= 0")
        self.block_chars = block_chars
        self.min_blocks = max(1, -(-min_prefix_chars // block_chars))
        self.max_imbalance = max_imbalance
        # An engine caches one sequence: what a replica holds is what it ran last (a deque, should engines keep more).
        self.sequences_per_replica = sequences_per_replica
        self._held: dict[str, deque[frozenset[bytes]]] = {}
        self._clock = itertools.count()
        self._last_used: dict[str, int] = {}

    def chain(self, prompt, namespace: str = "") -> list[bytes]:
        return prefix_chain(prompt_text(prompt), self.block_chars, namespace)

    def matched_blocks(self, chain: list[bytes], replica: str) -> int:
        """How many leading blocks of `chain` the replica holds (a chained hash stands for its whole prefix)."""
        best = 0
        for held in self._held.get(replica, ()):
            for blocks in range(len(chain), best, -1):
                if chain[blocks - 1] in held:
                    best = blocks
                    break
        return best

    def choose(self, chain: list[bytes], loads: dict[str, int]) -> Route:
        """`loads`: requests running or queued on each live replica (the candidates)."""
        if not loads:
            raise ValueError("no replica to route to")
        lightest = min(loads.values())
        matches = {replica: self.matched_blocks(chain, replica) for replica in loads}
        best = max(loads, key=lambda r: (matches[r], -loads[r], -self._last_used.get(r, -1)))
        if matches[best] >= self.min_blocks:
            if loads[best] - lightest <= self.max_imbalance:
                return Route(best, matches[best] * self.block_chars, "prefix")
            reason = "prefix_too_busy"
        else:
            reason = "least_loaded"
        least = min(loads, key=lambda r: (loads[r], self._last_used.get(r, -1)))
        return Route(least, matches[least] * self.block_chars, reason)

    def record(self, chain: list[bytes], replica: str) -> None:
        """The replica now runs this prompt: its cache will hold the prefix, and what it held before is gone."""
        self._held.setdefault(replica, deque(maxlen=self.sequences_per_replica)).append(frozenset(chain))
        self._last_used[replica] = next(self._clock)

    def forget(self, replica: str) -> None:
        """A replica left (died, scaled down): its cache went with it."""
        self._held.pop(replica, None)
        self._last_used.pop(replica, None)

    def keep_only(self, replicas) -> None:
        for replica in set(self._held) | set(self._last_used):
            if replica not in replicas:
                self.forget(replica)
