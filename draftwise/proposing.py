"""The propose stage's tools, which every draft-length policy (draftwise.policy) drafts with: a
cheap drafter's candidates, a draft model's lockstep drafts, and the batch's choices settled
against the step they share. Each per-request part runs inside that request's failure boundary
(`guard`: a request whose drafting raises fails alone, its entry None)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from draftwise.drafters.base import DraftItem, Drafter, Proposal, StopRule
from draftwise.costs import CostCurve

log = logging.getLogger(__name__)
NO_DRAFT = Proposal([])
SWEEPS = 2  # re-choosing rounds over a batch's choices after the first: they settle within one or two


@dataclass(slots=True)
class Batch:
    """The batched step a request's round joins, as chosen so far: each sequence's new tokens
    (1 until its request chooses) and expected emitted tokens, and how the runner runs such a
    forward (`split`: per-sequence counts -> (k, b) forwards). `uniform`: price the step as if
    every sequence fed what the deciding request feeds."""
    feeds: list[int]  # [n]
    emits: list[float]  # [n]
    split: Callable[[list[int]], list[tuple[int, int]]]
    uniform: bool = False
    _seconds: dict[tuple[int, ...], float] = field(default_factory=dict)  # sorted feeds -> seconds

    @classmethod
    def of(cls, n: int, split=None, uniform: bool = False) -> Batch:
        return cls([1] * n, [1.0] * n, split or (lambda ks: [(max(ks), len(ks))]), uniform)

    def forward_s(self, curve: CostCurve, ks: list[int]) -> float:
        """Seconds of the step's forward with these feeds (in any order), priced once per step."""
        key = tuple(sorted(ks))
        if key not in self._seconds:
            self._seconds[key] = curve.parts(self.split(list(key)), len(key))
        return self._seconds[key]

    def forwards(self, curve: CostCurve, index: int, d_max: int) -> np.ndarray:  # [d_max + 1]
        """Seconds of the step with request `index` feeding 1..d_max + 1 tokens."""
        others = self.feeds[:index] + self.feeds[index + 1:]
        n = len(self.feeds)
        return np.array([self.forward_s(curve, [k] * n if self.uniform else others + [k])
                         for k in range(1, d_max + 2)])

    def record(self, index: int, d: int, expected: float) -> None:
        self.feeds[index], self.emits[index] = 1 + d, expected


@dataclass(slots=True)
class Draft:
    """What one request's round verifies, and the cheap candidate a plain step was chosen over
    (unverified: its first token is scored against the plain step's target, a shadow)."""
    proposal: Proposal
    unverified: Proposal | None = None


@dataclass(slots=True)
class Drafts:
    """The step's drafts (None: the request failed while drafting and was dropped), and how a
    draft model drafted when one sequence drafted (its forwards, the tokens its first caught up
    on, the --drafter auto member), which prices the draft curve."""
    items: list[Draft | None]
    forwards: int = 0
    unseen: int = 1
    member: tuple[str, float] | None = None  # (member with a model, its drafting seconds)


@dataclass(slots=True)
class ModelDraft:
    """A draft model's work for one request: d tokens after catching up on `unseen`, early-stopped."""
    d: int
    unseen: int = 1
    stop: StopRule | None = None


@dataclass(slots=True)
class Drafting:
    """The scheduler's drafter, its step split (draftwise.backends.base.ModelRunner.forward_parts),
    failure boundary and observer."""
    drafter: Drafter
    split: Callable[[list[int]], list[tuple[int, int]]]
    guard: Callable  # guard(st, fn, *args): fn(*args), or None after failing the request
    observer: object  # draftwise.observer: phase and fault

    def batch(self, n: int, uniform: bool = False) -> Batch:
        return Batch.of(n, self.split, uniform)

    def candidates(self, batch: list, want: Callable[[object], int]) -> list[Proposal | None]:
        """Each request's cheap proposal of want(st) tokens (0: none), timed as its drafting."""
        return [self.guard(st, self._candidate, st, want(st)) for st in batch]

    def _candidate(self, st, n: int) -> Proposal:
        t = time.perf_counter()
        cand = self.drafter.propose(st.key, st.ctx, n, st.req.params, st.gen) if n > 0 else NO_DRAFT
        self._spent([st], time.perf_counter() - t)
        return cand

    def settle(self, batch: list, cands: list[Proposal | None], choose: Callable,
               uniform: bool) -> tuple[list[Proposal | None], Batch]:
        """Each live request chooses its part of its candidate, choose(st, step, index, cand) ->
        Proposal (recording it in `step`), in turn until no choice changes: coordinate ascent on
        the step's expected rate. `uniform`: the first sweep prices every sequence as feeding
        what the choosing request feeds (a batch drafting alike costs less per token)."""
        live = [i for i, c in enumerate(cands) if c is not None]
        step = self.batch(len(live), uniform)
        props: list[Proposal | None] = [None] * len(batch)
        for sweep in range(1 + (SWEEPS if len(live) > 1 else 0)):
            changed = False
            for j, i in enumerate(live):
                if cands[i] is None:  # its choice failed in an earlier sweep
                    continue
                before, t = step.feeds[j], time.perf_counter()
                props[i] = self.guard(batch[i], choose, batch[i], step, j, cands[i])
                self._spent([batch[i]], time.perf_counter() - t)
                if props[i] is None:
                    cands[i] = None
                changed |= step.feeds[j] != before
            step.uniform = False
            if (sweep or not uniform) and not changed:
                break
        return props, step

    def model_drafts(self, work: list[tuple[object, ModelDraft]], propose_many=None) -> list[Proposal | None]:
        """Lockstep drafts by the draft model (or `propose_many`, a --drafter auto member); if the
        batched call fails, each request's draft alone once. Timed as every drafting request's."""
        propose_many = propose_many or self.drafter.propose_many
        items = [DraftItem(st.key, st.ctx, m.d, st.req.params, st.gen, m.stop, st.constraint) for st, m in work]
        t = time.perf_counter()
        try:
            out = propose_many(items)
        except Exception as e:  # noqa: BLE001
            log.warning("a batched draft of %d sequences failed; retrying each alone", len(items), exc_info=e)
            self.observer.fault("draft")
            self._unwalk(work)
            out = [self.guard(st, lambda it=it: propose_many([it])[0]) for (st, _), it in zip(work, items)]
        finally:
            self._unwalk(work)
        self._spent([st for st, _ in work], time.perf_counter() - t)
        return out

    def _unwalk(self, work: list) -> None:
        """Roll back the tokens a drafter walked through each request's grammar while it drew them
        (the verifier walks the draft again, draftwise.constrained)."""
        for st, _ in work:
            if st.constraint is not None:
                self.guard(st, st.constraint.settle, 0, [])

    def _spent(self, sts: list, seconds: float) -> None:
        for st in sts:
            st.stats.draft_s += seconds
        self.observer.phase("draft", seconds)
