"""`--drafter auto` with D `auto` (DrafterChoice): which drafter verifies each round, and how much of
its proposal; driven by the loop through the same calls as every draft-length policy
(draftwise.policy)."""
from __future__ import annotations

import time

from draftwise.drafters.base import Proposal
from draftwise.planner import Decision, Planner, RoundRecord
from draftwise.policy import (AutoState, DraftPolicy, RoundOutcome, StepTimes, add_predicted, decision_log,
                              longest_option, model_drafts)
from draftwise.proposing import NO_DRAFT, Draft, Drafting, Drafts, ModelDraft
from draftwise.sampling import target_top


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
            st.policy, st.decisions = AutoState({n: p.new_request(st.out.remaining - 1) for n, p in self.planners.items()}), []
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
            got = model_drafts([batch[i] for i in idx], works, drafting,
                                lambda items, name=name: drafting.drafter.draft_many(name, items))
            for i, item in zip(idx, got.items):
                out.items[i] = item
            if len(batch) == 1 and got.items[0] is not None:
                out.forwards, out.unseen, out.member = got.forwards, got.unseen, (name, time.perf_counter() - t)
        return out

    def _choose(self, st, step, j: int, cand: Proposal) -> Proposal:
        options = cand.options or {}
        if st.policy is None:  # a request's own D: the longest proposal
            best = longest_option(cand)
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
        add_predicted(st, c.decision, emitted)
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
        st.decisions.append(decision_log(c.decision if c.chosen else Decision(0, c.decision.rate, c.decision.plain_rate,
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
