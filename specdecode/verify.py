"""Verification: pure functions from target scores and a draft to the accepted tokens.

No model calls and no cache access here; the engine rolls caches back from the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import PositionNoise, SamplingParams, choose_rows, probabilities


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens were kept (a prefix of the draft)
    next_token: int  # the target's correction (accepted < K) or its bonus token (accepted == K)

    def tokens(self, draft_tokens: list[int]) -> list[int]:
        return list(draft_tokens[: self.accepted]) + [self.next_token]


def greedy_choice(target_logits: torch.Tensor, choice: list[int] | None = None) -> list[int]:
    """Each row's argmax: `choice` where the caller has them already (a batch reads every request's argmaxes
    back in one host sync: batch.py), else one host sync for the whole block."""
    return choice if choice is not None else target_logits.argmax(dim=-1).tolist()


def verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int], choice: list[int] | None = None) -> Verdict:
    """target_logits [K+1, V]: row i scores the token after block position i. Longest matching prefix."""
    choice = greedy_choice(target_logits, choice)
    accepted = 0
    for proposed, wanted in zip(draft_tokens, choice):
        if proposed != wanted:
            break
        accepted += 1
    return Verdict(accepted, choice[accepted])


def verify_sampling(
    target_logits: torch.Tensor, draft_tokens: list[int], params: SamplingParams, noise: PositionNoise, position: int,
    device_kernel: bool | None = None,
) -> Verdict:
    """target_logits [K+1, V]: row i scores sequence position `position + i`.

    The target's token at each position is its seeded draw from the processed distribution of that row
    (PositionNoise.choose: exactly a sample of p, its randomness a function of seed and position only).
    Drafts are kept while they equal those draws, so the output is the seeded plain output token for
    token, whatever was drafted and however; the first differing draw is the correction, and when all K
    match, the next draw is the bonus token. Each row is processed on its own, as plain decoding
    processes its single row, and rows after the first mismatch are never processed.

    device_kernel (None: where the logits are on a GPU): every row's draw at once on the device instead, read in
    one transfer (`draws_together`), the same tokens.
    """
    if target_logits.is_cuda if device_kernel is None else device_kernel:
        return draws_together(target_logits, draft_tokens, params, noise, position)
    for i, proposed in enumerate(draft_tokens):
        wanted = noise.choose(probabilities(target_logits[i : i + 1], params)[0], position + i)
        if proposed != wanted:
            return Verdict(i, wanted)
    k = len(draft_tokens)
    return Verdict(k, noise.choose(probabilities(target_logits[k : k + 1], params)[0], position + k))


def draws_together(target_logits: torch.Tensor, draft_tokens: list[int], params: SamplingParams,
                   noise: PositionNoise, position: int) -> Verdict:
    """verify_sampling's verdict from every row's draw raced together on the device (sampling.choose_rows: the
    Triton kernel) and read once: on a GPU a read per row waits for the device each time. Each row is still
    processed on its own, so its draw is the one verify_sampling (and plain decoding) makes; a row without mass
    fails only where verify_sampling would reach it."""
    rows = len(draft_tokens) + 1
    probs = torch.cat([probabilities(target_logits[i : i + 1], params) for i in range(rows)])
    drawn = choose_rows(probs, [position + i for i in range(rows)], [noise] * rows, device_kernel=True).tolist()
    verdict = verify_greedy(target_logits, draft_tokens, drawn)
    if min(drawn[: verdict.accepted + 1]) < 0:
        raise ValueError("sampling from a distribution with no mass")
    return verdict


def verify_chain(target_logits: torch.Tensor, draft_tokens: list[int], controls, params: SamplingParams,
                 noise: PositionNoise, position: int) -> Verdict:
    """As verify_greedy / verify_sampling, for a request whose controls (penalties, logit bias, a grammar: see
    controls.py) shape each row from the tokens before it. Row i is processed with draft_tokens[:i] pushed on
    the controls' state, as plain decoding would have them at that position; the state is restored on return."""
    pushed = 0
    try:
        for i in range(len(draft_tokens) + 1):
            row = controls.process(target_logits[i : i + 1])  # [1, V]
            if params.greedy:
                wanted = int(row[0].argmax())
            else:
                wanted = noise.choose(probabilities(row, params)[0], position + i)
            if i == len(draft_tokens) or draft_tokens[i] != wanted:
                return Verdict(i, wanted)
            controls.push(draft_tokens[i])
            pushed += 1
    finally:
        controls.undo(pushed)


def verify_tree_greedy(target_logits: torch.Tensor, draft_tokens: list[int], parents: list[int],
                       choice: list[int] | None = None) -> tuple[list[int], int]:
    """Greedy verification of a token tree scored in one pass.

    target_logits [N+1, V]: row j scores the token after block node j (node 0 = last accepted token).
    Walk from the root, each time into the child whose token is the target's argmax. Returns the
    accepted path as block indices (ascending: parents precede children) and the next token.
    """
    choice = greedy_choice(target_logits, choice)
    children: dict[int, dict[int, int]] = {}
    for index, (token, parent) in enumerate(zip(draft_tokens, parents)):
        children.setdefault(parent, {}).setdefault(token, index + 1)
    path: list[int] = []
    node = 0
    while True:
        child = children.get(node, {}).get(choice[node])
        if child is None:
            return path, choice[node]
        path.append(child)
        node = child
