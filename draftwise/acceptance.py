"""Acceptance estimates the planner (draftwise.planner) prices drafts with: per-position Beta
posteriors that follow a request (Acceptance), the chance a token is accepted as a function of a
probability (Calibration: the draft's own, or the target's top)."""
from __future__ import annotations

import numpy as np


class Acceptance:
    """Per-position conditional acceptance as Beta posteriors: alpha_i = (a_i + acc_i) / (a_i + b_i
    + seen_i), with prior pseudo-counts (a_i, b_i) = strength * (m_i, 1 - m_i). Older
    observations are discounted by `forget` per round, so the estimate follows a request whose
    acceptance changes half-way."""

    def __init__(self, prior: np.ndarray, strength: float = 0.5, forget: float = 0.85):
        self.prior = np.clip(np.asarray(prior, dtype=np.float64), 1e-3, 1 - 1e-3)  # [max_pos]
        self.strength, self.forget = strength, forget
        self.acc = np.zeros_like(self.prior)  # [max_pos] (discounted) accepted counts
        self.seen = np.zeros_like(self.prior)  # [max_pos] (discounted) times the position was reached
        self._alpha: np.ndarray | None = None  # alpha() until the next observation

    def alpha(self) -> np.ndarray:  # [max_pos]
        """Position i's prior mean is mostly position i-1's estimate (3/4) and a little its own
        prior (1/4), so positions never reached yet borrow from the ones before them: when short
        drafts are always accepted, a long one is tried next. Read-only: computed once per
        observation (a batch's step plans every request's round more than once)."""
        if self._alpha is not None:
            return self._alpha
        out = np.empty_like(self.prior)
        prev = self.prior[0]
        for i in range(len(out)):
            m = 0.25 * self.prior[i] + 0.75 * prev
            out[i] = prev = (self.strength * m + self.acc[i]) / (self.strength + self.seen[i])
        out.flags.writeable = False
        self._alpha = out
        return out

    def observe(self, proposed: int, accepted: int, after: float | None = None) -> None:
        """One round: positions 1..accepted accepted, position accepted+1 rejected (if proposed).
        `after`: when every proposed token was accepted but the drafter stopped early, the
        probability the token it dropped would have been accepted (a partial observation of the
        next position, as a shadow: else a draft that keeps stopping early looks always right)."""
        self._alpha = None
        self.acc *= self.forget
        self.seen *= self.forget
        reached = min(accepted + 1, proposed, len(self.prior))
        self.seen[:reached] += 1
        self.acc[:min(accepted, len(self.prior))] += 1
        if after is not None and accepted == proposed < len(self.prior):
            self.seen[proposed] += 1
            self.acc[proposed] += after

    def observe_shadow(self, p_accept: float, depth: int = 1) -> None:
        """A shadow observation (a proposal not verified): the probability it would have been
        accepted, of position 1 only by default (a cheap drafter's first token). Only the
        positions observed have their older evidence discounted: an n-gram's plain stretch of
        shadows must not wash out what verified rounds measured deeper (else a drafter whose first
        token is often right but whose second is wrong keeps drafting long: deeper positions would
        fall back to borrowing from the first). depth = all positions: a draft model's shadow from
        the target's confidence at the position (Planner.commit), which is the same event at any
        depth (the draft agrees with the target's token given the target's own context)."""
        self._alpha = None
        n = min(depth, len(self.prior))
        self.acc[:n] *= self.forget
        self.seen[:n] *= self.forget
        self.seen[:n] += 1
        self.acc[:n] += p_accept

    def upper(self, z: float = 1.0) -> np.ndarray:  # [max_pos]
        """An optimistic estimate, alpha + z standard deviations of the Beta posterior: wide while
        a position has few observations, so a drafter that was never tried gets tried."""
        a = self.alpha()
        return np.minimum(a + z * np.sqrt(a * (1 - a) / (self.strength + self.seen + 1)), 1.0)


class Calibration:
    """P(a draft token is accepted | the draft's own probability c for it), measured: per bin of c
    (10 equal bins, discounted by 0.99 per round), each bin's estimate pulled towards c x scale
    (the draft's overall accepted-per-unit-of-c ratio) by 2 pseudo-counts, so a bin with few
    observations follows the overall ratio; made non-decreasing in c. With nothing measured,
    g(c) = c x scale. Bins, not one ratio: a draft's acceptance need not be proportional to its
    own probability."""

    BINS, PSEUDO, DECAY = 10, 2.0, 0.99

    def __init__(self, min_scale: float = 0.5):
        self.min_scale = min_scale  # the overall ratio's floor (a tree node's frequency score can be far too proud)
        self.acc = np.zeros(self.BINS)  # [BINS] (discounted) accepted tokens with c in the bin
        self.n = np.zeros(self.BINS)  # [BINS] (discounted) tokens reached by verification
        self._ratio = [1.0, 1.0]  # accepted, sum of c (reached positions), discounted alike

    @property
    def scale(self) -> float:
        """Measured acceptance per unit of the draft's own probability (> 1: it is too modest)."""
        return min(max(self._ratio[0] / self._ratio[1], self.min_scale), 2.0)

    def observe(self, confidence: list[float], accepted: int, reached: int) -> None:
        """A verified round: tokens 1..reached were verified, the first `accepted` accepted."""
        self.observe_nodes(confidence[:reached], [float(i < accepted) for i in range(reached)])

    def observe_nodes(self, confidence: list[float], accepted: list[float]) -> None:
        """A verified candidate tree: node i with the draft's own probability confidence[i] was on
        the accepted path (accepted[i] = 1) or not (0; a fraction: a shadow's acceptance probability)."""
        self.acc *= self.DECAY
        self.n *= self.DECAY
        self._ratio = [self.DECAY * self._ratio[0] + sum(accepted), self.DECAY * self._ratio[1] + sum(confidence)]
        for c, a in zip(confidence, accepted):
            b = self._bin_of(c)
            self.n[b] += 1
            self.acc[b] += a

    def _bin_of(self, c: float) -> int:
        return min(int(c * self.BINS), self.BINS - 1)

    def _bin(self, b: int, c: float, s: float) -> float:
        """Bin b's estimate at c: its measured share pulled towards c x s (the scale) by PSEUDO counts."""
        return (self.acc[b] + self.PSEUDO * min(c * s, 1.0)) / (self.n[b] + self.PSEUDO)

    def __call__(self, c: float) -> float:
        """g(c), non-decreasing: the best of this bin at c and every lower bin at its top edge."""
        b, s = self._bin_of(c), self.scale
        return max([self._bin(b, c, s)] + [self._bin(i, (i + 1) / self.BINS, s) for i in range(b)])

    def threshold(self, p: float) -> float:
        """The smallest c with g(c) >= p (a bar on acceptance -> a bar on c); > 1 when none."""
        if p <= 0.0:
            return 0.0
        s = self.scale
        for b in range(self.BINS):
            lo, hi = b / self.BINS, (b + 1) / self.BINS
            if self._bin(b, lo, s) >= p:  # (lower bins never reached p, else it returned there)
                return lo
            w = self.n[b] + self.PSEUDO
            c = (p * w - self.acc[b]) / (self.PSEUDO * s)  # where this bin's line reaches p
            if c < hi and c * s <= 1.0:  # past c = 1 / scale the line is flat, below p
                return c
        return 1.0 + p  # no token reaches it
