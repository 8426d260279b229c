"""Draft-length policies: what each request's round verifies. The loop (draftwise.scheduler) drives
every policy through the same calls, as llama.cpp's speculative API drives a drafter:

    begin(st)                  a request's first token is committed
    draft(batch, drafting)  -> Drafts: each running request's draft for this step
    accept(st, outcome)        what its round showed, after verification
    end(st)                    the request finished
    observe(times)             the step's measured seconds

FixedDraftLength drafts D tokens; PlannedDraftLength (`auto`) asks the planner (draftwise.planner)
for D each round; DrafterChoice (`--drafter auto`) also picks the drafter. A request that fixes
its own D (`Request.num_draft_tokens`) keeps it under any policy.
"""
from __future__ import annotations

import time
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


def _longest(cand: Proposal) -> Proposal:
    """A --drafter auto candidate's longest member proposal (with a fixed D), else the candidate."""
    return max(cand.options.values(), key=lambda p: len(p.tokens), default=NO_DRAFT) if cand.options else cand


def _model_drafts(batch: list, works: list[ModelDraft | None], drafting: Drafting, propose_many=None) -> Drafts:
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
            return Drafts([None if c is None else Draft(_longest(c).first(self._d(st, n)))
                           for st, c in zip(batch, cands)])
        return _model_drafts(batch, [drafting.guard(st, _fixed_work, st, self._d(st, n), drafter) for st in batch],
                             drafting)


def _fixed_work(st, d: int, drafter) -> ModelDraft:
    st.wants_features = d > 0  # a head reads this round's features when it catches up next round
    return ModelDraft(d if d == 0 or drafter.ready(st.key, st.ctx) else 0, drafter.pending(st.key, st.ctx))


@dataclass(slots=True)
class _Auto:
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
            st.policy, st.decisions = _Auto(self.planner.new_request(st.out.remaining - 1)), []
            st.stats.predicted_s = st.stats.predicted_plain_s = st.stats.prefill_s

    def draft(self, batch: list, drafting: Drafting) -> Drafts:
        if not drafting.drafter.cheap:
            step = drafting.batch(len(batch))
            return _model_drafts(batch, [drafting.guard(st, self._model_work, st, step, i, drafting.drafter)
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
        _predicted(st, dec, len(res.tokens))
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
        st.decisions.append(_log(dec, len(prop.tokens), unseen, o.round_s, self.planner))
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


def _predicted(st, dec: Decision, emitted: int) -> None:
    """The planner's predicted seconds for the round's emitted tokens, and for plain steps."""
    st.stats.predicted_s += emitted / dec.rate
    st.stats.predicted_plain_s += emitted / dec.plain_rate


def _log(dec: Decision, proposed: int, unseen: int, round_s: float, planner: Planner,
         member: str | None = None) -> DecisionLog:
    return DecisionLog(dec.d, proposed, unseen, round(1e3 * (dec.seconds or 1.0 / dec.plain_rate), 1),
                    round(1e3 * round_s, 1), round(1e3 * planner.draft_cost(1), 1), member)


class DrafterChoice(DraftPolicy):
    """`--drafter auto` with D `auto`: which drafter, and how much of its proposal, each round.

    Every cheap member proposes each round (draftwise.drafters.auto); each member has its own
    planner, all on one shared target curve. The round verifies the member whose decision promises
    the highest rate of the batched step, or none (a plain step). A member with a model is priced
    before drafting, its catch-up on the tokens it has not seen included, and drafts after the
    choice. Members not chosen still learn from the same context's verification: greedy, a cheap
    member's proposal is judged against the emitted tokens as far as they go (a counterfactual);
    at temperature > 0 its first token is a shadow; a member with a model learns from the
    target's top probability at the round's first position."""

    def __init__(self, planners: dict[str, Planner], modelled: dict | None = None):
        if not planners:
            raise ValueError("drafter auto needs a planner per drafter")
        self.planners, self.modelled = planners, modelled or {}
        self.max_draft = max(p.max_draft for p in planners.values())
        self._any = next(iter(planners.values()))  # the planners share the target curve

    def begin(self, st) -> None:
        if st.req.num_draft_tokens is None:
            st.policy, st.decisions = _Auto({n: p.new_request(st.out.remaining - 1) for n, p in self.planners.items()}), []
            st.stats.predicted_s = st.stats.predicted_plain_s = st.stats.prefill_s

    def draft(self, batch: list, drafting: Drafting) -> Drafts:
        def want(st) -> int:
            room = st.out.remaining - 1
            if st.policy is not None:
                st.policy.room = min(self.max_draft, room)
                return st.policy.room
            return min(st.req.num_draft_tokens, room)

        cands = drafting.candidates(batch, want)
        props, step = drafting.settle(batch, cands, self._choose, uniform=True)
        if len(step.feeds) > 1 and not self._any.step_pays(step):
            props, _ = drafting.settle(batch, cands, self._choose, uniform=False)
        out = Drafts([None if p is None else Draft(p) for p in props])
        for name, member in self.modelled.items():  # chosen members with a model draft now
            idx = [i for i, st in enumerate(batch) if props[i] is not None and st.policy is not None
                   and st.policy.chosen == name]
            if not idx:
                continue
            works = [ModelDraft(batch[i].policy.decision.d, batch[i].policy.decision.unseen,
                                batch[i].policy.decision.stop) for i in idx]
            t = time.perf_counter()
            got = _model_drafts([batch[i] for i in idx], works, drafting,
                                lambda items, name=name: drafting.drafter.draft_many(name, items))
            for i, item in zip(idx, got.items):
                out.items[i] = item
            if len(batch) == 1 and got.items[0] is not None:
                out.forwards, out.unseen, out.member = got.forwards, got.unseen, (name, time.perf_counter() - t)
        return out

    def _choose(self, st, step, j: int, cand: Proposal) -> Proposal:
        options = cand.options or {}
        if st.policy is None:  # a request's own D: the longest proposal
            best = _longest(cand)
            out = best.first(min(st.req.num_draft_tokens, len(best.tokens)))
            step.record(j, len(out.tokens), 1.0)
            return out
        c = st.policy
        decs = {n: self.planners[n].decide(c.req[n], step, j, len(p.tokens)) for n, p in options.items()}
        # a member with a model must win back its catch-up against the rate the request has gone at
        # without one (its cheap rounds' tokens over their seconds), not a plain step's
        base = c.emitted / c.spent_s if c.spent_s > 0 else None
        for n, member in self.modelled.items():
            unseen = member.pending(st.key, st.ctx)
            decs[n] = self.planners[n].decide(c.req[n], step, j, c.room, unseen, base_rate=base)
            if decs[n].d and not member.ready(st.key, st.ctx):  # a head lacking the context's features:
                st.wants_features = True  # this step collects them, it drafts from the next
                decs[n] = self.planners[n].decide(c.req[n], step, j, 0, unseen, base_rate=base)
            decs[n].unseen = unseen
        c.chosen = max((n for n in decs if decs[n].d > 0), key=lambda n: decs[n].step_rate, default=None)
        if c.chosen in self.modelled and self.modelled[c.chosen].features is not None:
            st.wants_features = True  # the head reads this round's features when it catches up next round
        c.decision = decs[c.chosen] if c.chosen is not None else next(iter(decs.values()), None)
        c.unverified = {n: p for n, p in options.items() if p.tokens and n != c.chosen}
        if c.chosen is None:
            step.record(j, 0, 1.0)
            return NO_DRAFT
        step.record(j, c.decision.d, c.decision.expected)
        return NO_DRAFT if c.chosen in self.modelled else options[c.chosen].first(c.decision.d)

    def accept(self, st, o: RoundOutcome) -> None:
        c = st.policy
        if c is None or c.decision is None:
            return
        res, prop, emitted = o.result, o.proposal, len(o.result.tokens)
        _predicted(st, c.decision, emitted)
        modelled = c.chosen in self.modelled
        sat_out_top = target_top(o.logits, 0, 0) if any(n != c.chosen for n in self.modelled) else None
        if not modelled:
            c.emitted += emitted
            c.spent_s += c.decision.seconds or 1.0 / c.decision.plain_rate
        for name, planner in self.planners.items():
            req = c.req[name]
            if name == c.chosen:
                top = target_top(o.logits, len(prop.tokens), res.num_accepted) if modelled else None
                planner.learn(req, c.decision, RoundRecord(len(prop.tokens), res.num_accepted, emitted,
                                                           prop.confidence, prop.stop_confidence, o.round_s, top))
                continue
            plain = Decision(0, c.decision.plain_rate, c.decision.plain_rate, seconds=c.decision.seconds)
            planner.learn(req, plain, RoundRecord(0, 0, emitted, target_top=sat_out_top if name in self.modelled else None))
            other = c.unverified.get(name)
            if other is not None and o.params.greedy:  # the round's tokens verify it as far as they go
                planner.counterfactual(req, other.tokens, res.tokens, other.confidence)
            elif other is not None:
                planner.shadow(req, float(o.first_probs[other.tokens[0]]))
        chosen = self.planners.get(c.chosen, self._any)
        st.decisions.append(_log(c.decision if c.chosen else Decision(0, c.decision.rate, c.decision.plain_rate,
                                                                  c.decision.seconds),
                             len(prop.tokens), c.decision.unseen if modelled else 0, o.round_s, chosen,
                             c.chosen or "none"))
        c.decision, c.chosen, c.unverified = None, None, {}

    def observe(self, s: StepTimes) -> None:
        """The target curve is shared: observed once. Cheap members' planners see the proposing
        call's time; the member with a model that drafted, its own forwards and seconds."""
        member = s.drafts.member
        model_s = member[1] if member else 0.0
        for i, (name, p) in enumerate(self.planners.items()):
            mine = member is not None and member[0] == name
            if name in self.modelled:
                p.observe_times(s.k, s.n_seqs, s.forward_s, s.drafts.forwards if mine else 0, s.drafts.unseen,
                                model_s if mine else 0.0, s.other_s, curve=i == 0, parts=s.parts)
            else:
                p.observe_times(s.k, s.n_seqs, s.forward_s, 0, 1, s.draft_s - model_s, s.other_s,
                                curve=i == 0, parts=s.parts)

    def end(self, st) -> None:
        if st.policy is not None:
            for name, p in self.planners.items():
                p.finish(st.policy.req[name], len(st.out.token_ids) - 1)
