"""Measured forward costs: seconds of one forward of k new tokens for b sequences (CostCurve),
from a profile (draftwise.profile) and corrected online by what the steps of a running engine
measure. The planner (draftwise.planner) prices every round on it."""
from __future__ import annotations

import numpy as np

from draftwise.draft_length import DRIFT, MEASURE, toward
from draftwise.profile import ProfileResult


def is_plain(parts: list[tuple[int, int]], n_seqs: int) -> bool:
    """Do these (k, b) forwards of a step of n_seqs sequences feed one token per sequence?"""
    return sum(k * b for k, b in parts) == n_seqs


class CostCurve:
    """Seconds of one forward of k new tokens with logits at all k, for b sequences of k each.

    Measured points are used as they are (the curve is not smooth); k past the last measured
    point and b between or past measured batch sizes are extrapolated linearly."""

    def __init__(self, ms: dict[int, list[float]], prefill: tuple[int, float] | None = None):
        """ms: batch -> [ms at k = 1, 2, ...]; prefill: (tokens, ms) of one long forward, which
        prices k past the curve (a draft model catching up) by interpolating towards it."""
        if not ms or any(len(v) == 0 for v in ms.values()):
            raise ValueError("a cost curve needs at least one measured point per batch size")
        self._b = sorted(ms)
        self._s = {b: np.asarray(ms[b], dtype=np.float64) / 1e3 for b in self._b}
        self.prefill = None if prefill is None else (int(prefill[0]), prefill[1] / 1e3)
        self.scale = 1.0  # online correction of the whole curve: measured / predicted, as an EMA
        self.multi: float | None = None  # the same over forwards of k > 1 alone (None: none measured yet)
        self.ragged = 1.0  # the same for steps run as several forwards, over their scaled prediction
        self._k_scale: dict[tuple[int, int], float] = {}  # the same per (k, b) observed: the shape too
        self._raw: dict[tuple[int, int], float] = {}
        # the plain step (one token per sequence) of each batch size, measured in this engine:
        # b -> [seconds, times measured]; and how many steps of any shape ran at each b
        self._plain: dict[int, list[float]] = {}
        self._steps: dict[int, int] = {}

    @classmethod
    def from_profile(cls, prof: ProfileResult) -> CostCurve:
        ms: dict[int, dict[int, float]] = {}
        for r in prof.rows:
            ms.setdefault(r["batch"], {})[r["k"]] = r["ms_median"]
        out = {}
        for b, row in ms.items():
            if sorted(row) != list(range(1, len(row) + 1)):
                raise ValueError(f"profile for batch {b} must cover k = 1..K without gaps, got {sorted(row)}")
            out[b] = [row[k] for k in range(1, len(row) + 1)]
        pf = prof.meta.get("prefill")
        return cls(out, (pf["tokens"], pf["ms_median"]) if pf else None)

    def _at_b(self, b: int, k: int) -> float:
        s = self._s[b]
        if k <= len(s):
            return float(s[k - 1])
        if b == 1 and self.prefill is not None and self.prefill[0] > len(s):
            n, t = self.prefill  # linear from the last measured k to the long forward, then its rate
            if k <= n:
                return float(s[-1]) + (t - float(s[-1])) * (k - len(s)) / (n - len(s))
            return t * k / n
        # past the last point: the mean cost per extra token over the measured range, never negative
        slope = max(float(s[-1] - s[0]) / (len(s) - 1), 0.0) if len(s) > 1 else float(s[-1])
        return float(s[-1]) + slope * (k - len(s))

    def raw(self, k: int, b: int = 1) -> float:
        got = self._raw.get((k, b))  # the measured curve never changes: each point computed once
        if got is None:
            got = self._raw[(k, b)] = self._raw_at(k, b)
        return got

    def _raw_at(self, k: int, b: int) -> float:
        if k < 1 or b < 1:
            raise ValueError(f"k and b must be >= 1, got k={k}, b={b}")
        bs = self._b
        if b in self._s:
            return self._at_b(b, k)
        if len(bs) == 1:  # one batch size measured: assume cost proportional to tokens beyond it
            return self._at_b(bs[0], k) * b / bs[0]
        lo = max([x for x in bs if x < b], default=bs[0])
        hi = min([x for x in bs if x > b], default=bs[-1])
        if lo == hi:  # outside the measured range: extend the segment nearest to b
            lo, hi = (bs[0], bs[1]) if b < bs[0] else (bs[-2], bs[-1])
        t_lo, t_hi = self._at_b(lo, k), self._at_b(hi, k)
        return max(t_lo + (t_hi - t_lo) * (b - lo) / (hi - lo), 1e-9)

    def __call__(self, k: int, b: int = 1) -> float:
        return self.raw(k, b) * self._k_scale.get((k, b), self._whole(k))

    def _whole(self, k: int) -> float:
        """The correction of a point not observed on its own: for k > 1 the multi-token forwards'
        (the profile, measured at a 256-token context, is off for them alike, as a k-token forward's
        attention grows with the context: docs/planner.md), else the whole curve's, which plain
        steps dominate."""
        return self.scale if k == 1 or self.multi is None else self.multi

    def parts(self, parts: list[tuple[int, int]], n_seqs: int | None = None) -> float:
        """Seconds of a batched forward of `n_seqs` sequences that the runner runs as these (k, b)
        forwards (ModelRunner.forward_parts): a ragged batch is priced by what it
        executes, times what such steps were measured to cost over that (`ragged`); a plain step
        (one token per sequence) by its own measurement once it has one (`plain`)."""
        if n_seqs is not None and is_plain(parts, n_seqs):
            return self.plain(n_seqs, parts)
        t = self._parts_s(parts)
        return t * self.ragged if len(parts) > 1 else t

    def _parts_s(self, parts: list[tuple[int, int]]) -> float:
        """The forwards' seconds, before the ragged correction: a forward of one token for b
        sequences is the plain step of b sequences, priced as measured once it was."""
        return sum(self._plain[b][0] if k == 1 and b in self._plain else self(k, b) for k, b in parts)

    def plain(self, n: int, parts: list[tuple[int, int]] | None = None) -> float:
        """Seconds of a plain step of n sequences (run as `parts`; default one forward): as measured
        in this engine once it was, else from the curve."""
        got = self._plain.get(n)
        if got is not None:
            return got[0]
        parts = parts or [(1, n)]
        return self.parts(parts)

    def plain_known(self, n: int) -> bool:
        """Was the plain step of n sequences measured MEASURE times? The planner runs plain steps
        at a batch size until it was (the profile's point for a batch of sequences can be 20% off
        in a running engine: docs/planner.md, "Batches"), or until 2 x MEASURE steps ran at it
        without one (requests that fix their own D drafting), then prices it from the curve. One
        sequence is not waited for: there the profile predicts the engine's rounds closely."""
        return n == 1 or self._plain.get(n, (0, 0))[1] >= MEASURE or self._steps.get(n, 0) >= 2 * MEASURE

    def observe(self, k: int, b: int, seconds: float) -> None:
        self.observe_parts([(k, b)], seconds)

    def observe_step(self, parts: list[tuple[int, int]], n: int, seconds: float) -> None:
        """One measured step of n sequences, run as the forwards `parts`. A plain step's seconds
        are kept for its batch size: the fastest of its first MEASURE (a stall only adds time),
        then an EMA."""
        self._steps[n] = self._steps.get(n, 0) + 1
        if is_plain(parts, n):
            got = self._plain.setdefault(n, [seconds, 0])
            s = got[0]
            got[0] = min(s, seconds) if got[1] < MEASURE else toward(s, seconds)
            got[1] += 1
        self.observe_parts(parts, seconds)

    def observe_parts(self, parts: list[tuple[int, int]], seconds: float) -> None:
        """One measured forward. Run as one forward of k tokens for b sequences, it moves the whole
        curve, and the point (k, b) on its own (the profile's shape can be off in a running engine,
        not only its scale). Run as several (a ragged batch split into llama.cpp ubatches), it
        moves only `ragged`, the measured over the predicted cost of such steps: their parts (a
        few sequences' extra tokens inside a large batch) are points no step measures alone, so
        they get their own correction rather than moving the points that plain steps measure
        (docs/planner.md, "Batches")."""
        if len(parts) > 1:
            ratio = seconds / self._parts_s(parts)
            self.ragged = toward(self.ragged, ratio)
            return
        ratio = seconds / sum(self.raw(k, b) for k, b in parts)
        self.scale = toward(self.scale, ratio)
        key = parts[0]
        if key[0] > 1:
            self.multi = toward(self._whole(key[0]), ratio)
        self._k_scale[key] = toward(self._k_scale.get(key, self._whole(key[0])), ratio)
        one, many = self._whole(1), self._whole(2)
        for other, t in self._k_scale.items():  # points no longer observed drift back to their kind's
            if other != key:  # whole, so a point the planner stopped using cannot stay stale
                self._k_scale[other] = t + DRIFT * ((one if other[0] == 1 else many) - t)
