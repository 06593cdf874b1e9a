"""One speculative step: draft, score the draft in one target pass, keep what the target agrees with.

Where each returned token came from, named as in the literature:
- accepted:  a draft token the target agreed with;
- recovered: the target's own token where it rejected a draft token;
- bonus:     the target's token after it accepted the whole draft;
- plain:     the target's token of a step that drafted nothing.
A step returns accepted + 1 tokens, so "tokens per target pass" counts the recovered or bonus token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .cache import KVCache
from .drafters.base import Draft, Drafter
from .models.transformer import Segment, tree_mask, tree_positions
from .sampling import PositionNoise, SamplingParams
from .verify import verify_greedy, verify_sampling, verify_tree_greedy


@dataclass
class StepResult:
    tokens: list[int]  # the accepted draft tokens, then the target's own token
    origins: list[str]  # per token: accepted / recovered / bonus / plain
    draft: Draft
    draft_seconds: float
    verify_seconds: float

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1

    @property
    def block_size(self) -> int:
        """Tokens the target scored in its pass: the last confirmed token plus the draft."""
        return 1 + len(self.draft.tokens)


def speculative_step(target, cache: KVCache, drafter: Drafter | None, sequence: list[int], k: int,
                     sampling: SamplingParams, noise: PositionNoise, stop_rule=None) -> StepResult:
    """Extend `sequence` (every confirmed token; the target cache holds all but its last) by one step.

    On return the target cache holds `sequence + tokens` minus the new last token, and the drafter has
    dropped whatever it drafted past the accepted tokens. k = 0 (or no drafter) is a plain decoding step.
    """
    t0 = time.perf_counter()
    draft = propose(drafter, sequence, k, sampling, noise, stop_rule)
    t1 = time.perf_counter()
    accepted, next_token = verify_block(target, cache, sequence, draft, sampling, noise)
    t2 = time.perf_counter()
    return finish_step(drafter, sequence, accepted, next_token, draft, t1 - t0, t2 - t1)


def propose(drafter: Drafter | None, sequence: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
            stop_rule=None) -> Draft:
    """The drafter's proposal for the tokens after `sequence` (nothing for k = 0 or plain decoding)."""
    return drafter.propose(sequence, k, sampling, noise, stop_rule) if drafter is not None and k > 0 else Draft()


def finish_step(drafter: Drafter | None, sequence: list[int], accepted: list[int], next_token: int, draft: Draft,
                draft_seconds: float, verify_seconds: float) -> StepResult:
    """The drafter drops what was not accepted; the step's tokens with their origins."""
    tokens = accepted + [next_token]
    if drafter is not None:
        drafter.sync(sequence + tokens)
    return StepResult(tokens, step_origins(len(accepted), draft.drafted), draft, draft_seconds, verify_seconds)


def block_segment(cache: KVCache, sequence: list[int], draft: Draft) -> Segment:
    """The rows a target pass scores for this draft: the last confirmed token, then the draft (chain or tree)."""
    return Segment([sequence[-1]] + draft.tokens, cache, "all", draft.parents)


def verify_block(target, cache: KVCache, sequence: list[int], draft: Draft, sampling: SamplingParams,
                 noise: PositionNoise) -> tuple[list[int], int]:
    """One target pass over [last confirmed token] + draft (a chain, or a tree when draft.parents is set).

    Returns (accepted draft tokens, the target's next token) and rolls the cache back to the accepted path.
    """
    device = target.device
    start = cache.length
    block = [sequence[-1]] + draft.tokens
    tokens = torch.tensor(block, device=device)
    if draft.is_tree:
        logits = target(tokens, cache, positions=tree_positions(start, draft.parents, device),
                        attn_mask=tree_mask(start, draft.parents, device))
    else:
        logits = target(tokens, cache, logits="all")  # [1 + K, V]
    return judge_block(logits, cache, start, sequence, draft, sampling, noise)


def judge_block(logits: torch.Tensor, cache: KVCache, start: int, sequence: list[int], draft: Draft,
                sampling: SamplingParams, noise: PositionNoise) -> tuple[list[int], int]:
    """From the target's logits of a block (written to the cache at `start`): the accepted draft tokens and
    the target's next token; the cache is rolled back to the accepted path."""
    if draft.is_tree:
        path, next_token = verify_tree_greedy(logits, draft.tokens, draft.parents)
        cache.compact(start, [0] + path)  # keep the keys/values of the accepted branch, in order
        block = [sequence[-1]] + draft.tokens
        return [block[i] for i in path], next_token
    if sampling.greedy:
        verdict = verify_greedy(logits, draft.tokens)
    else:
        verdict = verify_sampling(logits, draft.tokens, sampling, noise, position=len(sequence))
    cache.truncate(start + 1 + verdict.accepted)
    return draft.tokens[: verdict.accepted], verdict.next_token


def step_origins(accepted: int, drafted: int) -> list[str]:
    if drafted == 0:
        last = "plain"
    else:
        last = "bonus" if accepted >= drafted else "recovered"
    return ["accepted"] * accepted + [last]
