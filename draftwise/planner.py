"""`auto`: a round's draft length from the measured cost curves and the request's acceptance.

The choice itself is draftwise.draft_length.best_draft_length; this module prices rounds for it
(on the target's cost curve, the draft model's, or a cheap drafter's measured call), keeps each
request's acceptance estimate, and adds the draft model's catch-up (draftwise.catch_up), probes
and early-stop rule. docs/planner.md derives each part.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from draftwise.acceptance import Acceptance, Calibration
from draftwise.catch_up import CatchUp
from draftwise.costs import CostCurve
from draftwise.draft_length import Decision, PlannerConfig, best_draft_length, expected_tokens, gains_of, toward
from draftwise.drafters.base import StopRule, common_prefix

if TYPE_CHECKING:  # the step the propose stage assembles, which decide prices
    from draftwise.proposing import Batch


@dataclass(slots=True)
class RequestEstimate:
    """A request's planner state: its acceptance estimate and how much output is left."""
    acceptance: Acceptance
    remaining: int
    cap: int = 0  # its max_tokens after the prefill's token
    drafts: list[int] = field(default_factory=list)  # d chosen each round
    next_probe: int = 0  # no probe before this many rounds; the gap doubles after each probe
    probe_gap: int = 2
    probed: bool = False  # its first probe ran; since then, the seconds its rounds saved:
    saved_s: float = 0.0
    model_rate: float = 0.0  # before its draft model first drafts: the model's expected rate ...
    forgone_s: float = 0.0  # ... and the seconds it would have saved so far (CatchUp.looks)
    tree_fit: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))  # [kind][accepted, expected]



@dataclass(slots=True)
class RoundRecord:
    """What a verified round (or plain step) showed, for Planner.learn."""
    proposed: int
    accepted: int
    emitted: int
    confidence: list[float] | None = None  # [proposed] the drafter's own probabilities (a tree: each node's step)
    stop_confidence: float | None = None  # after an early stop: the draft's probability of the dropped token
    seconds: float | None = None  # measured seconds of the round
    target_top: list[float] | None = None  # the target's top probability at each verified position
    path: list[int] | None = None  # a candidate tree: the accepted nodes ...
    parents: list[int] | None = None  # ... and each node's parent


class Planner:
    """Chooses d per round. `draft` is the draft model's cost curve (None: a cheap drafter, whose
    measured call time is used). With `online=False` the curves are never rescaled by measured
    times, so the d chosen depends on the tokens alone (reproducible sampling, replays)."""

    def __init__(self, target: CostCurve, draft: CostCurve | None = None, config: PlannerConfig | None = None,
                 online: bool = True, **settings):
        self.cfg = replace(config or PlannerConfig(), **settings)
        self.target, self.draft, self.online = target, draft, online
        self.max_draft = self.cfg.max_draft
        self.workload = Acceptance(self.cfg.prior_array(), self.cfg.workload_strength, self.cfg.workload_forget)
        self.calib = Calibration()  # acceptance by the draft's own probability (early stops)
        self.target_calib = Calibration()  # ... by the target's top probability (a draft model's shadow)
        self.tree_calib = (Calibration(0.05), Calibration(0.05))  # tree nodes: the root's children, deeper
        self.catch_up = CatchUp(self.cfg.lengths_kept)
        self.draft_call_s = 1e-4  # a cheap drafter's seconds per proposing call
        self.overhead_s = 0.0  # per round, besides forwards and drafting

    def new_request(self, remaining: int) -> RequestEstimate:
        """A request with `remaining` tokens to plan (after the prefill's), starting from the
        workload's estimate worth one round of its own evidence."""
        cfg, prior = self.cfg, self.workload.alpha()
        return RequestEstimate(Acceptance(prior, cfg.request_strength, cfg.request_forget), remaining, cap=remaining)

    def finish(self, req: RequestEstimate, length: int) -> None:
        """The request ended after `length` planned tokens (its cap counts them alike)."""
        self.catch_up.finish(req, length)

    def draft_cost(self, d: int, unseen: int = 1) -> float:
        """Seconds to draft d tokens: a draft model's forward of the `unseen` tokens, then one per
        further token; a cheap drafter's measured call."""
        if d == 0:
            return 0.0
        if self.draft is None:
            return self.draft_call_s
        return self.draft(max(unseen, 1)) + (d - 1) * self.draft(1)

    def decide(self, req: RequestEstimate, step: Batch | None = None, index: int = 0, available: int | None = None,
               unseen: int = 1, node_p: np.ndarray | None = None, base_rate: float | None = None) -> Decision:
        """d for this round of request `index` of `step` (None: alone); `available` caps d; `unseen`:
        tokens a draft model catches up on first; `node_p`: a candidate tree's nodes' chances of
        being accepted (best first); `base_rate`: the rate a catch-up must beat (default plain)."""
        cfg, n = self.cfg, 1 if step is None else len(step.feeds)
        d_max = min(cfg.max_draft, req.remaining - 1, cfg.max_draft if available is None else available)
        measuring = self.online and not self.target.plain_known(n)
        plain_s, t, others = self._prices(0 if measuring else d_max, step, index, n)
        plain = Decision(0, 1.0 / plain_s, 1.0 / plain_s, step_rate=(others + 1.0) / plain_s)
        if measuring or len(t) == 0:
            return plain
        alpha = req.acceptance.alpha()  # [max_draft]
        catch_up = self.draft_cost(1, unseen) - self.draft_cost(1, 1)
        if self.draft is not None and unseen > 1 and not any(req.drafts):  # before its first draft
            d_m, r_m = best_draft_length(gains_of(alpha), t, plain_s, 0.0)
            req.model_rate = r_m if d_m > 0 else 0.0
            if CatchUp.looks(req, catch_up, plain.rate):
                return plain
        gains = np.cumsum(node_p[: len(t)]) if node_p is not None else gains_of(alpha[: len(t)])
        d, rate = best_draft_length(gains, t, plain_s, cfg.margin, cfg.risk, others)
        if d == 0:
            return self._probe(req, alpha, t, plain, catch_up, base_rate) if self.draft is not None else plain
        if catch_up > 0 and not self.catch_up.pays(req, catch_up, max(plain.rate, base_rate or 0.0), rate):
            return plain
        expected = 1.0 + float(gains[d - 1])
        stop = None if self.draft is None else self._stop_rule(alpha, d, rate, n)
        return Decision(d, expected / float(t[d - 1]), plain.rate, float(t[d - 1]) + catch_up, rate, expected, stop,
                        unseen)

    def _prices(self, d_max: int, step: Batch | None, index: int, n: int) -> tuple[float, np.ndarray, float]:
        """(seconds of a plain step, [d_max] seconds with d = 1..d_max draft tokens, the other
        requests' expected tokens). A cheap drafter's round in a batch is priced by what it adds to
        the step, which every request waits for; a draft model drafts in lockstep (b sequences)."""
        if n > 1 and self.draft is None:
            f = step.forwards(self.target, index, max(d_max, 0)) + self.overhead_s  # [d_max + 1]
            others = 0.0 if step.uniform else float(sum(step.emits) - step.emits[index])
            return float(f[0]), f[1:] + self.draft_cost(1), others
        t = [self.draft_cost(d) + self.target(d + 1, n) + self.overhead_s for d in range(1, d_max + 1)]
        return self.target.plain(n) + self.overhead_s, np.array(t), 0.0

    def _probe(self, req: RequestEstimate, alpha, t, plain: Decision, catch_up: float, base_rate) -> Decision:
        """A draft model the estimate rules out drafts a short probe if optimism (the upper bound)
        says it would pay, ever more rarely; the first probe pays the prompt's catch-up, so it is
        judged over the rest of the request (weighed by how often first probes paid off)."""
        cfg, plain_s = self.cfg, 1.0 / plain.rate
        if cfg.probe_max == 0 or len(req.drafts) < req.next_probe:
            return plain
        up = req.acceptance.upper()
        d_up, r_up = best_draft_length(gains_of(up[: len(t)]), t, plain_s, cfg.margin, cfg.risk)
        if d_up == 0:
            return plain
        d = min(d_up, cfg.probe_max)
        t_probe = float(t[d - 1]) + catch_up
        if any(req.drafts):
            pays = expected_tokens(up, d) / t_probe > plain.rate * (1 + cfg.margin)
        else:
            d_w, r_w = best_draft_length(gains_of(self.workload.upper()[: len(t)]), t, plain_s, cfg.margin, cfg.risk)
            pays = d_w > 0 and self.catch_up.pays(req, catch_up, max(plain.rate, base_rate or 0.0), min(r_up, r_w),
                                                  self.catch_up.probes_pay())
        if not pays:
            return plain
        r = expected_tokens(alpha, d) / t_probe
        return Decision(d, r, plain.rate, t_probe, r, expected_tokens(alpha, d), probe=True)

    def _stop_rule(self, alpha: np.ndarray, d: int, rate: float, n: int) -> StopRule:
        """Bars on the draft's own probability c_j of token j, g(c_j) its calibrated acceptance and
        reach_{j-1} the chance tokens 1..j-1 are accepted, at the plan's rate: keep token j iff
        reach_{j-1} g(c_j) >= rate (T(j+1) - T(j)); draft on iff reach_{j-1} g(c_j) tail_j >= rate
        x (the rest of the plan's draft and verify seconds), tail_j its expected further tokens."""
        g = self.calib.threshold  # a bar on g(c) -> the same bar on c
        reach = np.concatenate([[1.0], np.cumprod(alpha[:d])])  # [d+1]
        v = [self.target(k, n) for k in range(1, d + 2)]  # v[k-1] = T(k)
        keep = [g(rate * max(v[j] - v[j - 1], 0.0) / reach[j - 1]) for j in range(1, d + 1)]
        go_on = [g(rate * max((d - j) * self.draft(1) + v[d] - v[j], 0.0)
                   / (reach[j - 1] * float(np.cumprod(alpha[j:d]).sum()))) for j in range(1, d)]
        return StopRule(keep, go_on)

    def step_pays(self, step: Batch) -> bool:
        """Does the batched step as chosen beat a plain step of the same sequences by the margin?"""
        n = len(step.feeds)
        if all(k == 1 for k in step.feeds):
            return True
        t = step.forward_s(self.target, step.feeds) + self.overhead_s
        t_plain = step.forward_s(self.target, [1] * n) + self.overhead_s
        return sum(step.emits) / t > n / t_plain * (1.0 + self.cfg.margin)

    def learn(self, req: RequestEstimate, dec: Decision, r: RoundRecord) -> None:
        """After a round (or plain step): the request's and the workload's acceptance, the
        calibrations, and the draft model's catch-up bookkeeping."""
        if dec.d == 0 and req.model_rate > 0 and not any(req.drafts):
            req.forgone_s += max(0.0, (dec.seconds or 1.0 / dec.plain_rate) - r.emitted / req.model_rate)
        req.drafts.append(dec.d)
        req.remaining -= r.emitted
        if r.path is not None:  # a tree: every node verification reached calibrates tree_calib
            on, steps = set(r.path), r.confidence or []
            for deep in (0, 1):
                reached = [i for i, q in enumerate(r.parents or []) if (q >= 0) == bool(deep) and (q < 0 or q in on)]
                self.observe_nodes(req, deep, [steps[i] for i in reached], [float(i in on) for i in reached])
            return
        reached = min(r.accepted + 1, r.proposed)
        if r.confidence:
            self.calib.observe(r.confidence, r.accepted, min(reached, len(r.confidence)))
        shadow = None
        if r.target_top and self.draft is not None:
            if r.proposed > 0:
                self.target_calib.observe(r.target_top, r.accepted, min(reached, len(r.target_top)))
            else:
                shadow = self.target_calib(r.target_top[0])
        if dec.probe:
            req.probed, req.next_probe, req.probe_gap = True, len(req.drafts) + req.probe_gap, 2 * req.probe_gap
        elif dec.d > 0:
            req.probe_gap = 2
        if req.probed and dec.d > 0 and r.seconds is not None:
            req.saved_s += r.emitted * (self.target.plain(1) + self.overhead_s) - r.seconds
        after = None if r.stop_confidence is None else self.calib(r.stop_confidence)
        observed = [req.acceptance, self.workload]
        for a in observed:
            if r.proposed > 0:
                a.observe(r.proposed, r.accepted, after)
            elif after is not None:  # the draft dropped its first token: a shadow of position 1
                a.observe_shadow(after)
            elif shadow is not None:  # the target's confidence: a shadow of every position
                a.observe_shadow(shadow, self.max_draft)

    def node_chances(self, req: RequestEstimate, parents: list[int], steps: list[float]) -> np.ndarray:  # [d]
        """A tree's nodes' chances of being on the accepted path: its parent's times the calibrated
        chance of its own step, times how the request's reached nodes fared against the calibration
        so far ((accepted + tree_pseudo) / (expected + tree_pseudo))."""
        fit = (req.tree_fit[:, 0] + self.cfg.tree_pseudo) / (req.tree_fit[:, 1] + self.cfg.tree_pseudo)  # [2]
        p = np.zeros(len(parents))
        for i, (q, f) in enumerate(zip(parents, steps)):
            deep = int(q >= 0)
            p[i] = (1.0 if q < 0 else p[q]) * min(1.0, self.tree_calib[deep](f) * fit[deep])
        return p

    def observe_nodes(self, req: RequestEstimate, deep: int, steps: list[float], accepted: list[float]) -> None:
        """Tree nodes of one kind that verification reached, each accepted (a fraction: a shadow's)."""
        calib = self.tree_calib[deep]
        req.tree_fit[deep] += (sum(accepted), sum(calib(f) for f in steps))
        calib.observe_nodes(steps, accepted)

    def counterfactual(self, req: RequestEstimate, draft: list[int], target: list[int],
                       confidence: list[float] | None = None) -> None:
        """A cheap drafter's draft that was not verified, against the tokens greedy decoding emitted
        from the same context: observed as a round of min(len(draft), len(target)) tokens."""
        d = min(len(draft), len(target))
        if d == 0:
            return
        accepted = common_prefix(draft[:d], target[:d])
        if confidence:
            self.calib.observe(confidence, accepted, min(accepted + 1, d, len(confidence)))
        for a in [req.acceptance, self.workload]:
            a.observe(d, accepted)

    def shadow(self, req: RequestEstimate, p_accept: float) -> None:
        """A cheap drafter's unverified first token, scored against the plain step's target."""
        for a in [req.acceptance, self.workload]:
            a.observe_shadow(p_accept)

    def observe_times(self, k: int, n: int, forward_s: float, draft_forwards: int, unseen: int, draft_s: float,
                      overhead_s: float, curve: bool = True, parts: list[tuple[int, int]] | None = None) -> None:
        """A step's measured seconds: the target forward (run as `parts`), the drafting (a draft
        model's `draft_forwards`, the first catching up on `unseen` tokens) and the rest.
        `curve=False`: another planner sharing the target curve observes it."""
        if not self.online:
            return
        if curve:
            self.target.observe_step(parts or [(k, n)], n, forward_s)
        if n == 1 and self.draft is None:  # the draft curves are per sequence
            self.draft_call_s = toward(self.draft_call_s, draft_s, clamp=None)
        elif n == 1 and draft_forwards > 0:
            raw = self.draft.raw(max(unseen, 1)) + (draft_forwards - 1) * self.draft.raw(1)
            self.draft.scale = toward(self.draft.scale, min(max(draft_s / raw, 0.2), 5.0), clamp=None)
        self.overhead_s = toward(self.overhead_s, max(overhead_s, 0.0), clamp=None)

    def predicted_speedup(self, alpha: np.ndarray, n: int = 1) -> dict[int, float]:
        """Speedup over plain decoding of every fixed d for an acceptance ([max_draft] alpha_i)."""
        t_plain = self.target.plain(n) + self.overhead_s
        return {0: 1.0} | {d: expected_tokens(alpha, d) * t_plain / (self.draft_cost(d) + self.target(d + 1, n)
                                                                      + self.overhead_s)
                           for d in range(1, self.max_draft + 1)}
