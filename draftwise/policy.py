"""Draft length per round: a fixed D, `auto` (the planner), or `auto` over several drafters
(DrafterChoice, `--drafter auto`). Implementations of one interface, which the one decoding loop (draftwise.scheduler) calls for one request or many:

    ask(st, batch, room)            tokens to ask a cheap drafter for, before choosing
    select(st, batch, proposal)     -> the part of a cheap drafter's proposal to verify (may be none)
    deferred(st)                    -> (member, D, stop, behind) when select chose a member with a
                                       model, which drafts after the step's choices are settled; else None
    choose(st, batch, available, behind) -> D this round (0: a plain step), for a draft model
    pays(batch)                     does the step as the requests chose it beat a plain step?
    stop(st)                        the draft model's early-stop rule for this round, or None
    learn(st, round)                what the round showed (after verification)
    observe_step(step)              the step's measured times
    begin(st) / finish(st)          a request's first token was committed / it ended

`st` is the scheduler's RequestState; the policy keeps its own per-request state in `st.policy`.
`batch` (draftwise.planner.Batch) is the step being assembled, `batch.me` the request's place in
it; select and choose record the request's choice in it, so the requests after it price their
drafts against the step as it then stands.
A request that fixes its own D (`Request.num_draft_tokens`) keeps it under either policy.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftwise.costs import CostCurve
from draftwise.drafters.base import Drafter, Proposal, StopRule
from draftwise.planner import Batch, Plan, Planner, RequestPlan, planner_defaults
from draftwise.request import PlanStep
from draftwise.sampling import SamplingParams, target_top
from draftwise.verify import VerifyResult


def tree_steps(prop: Proposal) -> list[float]:
    """[d] each node's own step: its score over its parent's (the frequency of its token among its
    siblings' continuations), the chance a tree's node is right once its parent is."""
    c = prop.confidence or [1.0] * len(prop.tokens)
    above = [c[q] if q >= 0 else 1.0 for q in prop.parents]
    return [ci / a if a > 0 else 0.0 for ci, a in zip(c, above)]


def shadow_tree(planner: Planner, req: RequestPlan, tree: Proposal, p_accept) -> None:
    """A candidate tree a plain step was chosen over: its first-level nodes (the root's children)
    scored like a chain's shadow, each by p_accept(token), the chance the plain step's target
    would have accepted it (greedy: 1 for its token, else 0)."""
    if not tree.confidence:
        return
    first, steps = [i for i, q in enumerate(tree.parents) if q == -1], tree_steps(tree)
    planner.observe_nodes(req, 0, [steps[i] for i in first], [p_accept(tree.tokens[i]) for i in first])


@dataclass(slots=True)
class RoundOutcome:
    """One request's round, as the policy learns from it."""
    proposal: Proposal
    result: VerifyResult
    logits: torch.Tensor  # [d+1, V] the target's rows of this round
    params: SamplingParams
    shadow: int | None  # a cheap drafter's unverified first token (D = 0 chosen over it)
    round_s: float  # measured seconds of the step up to this request's verification
    unverified: Proposal | None = None  # the whole candidate the shadow heads
    first_probs: torch.Tensor | None = None  # [V] at temperature > 0: row 0 as verification warped it


@dataclass(slots=True)
class StepTimes:
    """One step's measured seconds: the target forward of at most `k` tokens per sequence for
    `n_seqs` sequences, run as the forwards `parts` ((k, b) each), drafting (`forwards`
    draft-model forwards, the first catching up on `behind` tokens, when one sequence drafted),
    and the rest (`other_s`) less the work done per emitted token (its text, logprobs, delivery):
    plain decoding does that for the same tokens, so it prices no draft, while counted per step it
    would charge a plain step for the tokens a drafting step emitted (with logprobs on smollm2,
    ~0.3 ms a token: at 16 sequences emitting ~4 tokens each, ~20 ms on a ~60 ms step)."""
    k: int
    n_seqs: int
    forward_s: float
    draft_s: float
    other_s: float
    forwards: int = 0
    behind: int = 1
    parts: list[tuple[int, int]] | None = None
    dear: tuple[str, float] | None = None  # drafter auto: the member with a model that drafted, its seconds


class DraftPolicy(Protocol):
    max_draft: int  # the most draft tokens a round may propose: what the context must leave room for

    def begin(self, st) -> None: ...
    def ask(self, st, batch: Batch, room: int) -> int: ...
    def select(self, st, batch: Batch, cand: Proposal) -> Proposal: ...
    def deferred(self, st) -> tuple[str, int, StopRule | None, int] | None: ...
    def choose(self, st, batch: Batch, available: int, behind: int) -> int: ...
    def pays(self, batch: Batch) -> bool: ...
    def stop(self, st) -> StopRule | None: ...
    def learn(self, st, outcome: RoundOutcome) -> None: ...
    def observe_step(self, step: StepTimes) -> None: ...
    def finish(self, st) -> None: ...


_NONE = Proposal([])


class FixedDraftLength:
    """D tokens every round (fewer when the output has less room), or none while more than
    `off_above` requests run."""

    def __init__(self, d: int, off_above: int | None = None):
        self.max_draft, self.off_above = d, off_above

    def _d(self, st, batch: Batch) -> int:
        if self.off_above is not None and len(batch.feeds) > self.off_above:
            return 0
        return self.max_draft if st.req.num_draft_tokens is None else st.req.num_draft_tokens

    def ask(self, st, batch: Batch, room: int) -> int:
        return min(self._d(st, batch), room)

    def select(self, st, batch: Batch, cand: Proposal) -> Proposal:
        if cand.options is not None:  # drafter auto with a fixed D: the longest proposal
            cand = max(cand.options.values(), key=lambda p: len(p.tokens))
        return cand.head(self.choose(st, batch, len(cand.tokens), 1))

    def choose(self, st, batch: Batch, available: int, behind: int) -> int:
        d = min(self._d(st, batch), available)
        batch.record(d, 1.0)
        return d

    def pays(self, batch: Batch) -> bool: return True
    def deferred(self, st) -> None: return None
    def begin(self, st) -> None: ...
    def stop(self, st) -> StopRule | None: return None
    def learn(self, st, outcome: RoundOutcome) -> None: ...
    def observe_step(self, step: StepTimes) -> None: ...
    def finish(self, st) -> None: ...


@dataclass(slots=True)
class _Auto:
    """A request's state under the planner."""
    req: RequestPlan
    plan: Plan | None = None  # this round's


class PlannedDraftLength:
    """`auto`: the planner (draftwise.planner) picks each request's D every round from its
    acceptance so far and the measured forward costs at the step's batch size (0 included). A
    cheap drafter proposes first and the planner picks how much of it to verify (an unverified
    first token, the shadow, is scored after the plain step); a draft model is asked for the
    planner's D only, its catch-up after plain steps priced (`behind`) and its draft stopped
    early by the plan's StopRule."""

    def __init__(self, planner: Planner, drafter: Drafter):
        self.planner, self.cheap = planner, drafter.cheap
        self.max_draft = planner.max_draft

    def begin(self, st) -> None:
        if st.req.num_draft_tokens is not None:
            return  # fixed by the request
        st.policy = _Auto(self.planner.open_request(st.out.remaining))  # the first token is committed next
        st.plans = []
        # the prediction covers the whole request, prefill included
        st.stats.predicted_s = st.stats.predicted_plain_s = st.stats.prefill_s

    def ask(self, st, batch: Batch, room: int) -> int:
        return min(self.max_draft if st.policy is not None else st.req.num_draft_tokens, room)

    def select(self, st, batch: Batch, cand: Proposal) -> Proposal:
        if cand.parents is None or st.policy is None or not cand.tokens:
            return cand.head(self.choose(st, batch, len(cand.tokens), 1))
        # a candidate tree: how many of its nodes (best first) to verify, from each node's chance
        # of being on the accepted path: its parent's times the calibrated chance of its own step
        node_p = self.planner.node_chances(st.policy.req, cand.parents, tree_steps(cand))  # [d]
        st.policy.plan = plan = self.planner.plan(st.policy.req, batch, available=len(cand.tokens), node_p=node_p)
        batch.record(plan.d, plan.expected)
        return cand.head(plan.d)

    def choose(self, st, batch: Batch, available: int, behind: int) -> int:
        if st.policy is None:
            d = min(st.req.num_draft_tokens, available)
            batch.record(d, 1.0)
            return d
        st.policy.plan = plan = self.planner.plan(st.policy.req, batch, available=available, behind=behind)
        plan.behind = behind
        batch.record(plan.d, plan.expected)
        return plan.d

    def pays(self, batch: Batch) -> bool:
        return self.planner.step_pays(batch)

    def deferred(self, st) -> None:
        return None

    def stop(self, st) -> StopRule | None:
        return None if st.policy is None or st.policy.plan is None else st.policy.plan.stop

    def learn(self, st, o: RoundOutcome) -> None:
        if st.policy is None:
            return
        plan, req, res, prop = st.policy.plan, st.policy.req, o.result, o.proposal
        # the planner's predicted seconds for the tokens this round emitted, and for plain steps
        # emitting them (the round's planned E[N] would count tokens an early stop never drafted)
        st.stats.predicted_s += len(res.tokens) / plan.rate
        st.stats.predicted_plain_s += len(res.tokens) / plan.plain_rate
        top = None if self.cheap else target_top(o.logits, len(prop.tokens), res.num_accepted)
        tree = prop.parents is not None and bool(prop.tokens)
        self.planner.commit(req, plan, len(prop.tokens), res.num_accepted, len(res.tokens),
                            tree_steps(prop) if tree else prop.confidence, prop.stop_confidence, o.round_s, top,
                            path=(res.path if res.path is not None else list(range(res.num_accepted))) if tree else None,
                            parents=prop.parents if tree else None)  # a tree drafter's chain: its first nodes
        if o.shadow is not None:  # P(accept) of the unverified token: p(x) at the plain step's position
            # greedy: the round's first token is the target's argmax there (verify computed it)
            top, probs = (res.tokens[0], None) if o.params.greedy else (None, o.first_probs)
            self.planner.shadow(req, float(o.shadow == top) if probs is None else float(probs[o.shadow]))
            tree = o.unverified if o.unverified is not None and o.unverified.parents is not None else None
            if tree is not None:
                shadow_tree(self.planner, req, tree,
                            (lambda x: float(x == top)) if probs is None else (lambda x: float(probs[x])))
        st.plans.append(PlanStep(plan.d, len(prop.tokens), plan.behind if plan.d and not self.cheap else 0,
                                 round(1e3 * (plan.seconds or 1.0 / plan.plain_rate), 1),
                                 round(1e3 * o.round_s, 1), round(1e3 * self.planner.draft_cost(1), 1)))
        st.policy.plan = None

    def observe_step(self, s: StepTimes) -> None:
        self.planner.observe_times(s.k, s.n_seqs, s.forward_s, s.forwards, s.behind, s.draft_s, s.other_s,
                                   parts=s.parts)

    def finish(self, st) -> None:
        if st.policy is not None:  # its tokens after the first, as its cap counts them (begin)
            self.planner.close_request(st.policy.req, len(st.out.token_ids))


@dataclass(slots=True)
class _Choice:
    """A request's state: one planner state per member, this round's plan and choice."""
    reqs: dict[str, RequestPlan]
    plan: Plan | None = None
    chosen: str | None = None  # the member verified this round; None: a plain step
    unverified: dict[str, Proposal] = field(default_factory=dict)  # cheap members not chosen: what each would have verified
    room: int = 0  # the most tokens this round may draft
    emitted: int = 0  # tokens the request's rounds without a model member have emitted so far ...
    spent_s: float = 0.0  # ... and those rounds' seconds on the cost curves (their plans')


class DrafterChoice:
    """`--drafter auto` with D `auto`: which drafter, and how much of its proposal, each round.

    Every cheap drafter of an AutoDrafter proposes each round (draftwise.drafters.auto). Each member
    has its own planner (draftwise.planner) with its own acceptance estimates per request and per
    workload, all priced on one shared verify curve; a cheap member's drafting on the measured time
    of the whole proposing call (all cheap members propose, so all are paid for), a member with a
    model (draft model, head) on its own forward-cost curve, with the catch-up on the tokens it has
    not seen since it last drafted (`behind`: what switching to it costs). The round verifies the
    member whose plan promises the highest rate (the batched step's, Plan.step_rate; alone, E[N](D)
    / T(D)); each plan already beats a plain step by its margin), or none: a plain step. A member
    with a model drafts after the choice (`deferred`). Cheap members that were not verified still
    learn, from the same context's verification: greedy, the round's emitted tokens are the
    target's own, so a proposal is judged against them position by position as far as they go
    (Planner.counterfactual: as if it had been verified, up to that length), and a member's
    estimate of deep positions keeps up while another member is chosen; at temperature > 0, its
    first token is scored against the target's distribution at the round's first position (a
    shadow, as the single-drafter `auto` does for a proposal it did not verify). A member with a
    model that sat out drafted nothing; it learns from the target's own top probability at the
    round's first position (its planner's target_calib: how often the draft agrees with the target
    at that confidence), as `model:auto` does at a plain step."""

    def __init__(self, planners: dict[str, Planner], dear: dict[str, Drafter] | None = None):
        if not planners:
            raise ValueError("drafter auto needs a planner per drafter")
        self.planners, self.dear = planners, dear or {}
        self.max_draft = max(p.max_draft for p in planners.values())

    def begin(self, st) -> None:
        if st.req.num_draft_tokens is not None:
            return  # fixed by the request: FixedDraftLength.select's rule
        st.policy = _Choice({n: p.open_request(st.out.remaining) for n, p in self.planners.items()})  # as _Auto's
        st.plans = []
        st.stats.predicted_s = st.stats.predicted_plain_s = st.stats.prefill_s

    def ask(self, st, batch: Batch, room: int) -> int:
        if st.policy is not None:
            st.policy.room = min(self.max_draft, room)
        return min(self.max_draft if st.policy is not None else st.req.num_draft_tokens, room)

    def select(self, st, batch: Batch, cand: Proposal) -> Proposal:
        options = cand.options or {}
        if st.policy is None:  # a request's own D: the longest proposal
            best = max(options.values(), key=lambda p: len(p.tokens), default=_NONE)
            out = best.head(min(st.req.num_draft_tokens, len(best.tokens)))
            batch.record(len(out.tokens), 1.0)
            return out
        c = st.policy
        plans = {n: self.planners[n].plan(c.reqs[n], batch, available=len(p.tokens)) for n, p in options.items()}
        # a member with a model is priced before drafting, its catch-up included, which must win
        # back its cost against the rate the request has gone at without one (the tokens its cheap
        # members' rounds and plain steps emitted over their seconds on the same curves), not a
        # plain step's: switching from a cheap member that copies well rarely repays a long prompt's
        base = c.emitted / c.spent_s if c.spent_s > 0 else None
        for n, member in self.dear.items():
            behind = member.pending(st.key, st.ctx)
            plans[n] = self.planners[n].plan(c.reqs[n], batch, available=c.room, behind=behind, base_rate=base)
            if plans[n].d and not member.ready(st.key, st.ctx):  # a head lacking the context's
                st.collect = True  # features: this step collects them, it drafts from the next
                plans[n] = self.planners[n].plan(c.reqs[n], batch, available=0, behind=behind, base_rate=base)
            plans[n].behind = behind
        live = [n for n in plans if plans[n].d > 0]
        c.chosen = max(live, key=lambda n: plans[n].step_rate, default=None)
        if c.chosen in self.dear and getattr(self.dear[c.chosen], "features", None) is not None:
            st.collect = True  # the head reads this round's features when it catches up next round
        c.plan = plans[c.chosen] if c.chosen is not None else next(iter(plans.values()), None)
        c.unverified = {n: p for n, p in options.items() if p.tokens and n != c.chosen}
        if c.chosen is None:
            batch.record(0, 1.0)
            return _NONE
        batch.record(c.plan.d, c.plan.expected)
        return _NONE if c.chosen in self.dear else options[c.chosen].head(c.plan.d)

    def deferred(self, st) -> tuple[str, int, StopRule | None, int] | None:
        c = st.policy
        if c is None or c.chosen not in self.dear:
            return None
        return c.chosen, c.plan.d, c.plan.stop, c.plan.behind

    def choose(self, st, batch: Batch, available: int, behind: int) -> int:
        raise TypeError("drafter auto is asked through select (its cheap members propose first)")

    def pays(self, batch: Batch) -> bool:
        return self._any.step_pays(batch)  # the planners share the verify curve

    def stop(self, st):
        return None

    def learn(self, st, o: RoundOutcome) -> None:
        c = st.policy
        if c is None or c.plan is None:
            return
        res, prop, emitted = o.result, o.proposal, len(o.result.tokens)
        st.stats.predicted_s += emitted / c.plan.rate
        st.stats.predicted_plain_s += emitted / c.plan.plain_rate
        dear = c.chosen in self.dear
        # a member with a model that sat out: the target's confidence at the round's first
        # position, a shadow of its acceptance (as a plain step is for `model:auto`), so it can
        # be chosen on evidence of this request rather than on its prior alone
        sat_out_top = target_top(o.logits, 0, 0) if any(n != c.chosen for n in self.dear) else None
        if not dear:
            c.emitted, c.spent_s = c.emitted + emitted, c.spent_s + (c.plan.seconds or 1.0 / c.plan.plain_rate)
        for name, planner in self.planners.items():
            req = c.reqs[name]
            if name == c.chosen:
                top = target_top(o.logits, len(prop.tokens), res.num_accepted) if dear else None
                planner.commit(req, c.plan, len(prop.tokens), res.num_accepted, emitted, prop.confidence,
                               prop.stop_confidence, o.round_s, top)
                continue
            plain = Plan(0, c.plan.plain_rate, c.plan.plain_rate, seconds=c.plan.seconds)  # the round's seconds (forgone_s)
            planner.commit(req, plain, 0, 0, emitted, target_top=sat_out_top if name in self.dear else None)
            other = c.unverified.get(name)
            if other is None:
                continue
            if o.params.greedy:  # the round's tokens are the target's argmax: they verify it as far as they go
                planner.counterfactual(req, other.tokens, res.tokens, other.confidence)
            else:  # P(accept) of its first token at the round's first position
                planner.shadow(req, float(o.first_probs[other.tokens[0]]))
        chosen = self.planners[c.chosen] if c.chosen is not None else None
        st.plans.append(PlanStep(c.plan.d if chosen else 0, len(prop.tokens), c.plan.behind if dear else 0,
                                 round(1e3 * (c.plan.seconds or 1.0 / c.plan.plain_rate), 1),
                                 round(1e3 * o.round_s, 1), round(1e3 * (chosen or self._any).draft_cost(1), 1),
                                 c.chosen or "none"))
        c.plan, c.chosen, c.unverified = None, None, {}

    @property
    def _any(self) -> Planner:
        return next(iter(self.planners.values()))

    def observe_step(self, s: StepTimes) -> None:
        """The verify curve is shared: observed once. Cheap members' planners see the proposing
        call's time; the member with a model that drafted, its own forwards and seconds; the
        others nothing of the drafting."""
        dear_s = s.dear[1] if s.dear else 0.0
        for i, (name, p) in enumerate(self.planners.items()):
            if name in self.dear:
                mine = s.dear is not None and s.dear[0] == name
                p.observe_times(s.k, s.n_seqs, s.forward_s, s.forwards if mine else 0, s.behind,
                                dear_s if mine else 0.0, s.other_s, curve=i == 0, parts=s.parts)
            else:
                p.observe_times(s.k, s.n_seqs, s.forward_s, 0, 1, s.draft_s - dear_s, s.other_s,
                                curve=i == 0, parts=s.parts)

    def finish(self, st) -> None:
        if st.policy is not None:
            for name, p in self.planners.items():  # as _Auto's
                p.close_request(st.policy.reqs[name], len(st.out.token_ids))


# The most draft tokens a round may verify. A cheap drafter's tokens cost nothing to draft, so its
# rounds are bounded by the verify curve alone: llama.cpp's steps at multiples of 16 rows (AMD
# EPYC, repacked kernels: 16 tokens 155 ms, 32 tokens 274 ms; docs/planner.md), so a passage the
# drafter knows whole (the same request asked again) verifies for ~12% fewer ms a token in 32-token
# rounds, which the planner takes where acceptance is near 1. A draft model pays a forward per
# drafted token, which such lengths never repay.
MAX_DRAFT_CHEAP, MAX_DRAFT_MODEL = 32, 16


def default_max_draft(drafter: Drafter) -> int:
    return MAX_DRAFT_CHEAP if drafter.cheap else MAX_DRAFT_MODEL


def make_planner(runner, drafter: Drafter, max_draft: int | None = None, batch_sizes=(1,), log=None,
                 verify_curve: CostCurve | None = None, **kw) -> Planner:
    """A planner over the measured forward-cost curves of the target (and of the draft model),
    measured once per machine and cached (draftwise.profile.cached_profile); `verify_curve`: the
    target's curve already loaded (planners sharing it). `max_draft`: default_max_draft."""
    from draftwise.profile import cached_profile

    max_draft = max_draft or default_max_draft(drafter)
    verify = verify_curve or verify_profile(runner, max_draft, batch_sizes, log)
    draft = None
    if not drafter.cheap:
        draft = CostCurve.from_profile(cached_profile(drafter.runner, (1,), range(1, 18), log=_log(log)))
    return Planner(verify, draft, max_draft=max_draft, **{**planner_defaults(drafter.name, verify, draft, max_draft), **kw})


def _log(log):
    return log or (lambda m: print(m, file=sys.stderr))


def verify_profile(runner, max_draft: int, batch_sizes=(1,), log=None) -> CostCurve:
    """The target's verify curve over k = 1..max_draft + 1 (at least 1..17), measured once per
    machine and cached. At several batch sizes (the server) only k = 1..17: k up to 33 would feed
    ~3.7x the tokens on its first start (16 sequences of each k); past 17 the curve extrapolates
    (CostCurve)."""
    from draftwise.profile import cached_profile

    ks = range(1, (max(max_draft, 16) if tuple(batch_sizes) == (1,) else 16) + 2)
    return CostCurve.from_profile(cached_profile(runner, batch_sizes, ks, log=_log(log)))


def make_policy(num_draft_tokens: int | str, runner, drafter: Drafter | None, batch_sizes=(1,),
                off_above: int | None = None, planner: Planner | None = None) -> DraftPolicy:
    """The policy for a D setting: "auto" (with a drafter) plans, an integer is fixed; no
    drafter means plain decoding whatever D says."""
    if drafter is None:
        return FixedDraftLength(0)
    if num_draft_tokens == "auto" and drafter.name == "auto":
        return make_choice(runner, drafter, batch_sizes=batch_sizes)
    if num_draft_tokens == "auto":
        return PlannedDraftLength(planner or make_planner(runner, drafter, batch_sizes=batch_sizes), drafter)
    return FixedDraftLength(num_draft_tokens, off_above)


def make_choice(runner, drafter, batch_sizes=(1,), log=None) -> DrafterChoice:
    """One planner per member of an AutoDrafter (each with its default_max_draft), on the target's
    one measured verify curve."""
    members = drafter.members
    verify = verify_profile(runner, max(default_max_draft(m) for m in members.values()), batch_sizes, log)
    planners = {name: make_planner(runner, member, batch_sizes=batch_sizes, log=log, verify_curve=verify)
                for name, member in members.items()}
    return DrafterChoice(planners, drafter.dear)
