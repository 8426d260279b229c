"""Draft length from measured cost and acceptance: pick D per round to maximise tokens per second.

The model (docs/planner.md has the derivation and its assumptions):

    alpha_i   = P(draft token i accepted | tokens 1..i-1 accepted)   per request, Beta posterior
    E[N](D)   = 1 + sum_{i=1..D} prod_{j<=i} alpha_j                  tokens emitted by a round
    T(D, b)   = T_draft(D) + T_verify(D + 1, b) + overhead             seconds per round, b sequences
    rate(D)   = E[N](D) / T(D, b)                                     D = 0 is a plain step

D* = argmax rate(D) over 0..max_draft; a D > 0 must beat plain by `margin`, plus `risk` per plain
step the round would waste if rejected, so an uncertain gain does not make a request slower than
plain decoding (`keep_margin`, lower, would let a caught-up draft model go on at a smaller
predicted gain: hysteresis against paying a catch-up at each resume; off by default, see
Planner.__init__). T_verify comes from a measured forward-cost
profile (draftwise.profile, every k, per batch size), scaled online by the ratio of measured to
predicted forward time; T_draft from the draft model's profile, or the measured per-call time of
a cheap drafter. When the draft model has fallen behind (it is not fed while D = 0), resuming
costs a catch-up forward; it is paid once, so it is set against the time speculation would save
over the rest of the request rather than against one round, at the rate the request's long-memory
acceptance (RequestPlan.whole) promises one standard deviation down, over as many tokens as recent
requests that got as far ran on (Planner.expected_remaining; not all of max_tokens).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from draftwise.acceptance import Acceptance, Calibration, expected_tokens
from draftwise.costs import EMA, CostCurve
from draftwise.drafters.base import StopRule, common_prefix


@dataclass(slots=True)
class Batch:
    """The batched step that a request plans its round in, as assembled so far: the new tokens
    each sequence feeds (1 until its request has chosen its D) and the tokens each is expected to
    emit, and how the runner runs such a forward (`split`: per-sequence counts -> (k, b) forwards,
    draftwise.backends.base.forward_parts). `me`: the planning request's index. `alike`: price
    the step as if every sequence fed what the planning request feeds (and gained alike)."""
    feeds: list[int]  # [n]
    emits: list[float]  # [n]
    split: Callable[[list[int]], list[tuple[int, int]]]
    me: int = 0
    alike: bool = False
    _seconds: dict[tuple[int, ...], float] = field(default_factory=dict)  # sorted feeds -> forward seconds
    _rows: dict[tuple, np.ndarray] = field(default_factory=dict)  # forwards(): (alike, others, d_max) -> row

    @classmethod
    def of(cls, n: int, split=None, alike: bool = False) -> Batch:
        return cls([1] * n, [1.0] * n, split or (lambda ks: [(max(ks), len(ks))]), alike=alike)

    def forward_s(self, curve: CostCurve, ks: list[int]) -> float:
        """Seconds of the step's forward with these per-sequence feeds, run as `split` says (any
        order of the feeds runs alike), priced once per step: every request's choice prices the
        same few shapes, and the curve does not change while a step is planned."""
        key = tuple(sorted(ks))
        got = self._seconds.get(key)
        if got is None:
            got = self._seconds[key] = curve.parts(self.split(list(key)), len(key))
        return got

    def forwards(self, curve: CostCurve, d_max: int) -> np.ndarray:  # [d_max + 1]
        """Seconds of the step's forward with the planning request feeding 1..d_max + 1 tokens,
        the others as they stand (alike: every sequence feeding the same), priced once per shape:
        the alike sweep prices one row for every request, and requests that see the same others
        share theirs."""
        others = () if self.alike else tuple(sorted(self.feeds[:self.me] + self.feeds[self.me + 1:]))
        key = (self.alike, others, d_max)
        got = self._rows.get(key)
        if got is None:
            n = len(self.feeds)
            got = self._rows[key] = np.array([
                self.forward_s(curve, [k] * n if self.alike else [*others, k]) for k in range(1, d_max + 2)])
        return got

    def record(self, d: int, expected: float) -> None:
        """The planning request chose d draft tokens, expecting to emit `expected` tokens."""
        self.feeds[self.me], self.emits[self.me] = 1 + d, expected


@dataclass(slots=True)
class Plan:
    d: int  # draft tokens to propose this round (0 = plain step)
    rate: float  # predicted tokens per second of the chosen D, for this request (it waits the whole step)
    plain_rate: float  # predicted tokens per second of a plain step
    stop: StopRule | None = None  # early stop inside the draft: see Planner._stop_rule
    behind: int = 1  # tokens the draft model catches up on before drafting
    probe: bool = False  # a short draft to measure acceptance (the estimate alone says D = 0)
    seconds: float = 0.0  # predicted seconds of the round, catch-up included (0: a plain step's, 1 / plain_rate)
    step_rate: float = 0.0  # predicted tokens per second of the whole batched step (alone: rate)
    expected: float = 1.0  # tokens this request's round is expected to emit, E[N](d)


@dataclass(slots=True)
class RequestPlan:
    """A request's planner state: its acceptance posterior and how much output is left."""
    acceptance: Acceptance
    remaining: int
    whole: Acceptance | None = None  # the same evidence with a long memory: what a catch-up is judged by
    plans: list[int] = field(default_factory=list)  # D chosen each round
    next_probe: int = 0  # no probe before this many rounds; the gap doubles after each probe
    probe_gap: int = 2
    probed: bool = False  # its first probe ran
    saved_s: float = 0.0  # since then: measured seconds its speculative rounds saved over plain steps
    cap: int = 0  # its max_tokens after the prefill's token (0: nothing to plan; no length recorded)
    # before its draft model first drafts (Planner._looks): the model's planned rate on the
    # request's current estimate (0: it would not pay), and the seconds it would have saved so far
    model_rate: float = 0.0
    forgone_s: float = 0.0
    # a candidate tree's nodes that its verification reached, root's children and deeper nodes
    # (Planner.tree_calib's two kinds): [kind][accepted, expected by the run's calibration]
    tree_fit: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))

    def estimates(self) -> list[Acceptance]:
        """The request's acceptance estimates, which every observation updates alike."""
        return [self.acceptance] if self.whole is None else [self.acceptance, self.whole]


class Planner:
    """Chooses D per round from the target's verify curve, the drafter's cost and the request's
    acceptance. `draft_curve` is the draft model's forward curve (None for a cheap drafter such
    as n-gram, whose measured per-call time is used). With `online=False` the curves are never
    rescaled by measured times, so the D chosen is a function of the tokens alone and seeded
    sampling is reproducible (given the same profiles)."""

    def __init__(self, verify_curve: CostCurve, draft_curve: CostCurve | None = None,
                 prior: float | list[float] = 0.6, max_draft: int = 16, margin: float = 0.03,
                 online: bool = True, prior_strength: float = 0.5, probe_max: int = 2, look_first: int | None = None,
                 keep_margin: float | None = None, whole_forget: float = 0.97, whole_strength: float = 2.0,
                 whole_z: float = 1.0, risk: float = 0.0, tree_pseudo: float = 2.0):
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.verify, self.draft = verify_curve, draft_curve
        self.max_draft, self.margin, self.online, self.probe_max = max_draft, margin, online, probe_max
        self.risk = risk  # extra margin per plain step a rejected round wastes (_best)
        self.look_first = look_first  # a cap on the plain steps before paying the prompt's catch-up (_looks)
        # the margin a caught-up draft model must keep beating plain by (None: `margin`); lower
        # is hysteresis against paying a catch-up at each resume (off by default: docs/planner.md)
        self.keep_margin = keep_margin
        self.whole_forget, self.whole_strength, self.whole_z = whole_forget, whole_strength, whole_z  # RequestPlan.whole
        p = np.broadcast_to(np.asarray(prior, dtype=np.float64), (max_draft,)).copy()
        self.workload = Acceptance(p, strength=prior_strength, forget=0.97)  # recent requests
        self.draft_call_s = 1e-4  # cheap drafter: seconds per propose call (EMA)
        self.calib = Calibration()  # acceptance as a function of the draft's own probability
        self.target_calib = Calibration()  # ... and of the target's own top probability at the position
        # P(a reached tree node is accepted | its own step, tree_steps), for the root's children
        # (does a copy start here?) and for deeper nodes (does it go on?), which differ most
        self.tree_calib = (Calibration(0.05), Calibration(0.05))
        self.tree_pseudo = tree_pseudo  # a request's record against tree_calib starts here (node_chances)
        self._paid = [0.0, 0.0]  # recent requests' first probes: (discounted) paid off, all
        self.overhead_s = 0.0  # per round, besides forwards and drafting (EMA)
        # recent requests' (tokens emitted, ended before their cap): how long requests run on
        self.lengths: deque[tuple[int, bool]] = deque(maxlen=LENGTHS_KEPT)

    def new_request(self, max_tokens: int) -> RequestPlan:
        """A request starts from the workload's estimate, worth one round of its own evidence:
        enough to start from what this engine has seen, weak enough that a request unlike the
        previous ones (a summary after code edits) overrides it within a few rounds."""
        prior = self.workload.alpha()
        whole = None if self.draft is None else Acceptance(prior, self.whole_strength, self.whole_forget)
        return RequestPlan(Acceptance(prior, strength=1.0), max_tokens, whole, cap=max_tokens)

    def open_request(self, max_tokens: int) -> RequestPlan:
        """A request as the engine runs it: its prefill emits the first token before any round is
        planned, so its plan counts the max_tokens - 1 tokens after that one (close_request)."""
        return self.new_request(max_tokens - 1)

    def close_request(self, req: RequestPlan, delivered: int) -> None:
        """A request opened with open_request ended, having delivered `delivered` tokens in all
        (the prefill's included)."""
        self.finish(req, delivered - 1)

    def draft_cost(self, d: int, behind: int = 1) -> float:
        """Seconds to draft d tokens: one forward feeding the `behind` tokens the draft model has
        not seen, then one forward per further token; a cheap drafter's measured call time."""
        if d == 0:
            return 0.0
        if self.draft is None:
            return self.draft_call_s
        return self.draft(max(behind, 1)) + (d - 1) * self.draft(1)

    def plan(self, req: RequestPlan, batch: Batch | None = None, available: int | None = None,
             behind: int = 1, node_p: np.ndarray | None = None, base_rate: float | None = None) -> Plan:
        """D for this round. `batch`: the step the round joins (None: the request alone);
        `available` caps D (a cheap drafter's proposal length, or the room left); `behind` is how
        many tokens a draft model must catch up on first; `base_rate`: the tokens per second the
        request goes on at without this drafter (`--drafter auto`: its tokens so far over its
        rounds' seconds on the cost curves), which the saving of a first probe's or a plan's
        catch-up is counted against instead of plain decoding's (a later probe must beat plain by
        the margin, catch-up included, and then compete with the other members per round).

        `node_p` (a cheap drafter's candidate tree, best first): each node's chance of being on the
        accepted path (tree_calib of its score), so the first d nodes are expected to add
        sum(node_p[:d]) accepted tokens; D is then how many nodes to verify (a chain when the best
        nodes form one, none when no d beats plain), priced on the same curve as a chain of d.

        In a batch, a cheap drafter's round is priced by what it adds to the step (_step_costs):
        its tokens join the forward the runner runs for the whole batch, a ragged batch as the
        runner splits it, and every request in the step waits for that forward, so a draft pays
        when the step's expected tokens per second rise, not this request's alone. A draft
        model's drafts run in lockstep, so it is priced as b sequences of D + 1 tokens each.

        A draft model also gets an early-stop rule (_stop_rule). A probe's round time counts
        the catch-up it pays; a plan that keeps speculating pays it once (_catch_up_pays)."""
        d_max = min(self.max_draft, req.remaining - 1)
        if available is not None:
            d_max = min(d_max, available)
        n_seqs = 1 if batch is None else len(batch.feeds)
        measuring = self.online and not self.verify.plain_known(n_seqs)
        if measuring:
            d_max = 0  # the plain step at this batch size is measured first (CostCurve.plain_known)
        others = 0.0  # the rest of the step's expected tokens (a cheap drafter's round in a batch)
        if n_seqs > 1 and self.draft is None:
            t0, t, others = self._step_costs(d_max, batch)  # t: [d_max] seconds of the step
        else:
            t0, t = self.verify.plain(n_seqs) + self.overhead_s, self._round_costs(d_max, n_seqs)
        r_plain = 1.0 / t0
        plain = Plan(0, r_plain, r_plain, step_rate=(others + 1.0) * r_plain)
        if measuring:
            return plain
        catch_up = self._catch_up_s(behind)  # 0 unless a draft model fell behind
        r_base = r_plain if base_rate is None else max(r_plain, base_rate)  # what a catch-up must beat
        alpha = req.acceptance.alpha()  # [max_draft], once per round
        if self.draft is not None and behind > 1 and not any(req.plans):
            if len(t):  # (d_max = 0, e.g. a head lacking features asked again: the estimate stays)
                d_m, r_m = self._best(alpha, t, r_plain, 0.0, 0.0)
                req.model_rate = r_m if d_m > 0 else 0.0  # what a round without the model forgoes (commit)
            if self._looks(req, catch_up, r_plain):
                return plain  # rent before buying the prompt's catch-up: see _looks
        up = req.acceptance.upper()  # [max_draft]
        going = self.draft is not None and bool(req.plans) and req.plans[-1] > 0  # caught up
        keep = self.margin if self.keep_margin is None else min(self.keep_margin, self.margin)
        if node_p is not None:  # a tree: expected accepted tokens of its first d nodes
            gains = np.cumsum(node_p[: len(t)])
            best_d, best_r = self._best(alpha, t, r_plain, self.margin, others=others, gains=gains)
            if best_d == 0:
                return plain
            seconds, tokens = float(t[best_d - 1]), 1.0 + float(gains[best_d - 1])
            return Plan(best_d, tokens / seconds, r_plain, seconds=seconds, step_rate=best_r, expected=tokens)
        best_d, best_r = self._best(alpha, t, r_plain, keep if going else self.margin, others=others)
        if best_d == 0 and self.probe_max > 0 and self.draft is not None \
                and len(req.plans) >= req.next_probe:  # would optimism pay? then probe, ever more rarely
            d_up, r_up = self._best(up, t, r_plain)
            if d_up > 0:
                best_d = min(d_up, self.probe_max)
                t_probe = t[best_d - 1] + catch_up
                best_r = expected_tokens(alpha, best_d) / t_probe
                # the first probe pays the prompt's catch-up, which any speculation needs: judged
                # over the rest of the request (_first_probe_pays); a later probe must pay for
                # itself, catch-up included
                later = any(req.plans)
                r_probe = expected_tokens(up, best_d) / t_probe
                if (r_probe > r_plain * (1 + self.margin)) if later else \
                        self._first_probe_pays(req, catch_up, t, r_plain, r_up, r_base):
                    return Plan(best_d, best_r, r_plain, probe=True, seconds=t_probe, step_rate=best_r,
                                expected=expected_tokens(alpha, best_d))
            return plain
        if best_d == 0:
            return plain
        if catch_up > 0 and not self._catch_up_pays(req, catch_up, r_base, self._whole_rate(req, t, r_plain, best_r)):
            return plain
        if self.probe_max > 0 and best_d < d_max:  # one position deeper if optimism about it says it
            deeper = t[best_d]  # pays its verify cost (not always: a verified position can be dear)
            reach = float(np.prod(alpha[:best_d]))
            if (others + expected_tokens(alpha, best_d) + reach * up[best_d]) / deeper > best_r:
                best_d += 1
                best_r = (others + expected_tokens(alpha, best_d)) / deeper
        stop = None if self.draft is None else self._stop_rule(alpha, best_d, best_r, n_seqs)
        seconds, tokens = float(t[best_d - 1]), expected_tokens(alpha, best_d)
        return Plan(best_d, tokens / seconds, r_plain, stop, seconds=seconds + catch_up, step_rate=best_r,
                    expected=tokens)

    def _step_costs(self, d_max: int, batch: Batch) -> tuple[float, np.ndarray, float]:
        """(seconds of the batch's step with this request plain, [d_max] seconds of it with this
        request's d = 1..d_max draft tokens, drafting included, and the other requests' expected
        tokens), as the batch stands: requests that chose before this one with their drafts, the
        rest as plain steps."""
        f = batch.forwards(self.verify, max(d_max, 0)) + self.overhead_s  # [d_max + 1]
        others = 0.0 if batch.alike else float(sum(batch.emits) - batch.emits[batch.me])
        return float(f[0]), f[1:] + self.draft_cost(1), others  # a cheap drafter: one call, any d

    def step_pays(self, batch: Batch) -> bool:
        """Does the batched step as its requests chose it (feeds, emits) beat a plain step of the
        same sequences by `margin` in expected tokens per second? Forwards and overhead only: the
        candidates were proposed before either was chosen."""
        n = len(batch.feeds)
        if all(k == 1 for k in batch.feeds):
            return True
        t = batch.forward_s(self.verify, batch.feeds) + self.overhead_s
        return sum(batch.emits) / t > n / (batch.forward_s(self.verify, [1] * n) + self.overhead_s) * (1.0 + self.margin)

    def _stop_rule(self, alpha: np.ndarray, d: int, rate: float, n_seqs: int) -> StopRule:
        """Bars on the draft's own probability c_j of each token j it drafts. Token j is accepted
        with probability g(c_j) (Calibration) once tokens 1..j-1 are (reach_{j-1} = prod alpha_1..j-1),
        and its forward is already paid when c_j is read, so, at the rate this plan expects:
        - keep token j iff reach_{j-1} g(c_j) >= rate (T_verify(j+1) - T_verify(j)): its expected
          gain pays for one more verified position;
        - draft on iff reach_{j-1} g(c_j) tail_j >= rate (draft forwards j+1..d + T_verify(d+1) -
          T_verify(j+1)), tail_j = sum_{i=j+1..d} prod_{l=j+1..i} alpha_l: the rest of the plan as a
          whole (the curve need not be convex: past some k a verified token can be nearly free)."""
        g = self.calib.threshold  # a bar on g(c) -> the same bar on c
        reach = np.concatenate([[1.0], np.cumprod(alpha[:d])])  # [d+1] reach[j] = P(tokens 1..j accepted)
        v = [self.verify(k, n_seqs) for k in range(1, d + 2)]  # v[k-1] = T_verify(k)
        keep = [g(rate * max(v[j] - v[j - 1], 0.0) / reach[j - 1]) for j in range(1, d + 1)]
        go_on = []
        for j in range(1, d):
            cost = (d - j) * self.draft(1) + v[d] - v[j]
            tail = float(np.cumprod(alpha[j:d]).sum())
            go_on.append(g(rate * max(cost, 0.0) / (reach[j - 1] * tail)))
        return StopRule(keep, go_on)

    def _catch_up_s(self, behind: int) -> float:
        """Seconds a draft model's first forward costs beyond one token's, `behind` tokens behind."""
        return self.draft_cost(1, behind) - self.draft_cost(1, 1)

    def _whole_rate(self, req: RequestPlan, t: np.ndarray, r_plain: float, r_round: float) -> float:
        """The rate a catch-up is judged by: the lower of this round's and the one the request's
        long-memory estimate (`whole`) predicts. A catch-up is paid once for the rest of the
        request, and the short memory of `acceptance` follows a run of a few confident tokens
        that the rest of the request need not repeat."""
        if req.whole is None:
            return r_round
        return min(r_round, self._best(req.whole.lower(self.whole_z), t, r_plain, 0.0, 0.0)[1])

    def _looks(self, req: RequestPlan, catch_up: float, r_plain: float) -> bool:
        """Rent or buy: a request whose draft model has not drafted yet goes on without it (plain
        steps, or under `--drafter auto` the other members' rounds, whose target confidence and
        acceptance it learns from meanwhile) while the seconds the model would have saved on those
        rounds (`forgone_s`: each round's planned seconds minus its tokens at the model's planned
        rate on the request's estimate then, commit), one more plain step's included, still fit in
        the prompt's catch-up (`catch_up` seconds). So the catch-up is paid only once going on
        without the model has cost about as much as buying it would: a request that ends before
        never pays it, and, as far as the model's estimated rate holds, one that goes on loses at
        most about twice what the better choice in hindsight would have (the ski-rental bound);
        while the estimate says the model would not pay, it keeps looking. Rounds as fast as the
        model forgo nothing, so a request another member serves well keeps that member, and one
        the model would not speed up never pays. `look_first` caps the rounds without it."""
        if self.look_first is not None and len(req.plans) >= self.look_first:
            return False
        step = max(0.0, 1.0 / r_plain - 1.0 / req.model_rate) if req.model_rate > 0 else 0.0
        return req.forgone_s + step <= catch_up

    def _round_s(self, d: int, n_seqs: int) -> float:
        return self.draft_cost(d) + self.verify(d + 1, n_seqs) + self.overhead_s

    def _round_costs(self, d_max: int, n_seqs: int) -> np.ndarray:  # [max(d_max, 0)]
        return np.array([self._round_s(d, n_seqs) for d in range(1, max(d_max, 0) + 1)])

    def _best(self, alpha: np.ndarray, t: np.ndarray, r_plain: float, margin: float | None = None,
              risk: float | None = None, others: float = 0.0, gains: np.ndarray | None = None) -> tuple[int, float]:
        """argmax_d (others + E[N](d)) / T(d) over the d = 1..len(t) (t: round or step seconds;
        `gains`: [len(t)] expected accepted tokens of d draft tokens, else the chain's from alpha;
        `others`: the other requests' expected tokens in the step) that beat plain, (others + 1) x
        rate_plain, by the margin (the planner's unless given) plus `risk` (the planner's unless
        given) per plain step the round would waste if its whole draft were rejected,
        T(d) x rate_plain - 1. Returns (d, the step's rate); none: d = 0."""
        base = (others + 1.0) * r_plain
        if len(t) == 0:
            return 0, base
        if gains is None:
            gains = np.cumsum(np.cumprod(alpha[:len(t)]))
        t = t[: len(gains)]
        rates = (others + 1.0 + gains) / t  # [len(t)]
        m = self.margin if margin is None else margin
        k = self.risk if risk is None else risk
        need = base * (1.0 + m + k * np.maximum(t * r_plain - 1.0, 0.0))  # [len(t)]
        ok = (rates > need) & (rates > base)
        if not ok.any():
            return 0, base
        i = int(np.argmax(np.where(ok, rates, -np.inf)))  # the first of equal rates: the shortest draft
        return i + 1, float(rates[i])

    def _first_probe_pays(self, req: RequestPlan, catch_up: float, t: np.ndarray, r_plain: float,
                          r_up: float, r_base: float) -> bool:
        """Would the saving speculation promises over the rest of this request win back the
        prompt's catch-up? The rate is the lower of two optimistic bounds, this request's (wide:
        it has seen nothing) and the recent requests' (tight once they are many), and the saving
        is weighed by the chance that a first probe pays off at all (probes_pay), whose bound
        alone never falls below ~0.16 (10 requests' worth of evidence at 0.9 decay)."""
        d_w, r_w = self._best(self.workload.upper(), t, r_plain)
        return d_w > 0 and self._catch_up_pays(req, catch_up, r_base, min(r_up, r_w), self.probes_pay())

    def _catch_up_pays(self, req: RequestPlan, catch_up: float, r_base: float, r_spec: float,
                       chance: float = 1.0) -> bool:
        """A draft model that fell behind catches up once (`catch_up` seconds, _catch_up_s; 0 when
        it has not); worth it if the rest of the request, at the speculative rate, saves more than
        that forward costs (times the chance that the saving happens at all: for a first probe, how
        often recent first probes paid off) against the rate it goes on at otherwise (`r_base`:
        plain decoding's, or under `--drafter auto` the request's rate so far without a model)."""
        if catch_up <= 0:
            return True
        return chance * self.expected_remaining(req) * (1.0 / r_base - 1.0 / r_spec) > catch_up

    def expected_remaining(self, req: RequestPlan) -> float:
        """Tokens the request is expected to emit from here, what a catch-up's saving is counted
        over: the mean, over the recent requests that emitted more than it has so far, of what they
        emitted beyond that (up to this request's room), with one request that runs to its cap as
        the prior. A request cut at its own max_tokens counts as running to this one's cap (it had
        not finished). Without such evidence: all the room left."""
        n = req.cap - req.remaining
        left = [req.remaining] + [min(length - n, req.remaining) if ended else req.remaining
                                  for length, ended in self.lengths if length > n]
        return sum(left) / len(left)

    def probes_pay(self) -> float:
        """Optimistic bound (mean + one sd, Beta(1, 1) prior) on the share of recent requests whose
        first probe paid off: their speculative rounds from the probe on, catch-up included, took
        less time than plain steps would have for the tokens they emitted (measured, each round's
        time against the current plain-step estimate). Where first probes keep finding a draft
        that does not pay, new requests stop paying for them; requests that do not probe widen
        the bound again."""
        m = (self._paid[0] + 1) / (self._paid[1] + 2)
        return min(m + float(np.sqrt(m * (1 - m) / (self._paid[1] + 3))), 1.0)

    def finish(self, req: RequestPlan, length: int) -> None:
        """A request ended: record its length (expected_remaining) and whether its first probe
        paid off. `length`: the tokens it delivered, as counted against `cap` (its rounds' emitted
        tokens would also count those past a stop string or EOS)."""
        if req.cap > 0:
            self.lengths.append((length, length < req.cap))
        if req.probed:
            self._record_probe(float(req.saved_s > 0))
        else:
            self._paid = [0.9 * x for x in self._paid]

    def _record_probe(self, paid: float) -> None:
        self._paid = [0.9 * self._paid[0] + paid, 0.9 * self._paid[1] + 1]

    def commit(self, req: RequestPlan, plan: Plan, proposed: int, accepted: int, emitted: int,
               confidence: list[float] | None = None, stop_confidence: float | None = None,
               round_s: float | None = None, target_top: list[float] | None = None,
               path: list[int] | None = None, parents: list[int] | None = None) -> None:
        """After a round (or plain step): update the request's and the workload's acceptance, and
        the calibration of the draft's probabilities (over the positions the target reached).
        `stop_confidence`: after an early stop, the draft's own probability of the token it dropped,
        or of the last token it kept (a proxy for the next one, which it did not draft).
        `round_s`: the round's measured seconds (drafting, catch-up included, and verification).
        `target_top` (a draft model's request): the target's own top probability at each position
        the step's verification reached (draftwise.sampling.target_top). A round teaches how often
        the draft agrees with the target at that confidence (target_calib); a plain step turns it
        into a shadow of every position (Acceptance.observe_shadow): the request's own evidence
        before its draft model has run at all (the recent requests' acceptance cannot tell a
        prose request from the code requests before it). `path`, `parents`: a candidate tree's
        round, its accepted nodes and each node's parent; `confidence` is then each node's own step
        (draftwise.policy.tree_steps): every node the verification reached (its parent accepted)
        calibrates tree_calib, P(accepted | reached, step); the chain's estimates, per position, do
        not describe a tree and are left alone."""
        if plan.d == 0 and req.model_rate > 0 and not any(req.plans):  # (model_rate: a draft model's)
            seconds = plan.seconds or 1.0 / plan.plain_rate  # the round's, as planned
            req.forgone_s += max(0.0, seconds - emitted / req.model_rate)  # _looks
        req.plans.append(plan.d)
        req.remaining -= emitted
        if path is not None:
            on, steps = set(path), confidence or []
            for deep in (0, 1):
                reached = [i for i, q in enumerate(parents or []) if (q >= 0) == bool(deep) and (q < 0 or q in on)]
                self.observe_nodes(req, deep, [steps[i] for i in reached], [float(i in on) for i in reached])
            return
        if confidence:
            self.calib.observe(confidence, accepted, min(accepted + 1, proposed, len(confidence)))
        shadow_top = None
        if target_top and self.draft is not None:
            if proposed > 0:
                self.target_calib.observe(target_top, accepted, min(accepted + 1, proposed, len(target_top)))
            else:
                shadow_top = self.target_calib(target_top[0])
        if plan.probe:
            req.probed = True
            req.next_probe, req.probe_gap = len(req.plans) + req.probe_gap, 2 * req.probe_gap
        elif plan.d > 0:
            req.probe_gap = 2
        if req.probed and plan.d > 0 and round_s is not None:
            req.saved_s += emitted * (self.verify.plain(1) + self.overhead_s) - round_s
        after = None if stop_confidence is None else self.calib(stop_confidence)
        observed = req.estimates() + [self.workload]
        if proposed > 0:
            for a in observed:
                a.observe(proposed, accepted, after)
        elif after is not None:  # the draft dropped its first token: a shadow of position 1
            for a in observed:
                a.observe_shadow(after)
        elif shadow_top is not None:  # the target's confidence: a shadow of every position
            for a in observed:
                a.observe_shadow(shadow_top, self.max_draft)
        else:  # nothing observed: the request's estimates drift back (the workload's do not)
            for a in req.estimates():
                a.relax()

    def node_chances(self, req: RequestPlan, parents: list[int], steps: list[float]) -> np.ndarray:  # [d]
        """A candidate tree's nodes' chances of being on the accepted path: each its parent's times
        the chance of its own step (draftwise.policy.tree_steps) once the parent is accepted. That
        chance is the run's calibration of the step (tree_calib, learned on every request's nodes)
        times how the request's own reached nodes fared against it so far, (accepted + tree_pseudo)
        / (expected + tree_pseudo), tree_pseudo expected nodes (about a round's) all accepted to
        start with: prose after code edits, whose nodes the run's calibration overrates, verifies
        fewer of them within a few rounds."""
        fit = (req.tree_fit[:, 0] + self.tree_pseudo) / (req.tree_fit[:, 1] + self.tree_pseudo)  # [2]
        p = np.zeros(len(parents))
        for i, (q, f) in enumerate(zip(parents, steps)):
            deep = int(q >= 0)
            p[i] = (1.0 if q < 0 else p[q]) * min(1.0, self.tree_calib[deep](f) * fit[deep])
        return p

    def observe_nodes(self, req: RequestPlan, deep: int, steps: list[float], accepted: list[float]) -> None:
        """Tree nodes of one kind (deep: 0, the root's children; 1, deeper) that verification
        reached, with their own steps and whether each was accepted (a fraction: a shadow's
        acceptance probability): the request's record against the run's calibration, then that."""
        calib = self.tree_calib[deep]
        req.tree_fit[deep] += (sum(accepted), sum(calib(f) for f in steps))
        calib.observe_nodes(steps, accepted)

    def counterfactual(self, req: RequestPlan, draft: list[int], target: list[int],
                       confidence: list[float] | None = None) -> None:
        """A cheap drafter's draft that was not verified, against the tokens greedy decoding emitted
        at the same positions (`target`, from the same context): where they differ the draft would
        have been rejected; past the last of them nothing is known. Observed as a round of
        min(len(draft), len(target)) tokens would have been."""
        d = min(len(draft), len(target))
        if d == 0:
            return
        accepted = common_prefix(draft[:d], target[:d])
        if confidence:
            self.calib.observe(confidence, accepted, min(accepted + 1, d, len(confidence)))
        for a in req.estimates() + [self.workload]:
            a.observe(d, accepted)

    def shadow(self, req: RequestPlan, p_accept: float) -> None:
        """A cheap drafter's unverified first token, scored against the plain step's target
        probabilities: keeps the acceptance estimate alive while D = 0."""
        for a in req.estimates() + [self.workload]:
            a.observe_shadow(p_accept)

    def observe_times(self, k: int, n_seqs: int, forward_s: float, d: int, behind: int, draft_s: float,
                      overhead_s: float, curve: bool = True, parts: list[tuple[int, int]] | None = None) -> None:
        """Measured seconds of a round: the target forward of k tokens per sequence, d draft
        forwards (the first catching up on `behind` tokens; d counts the forward of a token an
        early stop dropped, else its time would inflate the draft curve), and the rest of the round.
        `curve=False`: leave the verify curve alone (another planner sharing it observes it);
        `parts`: the forwards the runner ran the step as (a ragged batch), else k for each sequence."""
        if not self.online:
            return
        if curve:
            self.verify.observe_step(parts or [(k, n_seqs)], n_seqs, forward_s)
        if n_seqs > 1:  # the draft curves are per sequence; a batched step's drafting is not
            pass
        elif self.draft is None:
            self.draft_call_s += EMA * (draft_s - self.draft_call_s)
        elif d > 0:
            raw = self.draft.raw(max(behind, 1)) + (d - 1) * self.draft.raw(1)
            self.draft.scale += EMA * (min(max(draft_s / raw, 0.2), 5.0) - self.draft.scale)
        self.overhead_s += EMA * (max(overhead_s, 0.0) - self.overhead_s)

    def predicted_speedup(self, alpha: np.ndarray, n_seqs: int = 1) -> dict[int, float]:
        """Speedup over plain decoding of every fixed D for a given acceptance (a [max_draft]
        array of alpha_i), from the cost model alone: what `draftwise plan` prints."""
        t_plain = self.verify.plain(n_seqs) + self.overhead_s
        out = {0: 1.0}
        for d in range(1, self.max_draft + 1):
            t = self.draft_cost(d) + self.verify(d + 1, n_seqs) + self.overhead_s
            out[d] = expected_tokens(alpha, d) / t * t_plain
        return out


# Policy defaults (docs/planner.md says how each was chosen).
# Requests whose lengths a catch-up's expected saving is weighed by (Planner.expected_remaining):
# a window, so a change of workload shows within it.
LENGTHS_KEPT = 64
# Acceptance before a request has been seen, per draft position: n-gram proposals are often wrong
# at their first token and right after it; a same-family draft model is right more often than not.
PRIORS = {"ngram": [0.4] + [0.75] * 15, "suffix": [0.4] + [0.75] * 15, "suffix-tree": [0.4] + [0.75] * 15,
          "model": [0.65] * 16}
# A round must beat a plain step's rate by MARGIN; a draft model's by MARGIN_PER_DRAFT_STEP x its
# step's cost relative to a target step, as a rejected round also wastes its draft forwards.
MARGIN = 0.03
MARGIN_PER_DRAFT_STEP = 1 / 3
# A cheap drafter's round needs RISK more per plain step it would waste if wholly rejected.
RISK = 0.03


def planner_defaults(drafter: str, verify: CostCurve, draft: CostCurve | None, max_draft: int) -> dict:
    """Planner keyword arguments for a drafter by name, its target's curve and the draft model's
    curve (None: a cheap drafter)."""
    prior = PRIORS.get(drafter, [0.6] * max_draft)[:max_draft]
    prior += [prior[-1]] * (max_draft - len(prior))
    if draft is None:
        return {"prior": prior, "margin": MARGIN, "risk": RISK}
    return {"prior": prior, "margin": max(MARGIN, MARGIN_PER_DRAFT_STEP * draft.raw(1) / verify.raw(1)), "risk": 0.0}
