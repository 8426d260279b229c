"""Verification of a draft against the target: pure functions, randomness passed in.

Vocabulary, fixed here and used with exactly these meanings in code, stats and docs:

- **proposed**: the D draft tokens a drafter offers for one verification round.
- **accepted**: the proposed tokens the target keeps; always a prefix of the draft. Token x at
  draft position i is accepted with probability min(1, p_i(x) / q_i(x)) (greedy: x == argmax p_i).
- **recovered**: the token the target emits at the first rejection, drawn from
  norm(max(0, p_i - q_i)) (greedy: argmax p_i). The rest of the draft is dropped.
- **bonus**: the token drawn from p_D when all D proposed tokens were accepted.
- **emitted**: what a round hands to the output: the accepted tokens, then one recovered or bonus
  token, so num_accepted + 1 tokens. A plain step (no draft) emits one token.
- **discarded**: emitted tokens cut off because a stop (EOS, stop string, max_tokens) fell inside
  the round; they are produced by verification but never delivered.

A draft may also be a **tree** (candidate continuations sharing prefixes): node i carries a token and
its parent, parents[i] < i, -1 for the root (the last committed token). Target row 0 scores the
root, row i + 1 node i. The accepted tokens are then the nodes of one root-to-node path.

p are the target's probabilities and q the drafter's, both after the same temperature / top-k /
top-p warping (`draftwise.sampling.warp`). Resampling from p instead of the residual at a
rejection would bias the output; the residual is what keeps the target distribution exact.
Under a grammar (draftwise.constrained) the same functions take the masked, renormalised p' and q'
(the mask applied to the logits before warping; greedy: logits at -inf where refused), so the rule
is min(1, p'/q') and the residual norm(max(0, p' - q')), with no state of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from draftwise.sampling import argmax


@dataclass(slots=True)
class VerifyResult:
    tokens: list[int]  # emitted: accepted draft tokens + one recovered or bonus token
    num_accepted: int
    num_proposed: int  # draft tokens (tree nodes) verified
    path: list[int] | None = None  # tree drafts: the accepted nodes' indices; None: a chain's first num_accepted
    leaf: bool = False  # tree drafts: the path ended at a leaf

    @property
    def bonus(self) -> bool:
        """True when the last emitted token is a bonus token, False when it is a recovered one."""
        return self.leaf if self.path is not None else self.num_accepted == self.num_proposed


def _check(target: torch.Tensor, draft_tokens: torch.Tensor, draft: torch.Tensor | None) -> None:
    if target.dim() != 2 or draft_tokens.dim() != 1:
        raise ValueError(f"expected target [D+1, V] and draft_tokens [D], got {tuple(target.shape)}"
                         f" and {tuple(draft_tokens.shape)}")
    if target.shape[0] != draft_tokens.shape[0] + 1:
        raise ValueError(f"target has {target.shape[0]} rows for {draft_tokens.shape[0]} draft tokens;"
                         " it needs D+1")
    if draft is not None and draft.shape != (draft_tokens.shape[0], target.shape[1]):
        raise ValueError(f"draft_probs {tuple(draft.shape)} must be [D, V] = "
                         f"[{draft_tokens.shape[0]}, {target.shape[1]}]")


def rejection_sample(
    target_probs: torch.Tensor,  # [D+1, V] or [B, D+1, V]
    draft_probs: torch.Tensor,  # [D, V] or [B, D, V]
    draft_tokens: torch.Tensor,  # [D] or [B, D]
    generator: torch.Generator | None,
) -> VerifyResult | list[VerifyResult]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) over probability tensors.

    Example, V = 2 tokens (A, B), D = 1, draft proposes A with q = (0.8, 0.2), p = (0.5, 0.5):
    A is accepted with probability 0.5 / 0.8 = 0.625; otherwise the recovered token is drawn from
    norm(max(0, p - q)) = (0, 1), i.e. B. P(first = A) = 0.8 * 0.625 = 0.5 = p(A), as required.
    Random draws, in order: D uniforms, then one categorical draw.
    """
    if draft_tokens.dim() == 2:
        return [rejection_sample(t, d, x, generator) for t, d, x in zip(target_probs, draft_probs, draft_tokens)]
    _check(target_probs, draft_tokens, draft_probs)
    d = draft_tokens.shape[0]
    n = first_rejection(target_probs, draft_probs, draft_tokens, generator)
    if n < d:
        residual = (target_probs[n] - draft_probs[n]).clamp_min(0)  # [V]
        if residual.sum() <= 0:  # only reachable through rounding when p == q
            residual = target_probs[n]
        last = torch.multinomial(residual / residual.sum(), 1, generator=generator)
    else:
        last = torch.multinomial(target_probs[d], 1, generator=generator)  # bonus
    tokens = draft_tokens[:n].tolist() + [int(last)]
    return VerifyResult(tokens, n, d)


def first_rejection(
    target_probs: torch.Tensor,  # [D+1, V]
    draft_probs: torch.Tensor,  # [D, V]
    draft_tokens: torch.Tensor,  # [D]
    generator: torch.Generator | None,
) -> int:
    """Index of the first rejected draft token (D if all are accepted); draws D uniforms."""
    d = draft_tokens.shape[0]
    rows = torch.arange(d)
    p = target_probs[rows, draft_tokens]  # [D]
    q = draft_probs[rows, draft_tokens]  # [D]
    u = torch.rand(d, generator=generator, dtype=torch.float64, device=target_probs.device)
    # u < p/q, written without the division; q >= p: always accept.
    accepted = (u * q.double() < p.double()) | (p >= q)
    rejected = torch.nonzero(~accepted)
    return int(rejected[0]) if rejected.numel() else d


def greedy_verify(
    target_logits: torch.Tensor,  # [D+1, V] or [B, D+1, V]
    draft_tokens: torch.Tensor,  # [D] or [B, D]
) -> VerifyResult | list[VerifyResult]:
    """Temperature 0: accept while the draft equals the target argmax, then emit the argmax."""
    if draft_tokens.dim() == 2:
        return [greedy_verify(t, x) for t, x in zip(target_logits, draft_tokens)]
    _check(target_logits, draft_tokens, None)
    d = draft_tokens.shape[0]
    best = argmax(target_logits)  # [D+1]
    mismatch = torch.nonzero(best[:d] != draft_tokens)
    n = int(mismatch[0]) if mismatch.numel() else d
    return VerifyResult(draft_tokens[:n].tolist() + [int(best[n])], n, d)


def tree_children(parents: list[int]) -> list[list[int]]:
    """[N+1]: entry 0 the root's children, entry i + 1 node i's, each in proposal order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def check_tree(tokens: list[int], parents: list[int]) -> None:
    """ValueError unless each node's parent comes before it and siblings carry different tokens."""
    if len(tokens) != len(parents):
        raise ValueError(f"a tree needs one parent per token, got {len(parents)} for {len(tokens)}")
    seen = set()
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} must be in [-1, {i - 1}]")
        if (p, t) in seen:
            raise ValueError(f"node {i} repeats token {t} among its siblings")
        seen.add((p, t))


def greedy_verify_tree(
    target_logits: torch.Tensor,  # [N+1, V]: row 0 at the root, row i+1 at node i
    draft_tokens: list[int],  # [N]
    parents: list[int],  # [N]
) -> VerifyResult:
    """Temperature 0 over a tree: from the root, follow the child whose token is the target's
    argmax at its parent's row while there is one, then emit the argmax where the path ends."""
    check_tree(draft_tokens, parents)
    best = argmax(target_logits).tolist()  # [N+1]
    kids, row, path = tree_children(parents), 0, []
    while True:
        nxt = next((c for c in kids[row] if draft_tokens[c] == best[row]), None)
        if nxt is None:
            break
        path.append(nxt)
        row = nxt + 1
    return VerifyResult([draft_tokens[i] for i in path] + [best[row]], len(path), len(parents), path, not kids[row])


def rejection_sample_tree(
    target_probs: torch.Tensor,  # [N+1, V]: row 0 at the root, row i+1 at node i
    draft_probs: torch.Tensor,  # [N, V]: q_i, what node i's token was drawn from
    draft_tokens: list[int],  # [N]
    parents: list[int],  # [N]
    generator: torch.Generator | None,
) -> VerifyResult:
    """Multi-candidate speculative sampling over a tree (recursive rejection over siblings, as in
    SpecInfer, Miao et al. 2024). At a node with target distribution r = p, its children
    x_1..x_k are tried in order: x_j is accepted with probability min(1, r(x_j) / q_j(x_j)); on a
    rejection r becomes norm(max(0, r - q_j)) and the next child is tried; an accepted child is
    moved to, and when every child is rejected (or there is none: a bonus) a token is drawn from r.

    Exactness, for children drawn independently, x_j ~ q_j (a deterministic drafter: q_j one-hot
    at x_j, any distinct tokens): by induction on k the token emitted at a node has law r. k = 0:
    drawn from r. k >= 1: P(y) = q_1(y) min(1, r(y)/q_1(y)) + P(reject x_1) r'(y), where
    P(reject) = sum max(0, r - q_1) and r' = max(0, r - q_1) / P(reject) is what the remaining
    k - 1 children then emit exactly (induction), so P(y) = min(q_1, r)(y) + max(0, r - q_1)(y)
    = r(y). The emitted token fixes which subtree (drafted after it) comes next, so each emitted
    token follows the target given the ones before it: the output is the target's. With one-hot
    q_j the rule reads: accept x_j with probability r(x_j), else remove x_j from r.
    Random draws, in order: one uniform per child tried, then one categorical draw."""
    check_tree(draft_tokens, parents)
    kids, row, path = tree_children(parents), 0, []
    while True:
        r = target_probs[row]  # [V]
        moved = False
        for c in kids[row]:
            x, q = draft_tokens[c], draft_probs[c]
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            if r[x] >= q[x] or u * float(q[x]) < float(r[x]):
                path.append(c)
                row, moved = c + 1, True
                break
            residual = (r - q).clamp_min(0)
            if residual.sum() > 0:  # else r == q up to rounding, and r stays
                r = residual / residual.sum()
        if not moved:
            last = int(torch.multinomial(r, 1, generator=generator))
            return VerifyResult([draft_tokens[i] for i in path] + [last], len(path), len(parents), path,
                                not kids[row])
