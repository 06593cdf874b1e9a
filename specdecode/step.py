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
from dataclasses import dataclass, replace

import torch

from .cache import KVCache
from .controls import RowControls, TokenLogprob, record_logprobs
from .drafters.base import Draft, Drafter, DraftSteps, run_alone
from .models.transformer import Segment, tree_mask, tree_positions
from .sampling import PositionNoise, SamplingParams
from .verify import Verdict, verify_chain, verify_greedy, verify_sampling, verify_tree_greedy


@dataclass
class StepResult:
    tokens: list[int]  # the accepted draft tokens, then the target's own token
    origins: list[str]  # per token: accepted / recovered / bonus / plain
    draft: Draft
    draft_seconds: float
    verify_seconds: float
    logprobs: list[TokenLogprob] | None = None  # per token, where the request asked for them

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1

    @property
    def block_size(self) -> int:
        """Tokens the target scored in its pass: the last confirmed token plus the draft."""
        return 1 + len(self.draft.tokens)


def speculative_step(target, cache: KVCache, drafter: Drafter | None, sequence: list[int], k: int,
                     sampling: SamplingParams, noise: PositionNoise, stop_rule=None,
                     controls: RowControls | None = None) -> StepResult:
    """Extend `sequence` (every confirmed token; the target cache holds all but its last) by one step.

    On return the target cache holds `sequence + tokens` minus the new last token, and the drafter has
    dropped whatever it drafted past the accepted tokens. k = 0 (or no drafter) is a plain decoding step.
    """
    t0 = time.perf_counter()
    draft = propose(drafter, sequence, k, sampling, noise, stop_rule, controls)
    t1 = time.perf_counter()
    judged = verify_block(target, cache, sequence, draft, sampling, noise, controls)
    t2 = time.perf_counter()
    return finish_step(drafter, sequence, judged, draft, t1 - t0, t2 - t1, controls)


def propose(drafter: Drafter | None, sequence: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
            stop_rule=None, controls: RowControls | None = None, forced_limit: int = 0) -> Draft:
    """The drafter's proposal for the tokens after `sequence` (nothing for k = 0 or plain decoding), cut where a
    grammar forbids a token, and followed by up to forced_limit tokens the grammar forces (free drafts)."""
    return run_alone(propose_steps(drafter, sequence, k, sampling, noise, stop_rule, controls, forced_limit))


def propose_steps(drafter: Drafter | None, sequence: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                  stop_rule=None, controls: RowControls | None = None, forced_limit: int = 0) -> DraftSteps:
    """`propose` as a generator of the draft-model passes it needs (drafters/base.py, DraftSteps)."""
    draft = Draft()
    if drafter is not None and k > 0:
        draft = yield from drafter.propose_steps(sequence, k, sampling, noise, stop_rule)
    if controls is None or controls.matcher is None or draft.is_tree:
        return draft
    valid = controls.valid_prefix(draft.tokens)
    if valid < len(draft.tokens):
        draft = replace(draft, tokens=draft.tokens[:valid], confidences=draft.confidences[:valid])
    forced = controls.forced_after(draft.tokens, forced_limit - valid) if drafter is not None else []
    if forced:  # confidence NaN: the calibration of the drafter's own tokens must not learn from them
        own = draft.confidences if len(draft.confidences) == valid else [float("nan")] * valid
        draft = replace(draft, tokens=draft.tokens + forced, confidences=own + [float("nan")] * len(forced),
                        forced=len(forced))
    return draft


@dataclass
class Judged:
    accepted: list[int]  # the draft tokens kept
    next_token: int  # the target's own token after them
    logprobs: list[TokenLogprob] | None = None  # per token of accepted + [next_token], where asked for


def finish_step(drafter: Drafter | None, sequence: list[int], judged: Judged, draft: Draft,
                draft_seconds: float, verify_seconds: float, controls: RowControls | None = None) -> StepResult:
    """The drafter drops what was not accepted, the controls take the step's tokens; the tokens with their origins."""
    tokens = judged.accepted + [judged.next_token]
    if drafter is not None:
        drafter.sync(sequence + tokens)
    if controls is not None:
        controls.commit(tokens)
    return StepResult(tokens, step_origins(len(judged.accepted), draft.drafted), draft, draft_seconds, verify_seconds,
                      judged.logprobs)


def block_segment(cache: KVCache, sequence: list[int], draft: Draft) -> Segment:
    """The rows a target pass scores for this draft: the last confirmed token, then the draft (chain or tree)."""
    return Segment([sequence[-1]] + draft.tokens, cache, "all", draft.parents)


def verify_block(target, cache: KVCache, sequence: list[int], draft: Draft, sampling: SamplingParams,
                 noise: PositionNoise, controls: RowControls | None = None) -> Judged:
    """One target pass over [last confirmed token] + draft (a chain, or a tree when draft.parents is set).

    Returns the accepted draft tokens and the target's next token, and rolls the cache back to the accepted path.
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
    return judge_block(logits, cache, start, sequence, draft, sampling, noise, controls)


def judges_by_argmax(draft: Draft, sampling: SamplingParams, controls: RowControls | None) -> bool:
    """Whether judge_block reads only each row's argmax of the raw logits (greedy, nothing shaping the rows)."""
    return draft.is_tree or (sampling.greedy and not (controls is not None and controls.spec.shapes_rows))


def judge_block(logits: torch.Tensor, cache: KVCache, start: int, sequence: list[int], draft: Draft,
                sampling: SamplingParams, noise: PositionNoise, controls: RowControls | None = None,
                choice: list[int] | None = None, verdict: Verdict | None = None) -> Judged:
    """From the target's logits of a block (written to the cache at `start`): the accepted draft tokens and
    the target's next token; the cache is rolled back to the accepted path. choice: the rows' argmaxes, read
    already (only where judges_by_argmax), or a sampled chain's seeded draws (batch.judges_by_draws). verdict: a greedy chain's verdict, judged already on the device with
    other requests' (accept.py; only where judges_by_argmax)."""
    if draft.is_tree:  # (Engine.request refuses trees where controls shape the rows)
        path, next_token = verify_tree_greedy(logits, draft.tokens, draft.parents, choice)
        cache.compact(start, [0] + path)  # keep the keys/values of the accepted branch, in order
        block = [sequence[-1]] + draft.tokens
        accepted = [block[i] for i in path]
        # Row j scores the token after node j: the path's rows score its tokens, the last one the next token.
        return Judged(accepted, next_token, _logprobs(logits[[0] + path], accepted + [next_token], controls))
    if verdict is not None:
        pass  # judged with the pass's other greedy chains (batch.py)
    elif controls is not None and controls.spec.shapes_rows:
        verdict = verify_chain(logits, draft.tokens, controls, sampling, noise, position=len(sequence))
    elif sampling.greedy or choice is not None:  # (a sampled chain's choice: its rows' draws, batch.py)
        verdict = verify_greedy(logits, draft.tokens, choice)
        if verdict.next_token < 0:  # a drawn row without mass, reached as verify_sampling would reach it
            raise ValueError("sampling from a distribution with no mass")
    else:
        verdict = verify_sampling(logits, draft.tokens, sampling, noise, position=len(sequence))
    cache.truncate(start + 1 + verdict.accepted)
    accepted = draft.tokens[: verdict.accepted]
    return Judged(accepted, verdict.next_token, _logprobs(logits, accepted + [verdict.next_token], controls))


def _logprobs(rows: torch.Tensor, tokens: list[int], controls: RowControls | None) -> list | None:
    """rows [>= len(tokens), V]: row i scored tokens[i]. Their records where the request asked for them, else None."""
    if controls is None or controls.spec.logprobs is None:
        return None
    return record_logprobs(rows, tokens, controls.spec.logprobs)


def step_origins(accepted: int, drafted: int) -> list[str]:
    if drafted == 0:
        last = "plain"
    else:
        last = "bonus" if accepted >= drafted else "recovered"
    return ["accepted"] * accepted + [last]
