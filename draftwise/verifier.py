"""The verify step of the decoding loop (draftwise.scheduler): the target's one batched forward
over every running sequence's draft (retried per sequence if it fails), the acceptance rule per
sequence (draftwise.verify), and the rejected draft's KV rolled back. Features a draft head reads
are asked of the runner only where a request wants them or they come free with the forward.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from draftwise.backends.base import ModelRunner, tree_layout
from draftwise.observer import Observer
from draftwise.request import RequestState
from draftwise.sampling import SamplingParams, mask_logits, warp
from draftwise.verify import VerifyResult, greedy_verify, greedy_verify_tree, rejection_sample, rejection_sample_tree

log = logging.getLogger(__name__)


class Scored(NamedTuple):
    """One sequence's part of a target forward."""
    logits: torch.Tensor  # [k, V]
    features: torch.Tensor | None  # [m >= k, F] of the feed's last rows, when the drafter reads them


class StepForward(NamedTuple):
    feeds: list[list[int]]  # per sequence: [last committed token] + its draft (+ padding)
    scored: list[Scored | None]  # per sequence; None: its forward failed alone too (the request failed)
    batched: bool  # the batched forward went through (else each sequence was retried alone)
    seconds: float


class Accepted(NamedTuple):
    """One sequence's verified round; its KV holds what it accepted."""
    result: VerifyResult
    rows: torch.Tensor  # [n, V] row j scored emitted token j (accepted, then recovered or bonus)
    warped: torch.Tensor | None  # [d+1, V] at temperature > 0: the warped rows it was sampled from
    depth: int | None  # a candidate tree's depth (its draft positions); None: a chain


class Verifier:
    """`features`: the layers the drafter reads (Drafter.features; None: none). `pad_ragged`: pad
    each step's feeds to equal length (llama.cpp with per-sequence KV streams: one ubatch).
    `sampler` and `tree_sampler`: the acceptance rules for chains and candidate trees at
    temperature > 0 (swappable only so that `draftwise verify` can show it catches a wrong one)."""

    def __init__(self, target: ModelRunner, features: list[int] | None, observer: Observer,
                 pad_ragged: bool = False, sampler=rejection_sample, tree_sampler=rejection_sample_tree):
        self.target, self.features, self.observer, self.pad_ragged = target, features, observer, pad_ragged
        self.sampler, self.tree_sampler = sampler, tree_sampler

    def forward(self, seqs: list[int], feeds: list[list[int]], ks: list[int], trees: list | None = None,
                 wants_features: bool = False) -> list[Scored]:
        """Per sequence its last k logits rows and, where the drafter reads features and a request
        asked for them (`wants_features`) or they come free with the forward, its features."""
        if self.features is not None and (wants_features or self.target.features_free):
            out = self.target.forward_features(seqs, feeds, ks, self.features, trees)
            return [Scored(*x) for x in zip(out.logits, out.features)]
        logits = self.target.forward(seqs, feeds, ks, trees) if trees else self.target.forward(seqs, feeds, ks)
        return [Scored(x, None) for x in logits]

    def step(self, states: list[RequestState], props: list, boundary: Callable) -> StepForward:
        """The step's forward of each request's proposal (`props`, Proposal each): d+1 logits rows
        per sequence (the first d+1 when padded). If it fails, each sequence is retried alone
        once inside its request's failure boundary (`boundary(st, fn, *args)`, None if it
        failed), so a fault fails only the requests whose own forward fails."""
        feeds = [[st.ctx[-1]] + p.tokens for st, p in zip(states, props)]
        # a candidate tree: each fed token's parent among the feed (the last committed token's: -1)
        trees = [[-1] + [q + 1 for q in p.parents] if p.is_tree else None for p in props]
        if self.pad_ragged:  # the padding's KV is truncated after verification
            k = max(map(len, feeds))
            room = [self.target.max_context - (len(st.ctx) - 1) for st in states]
            feeds = [f + [f[-1]] * (min(k, r) - len(f)) for f, r in zip(feeds, room)]
        t = time.perf_counter()
        try:
            scored, batched = self.forward([st.seq for st in states], feeds, [len(f) for f in feeds],
                                   trees if any(trees) else None, any(st.wants_features for st in states)), True
        except Exception as e:  # noqa: BLE001
            log.warning("a batched forward of %d sequences failed; retrying each alone", len(states), exc_info=e)
            self.observer.fault("forward")
            scored, batched = [boundary(st, self._alone, st, f, tree) for st, f, tree in zip(states, feeds, trees)], False
        dt = time.perf_counter() - t
        self.observer.forward("step", len(states), sum(map(len, feeds)), dt)
        self.observer.phase("verify", dt)
        return StepForward(feeds, scored, batched, dt)

    def _alone(self, st: RequestState, feed: list[int], tree: list[int] | None) -> Scored:
        n = len(st.ctx) - 1  # the KV invariant: every committed token but the last
        if self.target.length(st.seq) > n:
            self.target.truncate(st.seq, n)  # whatever the failed forward left behind
        if self.target.length(st.seq) != n:
            raise RuntimeError("the failed forward lost this sequence's KV state")
        return self.forward([st.seq], [feed], [len(feed)], [tree] if tree else None, st.wants_features)[0]

    def accept(self, st: RequestState, prop, logits: torch.Tensor, masks: torch.Tensor | None = None) -> Accepted:
        """Verify a request's proposal (a Proposal) against its logits rows ([>= d+1, V]) and roll
        its KV back to what was accepted; under a grammar (`masks` [d+1, V], draftwise.constrained:
        a chain) the acceptance rule runs on the masked rows and the grammar keeps what was emitted."""
        rows = logits[: len(prop.tokens) + 1]  # [d+1, V]
        res, warped = self.rule(rows, prop, st.req.params, st.gen, masks)
        if masks is not None:
            st.constraint.settle(res.num_accepted, res.tokens[-1:])  # roll the rejected draft back
        if res.path is None:
            self.target.truncate(st.seq, len(st.ctx) + res.num_accepted)  # drop the rejected draft's KV
            return Accepted(res, rows, warped, None)
        # keep the accepted path's KV (node i sits after the last committed token, at len(ctx) + i)
        self.target.keep(st.seq, len(st.ctx), [len(st.ctx) + i for i in res.path])
        rows = rows[[0] + [i + 1 for i in res.path]]  # row j scored emitted token j, as in a chain
        return Accepted(res, rows, warped, max(tree_layout(prop.parents)[0]) + 1)

    def rule(self, logits: torch.Tensor, prop, params: SamplingParams, gen: torch.Generator | None,
             masks: torch.Tensor | None = None) -> tuple[VerifyResult, torch.Tensor | None]:
        """The round's result, and at temperature > 0 the warped rows it was sampled from ([d+1, V]).
        `masks` [d+1, V] bool: a grammar's per row; the proposal's q is masked already."""
        if masks is not None:
            logits = mask_logits(logits, masks)  # p' = warp of the masked logits; greedy: best allowed
        if params.greedy:
            if prop.is_tree:
                return greedy_verify_tree(logits, prop.tokens, prop.parents), None
            return greedy_verify(logits, torch.tensor(prop.tokens, dtype=torch.long)), None
        p = warp(logits, params)  # [d+1, V]
        if prop.is_tree:
            return self.tree_sampler(p, prop.draft_probs(p.shape[1]), prop.tokens, prop.parents, gen), p
        return self.sampler(p, prop.draft_probs(p.shape[1]), torch.tensor(prop.tokens, dtype=torch.long), gen), p
