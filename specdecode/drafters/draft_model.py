"""Drafting with a small model of the same tokenizer, run autoregressively on its own KV cache.

Each proposal is written as a generator of the draft passes it needs (`propose_steps`): it yields
(model, Segment) for every pass and is sent back that pass's logits. Alone, `run_alone` answers each pass
with its own forward call; the batched engine (batch_draft.py) answers the passes of many sequences' drafters
with one `forward_batch` per draft position. Both run the same proposal code on rows the kernels compute
alike, so a sequence drafts the same tokens either way.
"""
from __future__ import annotations

from typing import Generator

import torch

from ..errors import InputError
from ..models.transformer import Segment
from ..sampling import PositionNoise, SamplingParams, probabilities
from .base import ChainRound, Draft, Drafter, DrafterTraits, DraftSteps, StopRule, run_alone


DRAFT_PREFILL_CHUNK = 1024  # prompt tokens a draft model reads per pass


def common_prefix_len(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    i = 0
    while i < limit and a[i] == b[i]:
        i += 1
    return i


def top_tensors(logits: torch.Tensor, confidence: bool = True, argmax: bool = True) -> list[torch.Tensor]:
    """The row's top probability and argmax as float64 scalars where they are (those asked for, in that order), for
    a caller that reads them with others at once (batch_draft's read-ahead)."""
    return ([torch.softmax(logits.float(), -1).max().double()] if confidence else []) + \
        ([logits.argmax().double()] if argmax else [])


def top_choice(logits: torch.Tensor, confidence: bool, argmax: bool) -> tuple[float, int | None]:
    """The row's top probability (NaN where not asked) and argmax (None where not asked), read to the host at once:
    on a GPU each read waits for the device."""
    wanted = top_tensors(logits, confidence, argmax)
    values = torch.stack(wanted).tolist() if wanted else []
    top = values.pop(0) if confidence else float("nan")
    return top, (int(values[0]) if argmax else None)


class DraftModelDrafter(Drafter):
    name = "draft"
    traits = DrafterTraits(stop_rule=True, reads_prompt=True)

    def __init__(self, model, max_len: int, opening=None, prefill_chunk: int = DRAFT_PREFILL_CHUNK):
        """opening: the model's opening.Opening (its rows copied where a context starts with it), or None."""
        self.model = model
        self.cache = model.new_cache(max_len)
        self.cached: list[int] = []  # the tokens whose keys/values the draft cache holds, in order
        self.opening = opening
        self.prefill_chunk = prefill_chunk
        self.last_sync_tokens = 0  # tokens the last propose had to feed before drafting (1-2 normally)
        # Ids the draft has embedding rows for: a target with a longer padded table may emit (or be given) one
        # past them, which the draft cannot read; it then drafts nothing for that sequence (outputs unchanged).
        config = getattr(model, "config", None)
        self.rows = config.vocab_size if config is not None else getattr(model, "vocab_size", None)
        # Chains past their first token drafted in one device round (gpu/draft_round.py), on the GPU path
        self.device_rounds = getattr(model, "exact_pass", None) is not None
        self.read_ahead: tuple[float, int] | None = None  # the next token's choice as a batch read it (_received)

    @property
    def model_drafter(self) -> "DraftModelDrafter":
        return self

    def reset(self) -> None:
        self.cache.truncate(0)
        self.cached = []

    def _feed(self, tokens: list[int], logits: str) -> Generator:
        """Make the cache hold exactly `tokens`, reusing the common prefix; logits after the last one fed.
        A generator of the draft passes it needs (see the module's docstring)."""
        self.read_ahead = None
        limit = len(tokens) - 1 if logits != "none" else len(tokens)
        keep = min(common_prefix_len(self.cached, tokens), limit)
        self.cache.truncate(keep)
        del self.cached[keep:]
        if self.opening is not None:
            self.opening.restore(self.cache, self.cached, tokens[:limit])
        pending = tokens[len(self.cached):]
        self.last_sync_tokens = len(pending)
        if self.rows is not None and pending and max(pending) >= self.rows:
            return None
        while len(pending) > self.prefill_chunk:
            chunk, pending = pending[: self.prefill_chunk], pending[self.prefill_chunk :]
            yield self.model, Segment(chunk, self.cache, "none")
            self.cached.extend(chunk)
        if not pending:
            return None
        out = yield self.model, Segment(pending, self.cache, logits)
        self.cached.extend(pending)
        return self._received(out)

    def _next_logits(self, token: int) -> Generator:
        """One draft pass over `token`: the logits after it ([V])."""
        out = yield self.model, Segment([token], self.cache, "last")
        self.cached.append(token)
        return self._received(out)

    def _received(self, out):
        """A pass's last row of logits; where a batch read its top choice with the other sequences' at once
        (batch_draft.ReadAhead), that choice is kept for the proposal's next token."""
        self.read_ahead = getattr(out, "top", None)
        out = getattr(out, "logits", out)
        return None if out is None else out[-1]

    def _top_choice(self, logits, confidence: bool, argmax: bool) -> tuple[float, int | None]:
        """top_choice of the row just received: as a batch read it, or read now."""
        ahead, self.read_ahead = self.read_ahead, None
        return ahead if ahead is not None else top_choice(logits, confidence, argmax)

    def prefill(self, context: list[int]) -> None:
        """Consume the prompt (all but its last token) so that proposals only feed the newest tokens.
        A prompt the draft's context cannot hold is not read: proposals then draft nothing."""
        if len(context) < self.cache.max_len:
            run_alone(self._feed(context[:-1], logits="none"))

    def unread_tokens(self, context: list[int]) -> int:
        held = common_prefix_len(self.cached, context[:-1])
        if self.opening is not None:
            held = max(held, self.opening.covers(context[:-1], self.cache))
        return max(0, len(context) - 1 - held)

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        return run_alone(self.propose_steps(context, k, sampling, noise, stop_rule))

    def propose_steps(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                      stop_rule: StopRule | None = None) -> DraftSteps:
        k = min(k, self.cache.max_len - len(context))
        if k <= 0:
            return Draft()
        logits = yield from self._feed(context, logits="last")  # whatever of context the cache lacks
        if logits is None:  # an id the draft has no row for
            return Draft()
        passes = 1
        tokens: list[int] = []
        confidences: list[float] = []
        chain_prob = 1.0  # predicted chance that every token kept so far is accepted
        rule = stop_rule
        while True:
            probs_row = probabilities(logits[None], sampling)[0] if not sampling.greedy else None
            confidence, token = self._top_choice(logits, rule is not None, probs_row is None)
            confidence = confidence if rule is not None else float("nan")
            if rule is not None:
                if not rule.keep(len(tokens), chain_prob, confidence):
                    break
                chain_prob *= rule.chance(len(tokens), confidence)
            if probs_row is not None:
                token = noise.choose(probs_row, len(context) + len(tokens))
            tokens.append(token)
            confidences.append(confidence)
            if len(tokens) >= k or (rule is not None and not rule.extend(len(tokens), chain_prob, confidence)):
                break
            if self.device_rounds:
                answer = yield self.model, ChainRound(self.cache, token, k - len(tokens), sampling, noise,
                                                      len(context) + len(tokens))
                if answer is not None:
                    passes += self._take_round(token, answer, tokens, confidences, k, rule, chain_prob)
                    break
            logits = yield from self._next_logits(token)
            passes += 1
        return Draft(tokens, forward_passes=passes, catch_up=self.last_sync_tokens, confidences=confidences)

    def _take_round(self, token: int, answer, tokens: list[int], confidences: list[float], k: int,
                    rule: StopRule | None, chain_prob: float) -> int:
        """The tokens of a device round (ChainRound) kept as the pass-by-pass loop would have kept them: the stop
        rule now reads the round's confidences after the fact (the round drafted them all at once), so the draft
        is the same tokens, cut at the same place. Returns the round's passes; the cache holds what they fed."""
        chosen, probs = answer
        self.cached.extend([token] + chosen[:-1])
        for token, confidence in zip(chosen, probs):
            if rule is not None:
                if not rule.keep(len(tokens), chain_prob, confidence):
                    break
                chain_prob *= rule.chance(len(tokens), confidence)
            tokens.append(token)
            confidences.append(confidence if rule is not None else float("nan"))
            if len(tokens) >= k or (rule is not None and not rule.extend(len(tokens), chain_prob, confidence)):
                break
        return len(chosen)

    def sync(self, context: list[int]) -> None:
        keep = common_prefix_len(self.cached, context)
        self.cache.truncate(keep)
        del self.cached[keep:]

    def propose_tree(self, context: list[int], k: int, branch_min_prob: float = 0.1) -> Draft:
        return run_alone(self.tree_steps(context, k, branch_min_prob))

    def tree_steps(self, context: list[int], k: int, branch_min_prob: float = 0.1) -> DraftSteps:
        """Greedy token tree: a chain of the draft's top choices, plus the runner-up at each depth as a leaf
        when the draft gives it at least branch_min_prob. Costs the same draft passes as a chain of k."""
        k = min(k, (self.cache.max_len - len(context)) // 2)
        if k <= 0:
            return Draft()
        logits = yield from self._feed(context, logits="last")
        if logits is None:
            return Draft()
        passes = 1
        tokens: list[int] = []
        parents: list[int] = []
        chain_parent = 0  # block index of the current chain node (0 = the last accepted token)
        for depth in range(k):
            top = torch.topk(torch.softmax(logits.float(), -1), 2)
            # one read for the depth (on a GPU each read waits for the device): both probabilities and both ids
            _, runner_up, best, second = torch.cat([top.values.double(), top.indices.double()]).tolist()
            best = int(best)
            chain_parent = add_depth(tokens, parents, chain_parent, best, int(second), runner_up, branch_min_prob)
            if depth + 1 == k:
                break
            if self.device_rounds:  # the depths left as one device round, read once
                answer = yield self.model, ChainRound(self.cache, best, k - depth - 1, tree=True)
                if answer is not None:
                    passes += self._take_tree_round(best, answer, tokens, parents, chain_parent, branch_min_prob)
                    break
            logits = yield from self._next_logits(best)
            passes += 1
        return Draft(tokens, forward_passes=passes, parents=parents, chain_length=k, catch_up=self.last_sync_tokens)

    def _take_tree_round(self, best: int, answer, tokens: list[int], parents: list[int], chain_parent: int,
                         branch_min_prob: float) -> int:
        """A tree's depths from a device round (ChainRound with tree): each depth's top token on the chain and its
        runner-up as a leaf where the draft gives it branch_min_prob, as the loop adds them. Returns the round's
        passes; the cache holds what they fed."""
        chosen, runner_ups, seconds = answer
        self.cached.extend([best] + chosen[:-1])
        for token, runner_up, second in zip(chosen, runner_ups, seconds):
            chain_parent = add_depth(tokens, parents, chain_parent, token, second, runner_up, branch_min_prob)
        return len(chosen)


def add_depth(tokens: list[int], parents: list[int], chain_parent: int, best: int, second: int, runner_up: float,
              branch_min_prob: float) -> int:
    """One depth of a greedy token tree: the top token on the chain, the runner-up as a leaf beside it where the
    draft gives it branch_min_prob. Returns the block index of the new chain node."""
    tokens.append(best)
    parents.append(chain_parent)
    best_index = len(tokens)
    if runner_up >= branch_min_prob:
        tokens.append(second)
        parents.append(chain_parent)
    return best_index


class TreeDrafter(DraftModelDrafter):
    """Draft model proposing token trees (greedy decoding only: the sampling rule here is for chains)."""

    name = "tree"
    # Trees are shaped by branch probability, not ended by the stop rule; each depth holds the chain token and,
    # where likely enough, the runner-up.
    traits = DrafterTraits(greedy_only=True, tokens_per_depth=2, reads_prompt=True)

    def __init__(self, model, max_len: int, opening=None, branch_min_prob: float = 0.1):
        super().__init__(model, max_len, opening)
        self.branch_min_prob = branch_min_prob

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                stop_rule: StopRule | None = None) -> Draft:
        return run_alone(self.propose_steps(context, k, sampling, noise, stop_rule))

    def propose_steps(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionNoise,
                      stop_rule: StopRule | None = None) -> DraftSteps:
        if not sampling.greedy:
            raise InputError("token-tree drafting supports greedy decoding only; use --draft with a chain for sampling")
        return (yield from self.tree_steps(context, k, self.branch_min_prob))
