"""Constrained speculation: a request's grammar (draftwise.grammar) on every drafted position.

Exactness. Under a grammar the target's distribution at a position is p' = the masked,
renormalised p (the mask applied to the logits before warping, as plain decoding does). A
drafted token x at position i was drawn from the drafter's q; the mask at i is the grammar's
state after the draft's tokens before i (`Constraint.walk`). If the grammar refuses x, the draft
is cut there (position i is then scored as a bonus or recovered token from p', as at the end of
any draft). If it allows x, x is distributed as q' = norm(q * mask) given that it was allowed,
so the acceptance rule min(1, p'(x) / q'(x)) with residual norm(max(0, p' - q')) emits p' at i
(draftwise.verify), and the mixture over the two cases is p' too. Greedy: the argmax over the
allowed tokens at every row, which is constrained plain greedy decoding.

A drafter with a model (a draft model, a head) draws each token from q' itself: the loop hands it
the request's grammar (drafters.base.DraftItem.masker), which it walks as it drafts, and rolls that
walk back once drafting ends (draftwise.proposing). Its draft is never cut, q' is its q as drawn,
and the rule above applies unchanged; cheap drafters (one-hot q) are cut as described.

A run of tokens the grammar fixes (`Constraint.forced`: keys, quotes and separators a schema
fixes) is a draft of one-hot q = 1 that costs no drafting: the loop verifies it instead of asking
the draft-length policy (which neither drafts nor learns from that round).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from draftwise.drafters.base import Proposal
from draftwise.sampling import mask_logits


def forced_run(st, limit: int) -> Proposal | None:
    """The tokens the request's grammar fixes next, as a draft of at most `limit` tokens (never
    past max_tokens), or None: no grammar, no speculation for this request, or nothing fixed."""
    c = st.constraint
    if c is None or st.req.num_draft_tokens == 0:
        return None
    run = c.forced(min(limit, st.out.remaining - 1))
    return Proposal(run) if run else None


def chain(prop: Proposal) -> Proposal:
    """A candidate tree's first chain (its head where each node follows the one before)."""
    if not prop.is_tree:
        return prop
    n = next(i for i, p in enumerate(prop.parents) if p != i - 1)
    return prop.first(n)


class Constrained(NamedTuple):
    prop: Proposal  # the draft cut at the first token the grammar refuses, q masked and renormalised
    masks: torch.Tensor  # [d+1, V] bool: row i the grammar's mask after the draft's first i tokens


def constrain(st, prop: Proposal) -> Constrained:
    """The proposal cut at the first token the grammar refuses, its q masked and renormalised,
    and the masks [d+1, V] bool (row i: after its first i tokens). The grammar stays advanced
    through the draft until the verifier settles it (Constraint.settle)."""
    prop = chain(prop)
    masks = st.constraint.walk(prop.tokens)  # [d+1, V]
    d = masks.shape[0] - 1
    if d < len(prop.tokens):
        prop = dataclasses.replace(prop, tokens=prop.tokens[:d],
                                   probs=None if prop.probs is None else prop.probs[:d],
                                   confidence=None if prop.confidence is None else prop.confidence[:d],
                                   parents=None)
    if prop.probs is not None and d:
        q = prop.draft_probs(masks.shape[1]) * masks[:d]  # [d, V]: the drafted token is allowed, so rows are > 0
        prop = dataclasses.replace(prop, probs=q / q.sum(-1, keepdim=True))
    return Constrained(prop, masks)


def check_constraint(target, grammar) -> None:
    """ValueError for a grammar whose masks do not span the target's logits."""
    if grammar is not None and grammar.vocab_size != target.vocab_size:
        raise ValueError(f"the grammar was compiled for {grammar.vocab_size} tokens, the target has "
                         f"{target.vocab_size}: compile it with Grammars(tokenizer, target.vocab_size)")


def first_row(constraint, row: torch.Tensor) -> torch.Tensor:  # [1, V]
    """The prefill's last row as the first token is drawn from it: under a grammar (its state at
    the output's start; None: free text), masked like every verified row."""
    if constraint is None:
        return row
    return mask_logits(row, constraint.allowed()[None])
