"""The mechanism that picks a round's draft length, and every constant the planner tunes it with.

    alpha_i   = P(draft token i accepted | tokens 1..i-1 accepted)     (draftwise.acceptance)
    gain(d)   = sum_{i<=d} prod_{j<=i} alpha_j                          expected accepted tokens
    T(d)      = seconds of the round (or of the batched step) with d draft tokens (draftwise.costs)
    rate(d)   = (1 + gain(d)) / T(d)                                    d = 0: a plain step

d* = argmax rate(d), kept only if it beats the plain step's rate by a margin (docs/planner.md).
A candidate tree is the same choice with gain(d) = the summed chances of its first d nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Every constant the planner uses, each with why it has its value (docs/planner.md)."""
    max_draft: int = 16  # the longest draft a round may verify (MAX_DRAFT_CHEAP, MAX_DRAFT_MODEL below)
    # acceptance before a request has been seen, per position (extended with its last value)
    prior: tuple[float, ...] = (0.6,)
    margin: float = 0.03  # a round must beat plain by this: about the cost model's error on one sequence
    risk: float = 0.0  # more margin per plain step a wholly rejected round wastes (cheap drafters)
    workload_strength: float = 0.5  # pseudo-rounds of the prior in the run's (workload's) estimate
    workload_forget: float = 0.97  # the workload's estimate follows the last ~30 rounds
    request_strength: float = 1.0  # a request starts from the workload's estimate, worth one round
    request_forget: float = 0.85  # a request's estimate follows its last ~7 rounds
    probe_max: int = 2  # a draft model's probe (an optimistic short draft when the estimate says 0)
    tree_pseudo: float = 2.0  # a request's tree nodes start as this many expected nodes, all accepted
    lengths_kept: int = 64  # recent requests' lengths that a catch-up's saving is counted over

    def __post_init__(self):
        prior = tuple(float(p) for p in np.atleast_1d(self.prior))  # a number: every position's
        object.__setattr__(self, "prior", prior)
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")
        if not self.prior or not all(0.0 < p < 1.0 for p in self.prior):
            raise ValueError(f"prior must be acceptance probabilities in (0, 1), got {self.prior}")

    def prior_array(self) -> np.ndarray:  # [max_draft]
        p = list(self.prior[: self.max_draft])
        return np.array(p + [p[-1]] * (self.max_draft - len(p)))


# The cost curve's online corrections (draftwise.costs), shared by every planner on it.
EMA = 0.1  # weight of one new timing in a moving average: about the last ten steps
DRIFT = 0.005  # per observation elsewhere, how far an unobserved point returns to its kind's correction
MEASURE = 2  # plain steps measured at a batch size before any request drafts at it (its profile can be 20% off)


def toward(x: float, v: float, weight: float = EMA, clamp: float | None = 2.0) -> float:
    """One moving-average step of x toward v; with `clamp`, v is first held within [x / clamp,
    x * clamp], so one stall moves an estimate by at most `weight` times its value."""
    if clamp is not None:
        v = min(max(v, x / clamp), x * clamp)
    return x + weight * (v - x)


# A copy drafter's first token is often wrong and the rest right once it is; a same-family draft
# model is right more often than not.
COPY_PRIOR = (0.4,) + (0.75,) * 15
PRIORS = {"ngram": COPY_PRIOR, "suffix": COPY_PRIOR, "suffix-tree": COPY_PRIOR, "model": (0.65,),
          # a prediction is the client's own guess at the output: once followed, most of it is right
          "prediction": (0.6,) + (0.9,) * 15}
COPY_RISK = 0.03  # a copy drafter's wholly wrong draft wastes plain steps: ask 3% more per step


def config_for(drafter: str, cheap: bool, max_draft: int) -> PlannerConfig:
    """The config for a drafter by name; a cheap (copy) drafter's rounds carry the risk term."""
    return PlannerConfig(max_draft, PRIORS.get(drafter, (0.6,)), risk=COPY_RISK if cheap else 0.0)


@dataclass(slots=True)
class Decision:
    """A round's draft length and what it is expected to give."""
    d: int  # draft tokens to verify (0: a plain step)
    rate: float  # expected tokens per second of this request's round
    plain_rate: float  # ... of a plain step
    seconds: float = 0.0  # expected seconds of the round, a catch-up included (0: a plain step's)
    step_rate: float = 0.0  # expected tokens per second of the whole batched step
    expected: float = 1.0  # tokens the round is expected to emit, 1 + gain(d)
    stop: object = None  # a draft model's early-stop rule (draftwise.drafters.base.StopRule)
    unseen: int = 1  # tokens a draft model catches up on before drafting
    probe: bool = False  # an optimistic short draft, to measure acceptance


def gains_of(alpha: np.ndarray) -> np.ndarray:  # [D]
    """Expected accepted tokens of a chain of d = 1..D draft tokens."""
    return np.cumsum(np.cumprod(alpha))


def expected_tokens(alpha: np.ndarray, d: int) -> float:
    """E[N](d) = 1 + gain(d): the recovered or bonus token plus the accepted ones."""
    return 1.0 + float(gains_of(alpha[:d])[-1]) if d > 0 else 1.0


def best_draft_length(gains: np.ndarray, seconds: np.ndarray, plain_s: float, margin: float,
                      risk: float = 0.0, others: float = 0.0) -> tuple[int, float]:
    """argmax_d (others + 1 + gains[d-1]) / seconds[d-1] over the d that beat a plain step.

    gains:   [D] expected accepted tokens of d = 1..D draft tokens
    seconds: [D] seconds of the round (or batched step) with d draft tokens
    plain_s: seconds of the plain step; others: the rest of the step's expected tokens
    A d must beat the plain rate by `margin`, plus `risk` for each plain step the round would
    waste if all of it were rejected. Returns (d, rate); d = 0 with the plain rate when none does.
    """
    n = min(len(gains), len(seconds))
    base = (others + 1.0) / plain_s
    if n == 0:
        return 0, base
    t = seconds[:n]
    rates = (others + 1.0 + gains[:n]) / t  # [n]
    wasted = np.maximum(t / plain_s - 1.0, 0.0)  # [n] plain steps a rejected round costs
    ok = (rates > base * (1.0 + margin + risk * wasted)) & (rates > base)
    if not ok.any():
        return 0, base
    i = int(np.argmax(np.where(ok, rates, -np.inf)))  # ties: the shortest draft
    return i + 1, float(rates[i])


# The most draft tokens a round may verify. A cheap drafter's tokens cost nothing to draft, so its
# rounds are bounded by the verify curve alone, whose cost per token falls up to a few tens of
# rows on a CPU (docs/planner.md); a draft model pays a forward per drafted token, which such
# lengths never repay.
MAX_DRAFT_CHEAP, MAX_DRAFT_MODEL = 32, 16
