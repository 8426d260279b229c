"""Draft-length policies: what each request's round verifies. The loop (draftwise.scheduler) drives
every policy through the same calls, as llama.cpp's speculative API drives a drafter:

    begin(st)                  a request's first token is committed
    draft(batch, drafting)  -> Drafts: each running request's draft for this step
    accept(st, outcome)        what its round showed, after verification
    end(st)                    the request finished
    observe(times)             the step's measured seconds

FixedDraftLength drafts D tokens; PlannedDraftLength (`auto`) asks the planner (draftwise.planner)
for D each round; DrafterChoice (`--drafter auto`, draftwise.choice) also picks the drafter. A request that fixes
its own D (`Request.num_draft_tokens`) keeps it under any policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftwise.drafters.base import Proposal
from draftwise.planner import Decision, Planner, RequestEstimate, RoundRecord
from draftwise.proposing import NO_DRAFT, Draft, Drafting, Drafts, ModelDraft
from draftwise.request import DecisionLog
from draftwise.sampling import SamplingParams, target_top
from draftwise.verify import VerifyResult


def tree_steps(prop: Proposal) -> list[float]:
    """[d] each node's own step: its score over its parent's, the chance it is right once its parent is."""
    c = prop.confidence or [1.0] * len(prop.tokens)
    above = [c[q] if q >= 0 else 1.0 for q in prop.parents]
    return [ci / a if a > 0 else 0.0 for ci, a in zip(c, above)]


def shadow_tree(planner: Planner, req: RequestEstimate, tree: Proposal, p_accept) -> None:
    """A tree a plain step was chosen over: its first-level nodes, each scored by p_accept(token)."""
    if tree.confidence:
        first, steps = [i for i, q in enumerate(tree.parents) if q == -1], tree_steps(tree)
        planner.observe_nodes(req, 0, [steps[i] for i in first], [p_accept(tree.tokens[i]) for i in first])


@dataclass(slots=True)
class RoundOutcome:
    """One request's verified round, as its policy learns from it."""
    proposal: Proposal
    result: VerifyResult
    logits: torch.Tensor  # [d+1, V] the target's rows of this round
    params: SamplingParams
    round_s: float  # measured seconds of the step up to this request's verification
    unverified: Proposal | None = None  # the cheap candidate a plain step was chosen over
    first_probs: torch.Tensor | None = None  # [V] at temperature > 0: row 0 as verification warped it


@dataclass(slots=True)
class StepTimes:
    """One step's measured seconds: the target forward of at most `k` tokens per sequence for
    `n_seqs` sequences, run as the forwards `parts`, drafting (`drafts`: how a draft model drafted)
    and the rest (`other_s`), less the work per emitted token that plain decoding does as well."""
    k: int
    n_seqs: int
    forward_s: float
    draft_s: float
    other_s: float
    drafts: Drafts
    parts: list[tuple[int, int]] | None = None


class DraftPolicy:
    """The interface, and a policy's defaults: nothing to learn."""
    max_draft: int = 0  # the most draft tokens a round may propose: what the context leaves room for

    def begin(self, st) -> None: ...
    def draft(self, batch: list, drafting: Drafting) -> Drafts: ...
    def accept(self, st, outcome: RoundOutcome) -> None: ...
    def end(self, st) -> None: ...
    def observe(self, times: StepTimes) -> None: ...


def longest_option(cand: Proposal) -> Proposal:
    """A --drafter auto candidate's longest member proposal (with a fixed D), else the candidate."""
    return max(cand.options.values(), key=lambda p: len(p.tokens), default=NO_DRAFT) if cand.options else cand


def model_drafts(batch: list, works: list[ModelDraft | None], drafting: Drafting, propose_many=None) -> Drafts:
    """Lockstep drafts of the requests whose work drafts (d > 0); None where a request failed."""
    todo = [(st, w) for st, w in zip(batch, works) if w is not None and w.d > 0]
    drafts = iter(drafting.model_drafts(todo, propose_many) if todo else [])
    props = [None if w is None else next(drafts) if w.d > 0 else NO_DRAFT for w in works]
    items = [None if p is None else Draft(p) for p in props]
    one = items[0].proposal if len(batch) == 1 and items[0] is not None else NO_DRAFT
    return Drafts(items, one.forwards or len(one.tokens), works[0].unseen if len(batch) == 1 and works[0] else 1)


class FixedDraftLength(DraftPolicy):
    """D tokens every round (fewer where the output has less room), none while more than
    `off_above` requests run."""

    def __init__(self, d: int, off_above: int | None = None):
        self.max_draft, self.off_above = d, off_above

    def _d(self, st, n: int) -> int:
        if self.off_above is not None and n > self.off_above:
            return 0
        d = self.max_draft if st.req.num_draft_tokens is None else st.req.num_draft_tokens
        return min(d, st.out.remaining - 1)

    def draft(self, batch: list, drafting: Drafting) -> Drafts:
        n, drafter = len(batch), drafting.drafter
        if drafter is None:
            return Drafts([Draft(NO_DRAFT) for _ in batch])
        if drafter.cheap:
            cands = drafting.candidates(batch, lambda st: self._d(st, n))
            return Drafts([None if c is None else Draft(longest_option(c).first(self._d(st, n)))
                           for st, c in zip(batch, cands)])
        return model_drafts(batch, [drafting.guard(st, _fixed_work, st, self._d(st, n), drafter) for st in batch],
                             drafting)


def _fixed_work(st, d: int, drafter) -> ModelDraft:
    st.wants_features = d > 0  # a head reads this round's features when it catches up next round
    return ModelDraft(d if d == 0 or drafter.ready(st.key, st.ctx) else 0, drafter.pending(st.key, st.ctx))


@dataclass(slots=True)
class AutoState:
    """A request's state under the planner: its estimate(s) and this round's decision."""
    req: RequestEstimate | dict[str, RequestEstimate]
    decision: Decision | None = None
    chosen: str | None = None  # --drafter auto: the member verified this round (None: plain)
    unverified: dict[str, Proposal] = field(default_factory=dict)  # cheap members not chosen
    room: int = 0  # the most tokens this round may draft
    emitted: int = 0  # tokens its rounds without a model member emitted ...
    spent_s: float = 0.0  # ... and their seconds on the cost curves


class PlannedDraftLength(DraftPolicy):
    """`auto`: the planner picks each request's D every round. A cheap drafter proposes first and
    the planner picks how much to verify, each request against the batched step the others
    chose (Drafting.settle); a draft model is asked for the planner's D, with its early stop."""

    def __init__(self, planner: Planner):
        self.planner, self.max_draft = planner, planner.max_draft

    def begin(self, st) -> None:
        if st.req.num_draft_tokens is None:
            st.policy, st.decisions = AutoState(self.planner.new_request(st.out.remaining - 1)), []
            st.stats.predicted_s = st.stats.predicted_plain_s = st.stats.prefill_s

    def draft(self, batch: list, drafting: Drafting) -> Drafts:
        if not drafting.drafter.cheap:
            step = drafting.batch(len(batch))
            return model_drafts(batch, [drafting.guard(st, self._model_work, st, step, i, drafting.drafter)
                                         for i, st in enumerate(batch)], drafting)
        cands = drafting.candidates(batch, lambda st: min(self._ask(st), st.out.remaining - 1))
        props, step = drafting.settle(batch, cands, self._part, uniform=True)
        if len(step.feeds) > 1 and not self.planner.step_pays(step):  # start again from the plain step
            props, _ = drafting.settle(batch, cands, self._part, uniform=False)
        return Drafts([None if p is None else Draft(p, c if c.tokens and not p.tokens else None)
                       for c, p in zip(cands, props)])

    def _ask(self, st) -> int:
        return self.max_draft if st.policy is not None else st.req.num_draft_tokens

    def _part(self, st, step, j: int, cand: Proposal) -> Proposal:
        """How much of a cheap candidate to verify (a tree: how many of its best nodes)."""
        if st.policy is None:
            d = min(st.req.num_draft_tokens, len(cand.tokens))
            step.record(j, d, 1.0)
            return cand.first(d)
        tree = cand.parents is not None and bool(cand.tokens)
        node_p = self.planner.node_chances(st.policy.req, cand.parents, tree_steps(cand)) if tree else None
        st.policy.decision = dec = self.planner.decide(st.policy.req, step, j, len(cand.tokens), node_p=node_p)
        step.record(j, dec.d, dec.expected)
        return cand.first(dec.d)

    def _model_work(self, st, step, i: int, drafter) -> ModelDraft:
        unseen = drafter.pending(st.key, st.ctx)
        d = self._model_d(st, step, i, st.out.remaining - 1, unseen)
        st.wants_features = d > 0  # a head reads this round's features when it catches up next round
        if d and not drafter.ready(st.key, st.ctx):  # a head lacking the context's features:
            d = self._model_d(st, step, i, 0, unseen)  # a plain step collects them
        return ModelDraft(d, unseen, st.policy.decision.stop if st.policy is not None else None)

    def _model_d(self, st, step, i: int, available: int, unseen: int) -> int:
        if st.policy is None:
            d = min(st.req.num_draft_tokens, available)
            step.record(i, d, 1.0)
            return d
        st.policy.decision = dec = self.planner.decide(st.policy.req, step, i, available, unseen)
        dec.unseen = unseen
        step.record(i, dec.d, dec.expected)
        return dec.d

    def accept(self, st, o: RoundOutcome) -> None:
        if st.policy is None:
            return
        dec, req, res, prop = st.policy.decision, st.policy.req, o.result, o.proposal
        add_predicted(st, dec, len(res.tokens))
        tree = prop.parents is not None and bool(prop.tokens)
        top = None if self.planner.draft is None else target_top(o.logits, len(prop.tokens), res.num_accepted)
        path = (res.path if res.path is not None else list(range(res.num_accepted))) if tree else None
        self.planner.learn(req, dec, RoundRecord(
            len(prop.tokens), res.num_accepted, len(res.tokens), tree_steps(prop) if tree else prop.confidence,
            prop.stop_confidence, o.round_s, top, path, prop.parents if tree else None))
        if o.unverified is not None:  # a shadow: P(accept) of its first token at the plain step's position
            p_accept = _p_accept(o)
            self.planner.shadow(req, p_accept(o.unverified.tokens[0]))
            if o.unverified.parents is not None:
                shadow_tree(self.planner, req, o.unverified, p_accept)
        unseen = dec.unseen if dec.d and self.planner.draft is not None else 0
        st.decisions.append(decision_log(dec, len(prop.tokens), unseen, o.round_s, self.planner))
        st.policy.decision = None

    def observe(self, s: StepTimes) -> None:
        self.planner.observe_times(s.k, s.n_seqs, s.forward_s, s.drafts.forwards, s.drafts.unseen, s.draft_s,
                                   s.other_s, parts=s.parts)

    def end(self, st) -> None:
        if st.policy is not None:
            self.planner.finish(st.policy.req, len(st.out.token_ids) - 1)


def _p_accept(o: RoundOutcome):
    """token -> the chance the round's first position's target accepts it (greedy: its argmax)."""
    if o.params.greedy:
        return lambda x: float(x == o.result.tokens[0])
    return lambda x: float(o.first_probs[x])


def add_predicted(st, dec: Decision, emitted: int) -> None:
    """The planner's predicted seconds for the round's emitted tokens, and for plain steps."""
    st.stats.predicted_s += emitted / dec.rate
    st.stats.predicted_plain_s += emitted / dec.plain_rate


def decision_log(dec: Decision, proposed: int, unseen: int, round_s: float, planner: Planner,
         member: str | None = None) -> DecisionLog:
    return DecisionLog(dec.d, proposed, unseen, round(1e3 * (dec.seconds or 1.0 / dec.plain_rate), 1),
                    round(1e3 * round_s, 1), round(1e3 * planner.draft_cost(1), 1), member)
