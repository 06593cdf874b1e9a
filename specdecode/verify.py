"""Verification: pure functions from target scores and a draft to the accepted tokens.

No model calls and no cache access here; the engine rolls caches back from the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens were kept (a prefix of the draft)
    next_token: int  # the target's correction (accepted < K) or its bonus token (accepted == K)

    def tokens(self, draft_tokens: list[int]) -> list[int]:
        return list(draft_tokens[: self.accepted]) + [self.next_token]


def verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int]) -> Verdict:
    """target_logits [K+1, V]: row i scores the token after block position i. Longest matching prefix."""
    choice = target_logits.argmax(dim=-1).tolist()  # one host sync for the whole block
    accepted = 0
    for proposed, wanted in zip(draft_tokens, choice):
        if proposed != wanted:
            break
        accepted += 1
    return Verdict(accepted, choice[accepted])


def verify_sampling(
    target_probs: torch.Tensor,  # [K+1, V] processed target distributions p
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,  # [K, V] processed draft distributions q; None = point masses
    generator: torch.Generator,
) -> Verdict:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): output is distributed exactly as p.

    Token x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)); the first rejected position is
    resampled from normalise(max(0, p_i - q_i)); when all K survive, a bonus token comes from p_K.
    A drafter without distributions proposes deterministically, i.e. q_i is a point mass on x_i.
    """
    k = len(draft_tokens)
    if k:
        index = torch.tensor(draft_tokens, device=target_probs.device)
        rows = torch.arange(k, device=target_probs.device)
        p_x = target_probs[rows, index].cpu()
        q_x = draft_probs[rows, index].cpu() if draft_probs is not None else torch.ones(k)
        uniforms = torch.rand(k, generator=generator)
        keep = (uniforms * q_x <= p_x).tolist()  # u < p/q without dividing by a zero q
        for i in range(k):
            if not keep[i]:
                return Verdict(i, sample(_residual(target_probs[i], draft_probs, i, draft_tokens[i]), generator))
    return Verdict(k, sample(target_probs[k], generator))


def _residual(p: torch.Tensor, draft_probs: torch.Tensor | None, i: int, token: int) -> torch.Tensor:
    if draft_probs is None:
        residual = p.clone()
        residual[token] = 0.0
    else:
        residual = (p - draft_probs[i]).clamp_(min=0.0)
    total = residual.sum()
    # Rejection implies p(x) < q(x), so some mass of p lies elsewhere; guard rounding anyway.
    return residual / total if total > 0 else p


def verify_tree_greedy(target_logits: torch.Tensor, draft_tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """Greedy verification of a token tree scored in one pass.

    target_logits [N+1, V]: row j scores the token after block node j (node 0 = last accepted token).
    Walk from the root, each time into the child whose token is the target's argmax. Returns the
    accepted path as block indices (ascending: parents precede children) and the next token.
    """
    choice = target_logits.argmax(dim=-1).tolist()
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
