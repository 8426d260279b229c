"""What the known bug would do: the output bias of resampling from p after a rejection, computed
exactly from the models' p and q, so `draftwise verify` can say whether it could see that bug.

At a draft position with target p and draft q (both warped), the correct rule outputs p. The bug
(after a rejection, resample from p instead of norm(max(0, p - q))) outputs

    b = min(p, q) + (1 - beta) p,    beta = sum min(p, q)   (the acceptance probability),

so b - p = min(p, q) - beta p and TV(b, p) = 1/2 sum |min(p, q) - beta p|. For an n-gram draft
(q one-hot on x, p(x) = p0) that is p0 (1 - p0), at most 1/4, at p0 = 1/2: the bug adds p0 (1 - p0)
to x. A drafter that agrees with the target (q = p) gives beta = 1 and no bias at all.

Output position 1 is always the first draft token of the first round (position 0 is sampled from
the prompt's logits), so its bias is a mixture over the token x0 at position 0:
sum_x0 p(x0) (b - p)(. | x0), computed from one target and one draft forward per likely x0.
Later positions depend on earlier rounds' outcomes and are not predicted.

A candidate tree tries the root's children x_1..x_k in turn (recursive rejection), so position 1
sees k drafts: with r_j the residual after j rejections and R the chance that all k are rejected,
the correct rule emits R r_k there where the bug emits R p, a shift of R (p - r_k) (`sibling_shift`;
one child is `bug_shift`). For one-hot siblings on a set S that is TV = p(S) (1 - p(S)).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from draftwise.sampling import SamplingParams, warp


def bug_shift(
    p: torch.Tensor,  # [..., V] target probabilities
    q: torch.Tensor,  # [..., V] draft probabilities; an all-zero row = nothing drafted (no shift)
) -> torch.Tensor:  # [..., V]
    """b - p: how resampling from p moves the output at a draft position."""
    m = torch.minimum(p, q)
    return m - m.sum(-1, keepdim=True) * p


def bug_tv(p: torch.Tensor, q: torch.Tensor) -> float:
    """TV(b, p) at one draft position ([V] rows)."""
    return 0.5 * float(bug_shift(p.double(), q.double()).abs().sum())


def sibling_shift(
    p: torch.Tensor,  # [V] target probabilities
    qs: torch.Tensor,  # [k, V] the draft probabilities of the siblings tried there, in order
) -> torch.Tensor:  # [V]
    """b - p at a node whose k children are tried in turn; k = 1 is `bug_shift`."""
    r, reach = p, 1.0
    for q in qs:
        reach *= 1.0 - float(torch.minimum(q, r).sum())
        res = (r - q).clamp_min(0)
        if res.sum() > 0:
            r = res / res.sum()
    return reach * (p - r)


def shift_tv(
    weights: torch.Tensor,  # [K] probabilities of the first token x0 (may sum to < 1)
    shifts: torch.Tensor,  # [K, V] the bug's shift at position 1 given each x0
) -> float:
    """TV of the bug's shift of the token at position 1, marginal over x0 (what is tested)."""
    return 0.5 * float((weights.double()[:, None] * shifts.double()).sum(0).abs().sum())


@dataclass(slots=True)
class BugBias:
    tv: float  # predicted TV between bugged and correct output at position 1
    untracked: float  # probability of the first tokens not followed: the true TV is within tv +- untracked
    first_tokens: int  # first tokens x0 followed


def predict_bug_bias(target, drafter, eos: frozenset[int], prompt_ids: list[int], params: SamplingParams,
                     coverage: float = 0.99, max_first: int = 16, nodes: int = 1) -> BugBias:
    """The bias resample-from-p would cause at output position 1 for this prompt: follows the most
    likely first tokens x0 (until `coverage` of their mass, at most `max_first`); per x0 one target
    forward of one token over the prompt's KV state and one draft proposal of `nodes` tokens (a
    tree drafter's budget: its root's children are the siblings tried at position 1)."""
    seq, key = target.new_sequence(), -1  # a drafter key no engine hands out
    gen = torch.Generator().manual_seed(0)  # the drafted token is irrelevant: only q is used
    drafter.isolate(key)  # nothing of this look is kept across requests
    try:
        if drafter.features is not None:  # a head drafts from the prompt's features
            out = target.forward_features([seq], [prompt_ids], [len(prompt_ids)], drafter.features)
            logits, feats = out.logits[0], out.features[0]
            drafter.observe(key, len(prompt_ids) - len(feats), feats)
        else:
            logits = target.forward([seq], [prompt_ids], [1])[0]
        p0 = warp(logits[-1:], params)[0]  # [V]
        probs, order = p0.double().sort(descending=True)
        k = min(max_first, int((probs.cumsum(0) < coverage).sum()) + 1)
        shifts = torch.zeros(k, p0.shape[0], dtype=torch.float64)  # [k, V]
        for i, x0 in enumerate(order[:k].tolist()):
            if x0 in eos:  # the output ends at position 0: nothing is drafted
                continue
            p1 = warp(target.forward([seq], [[x0]], [1])[0], params)[0].double()  # [V]
            target.truncate(seq, len(prompt_ids))
            prop = drafter.propose(key, prompt_ids + [x0], nodes, params, gen)
            if prop.options is not None:  # composed with the prediction (build.with_prediction): a
                prop = _base_member(prop, drafter.name)  # request without one drafts with its base
            if prop.tokens:
                roots = [j for j, par in enumerate(prop.parents or [-1]) if par == -1]
                shifts[i] = sibling_shift(p1, prop.draft_probs(p0.shape[0])[roots].double())
    finally:
        target.free(seq)
        drafter.release(key)
    return BugBias(shift_tv(probs[:k], shifts), max(0.0, float(1 - probs[:k].sum())), k)


def _base_member(prop, name: str):
    """A composed drafter's proposal for a request without a prediction: its base member's."""
    if name not in prop.options:
        raise ValueError(f"the bug's bias is predicted for one drafter; drafter {name} chooses among "
                         f"{', '.join(prop.options)} each round")
    return prop.options[name]
