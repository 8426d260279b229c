"""A service goal, and the verdict it gives each configuration: keep it or not.

    goal = parse_goal("itl_p95<=0.25,ttft_p99<=2,speedup>=1.05")
    judge(row, goal, baseline="plain").text
    # "don't keep (itl_p95 0.31 > 0.25)": the first condition missed decides

A goal is a comma-separated list of conditions METRIC OP VALUE, OP one of <=, >=, <, >. The
metrics are those of a summary row: latency percentiles in seconds (ttft_p50, itl_p95, e2e_mean,
...), tokens_per_s, ms_per_token, speedup, acceptance_rate, acceptance_length, mismatches.
Speedup is judged by its point estimate; when its 95% interval reaches past the bound, the verdict
says so.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

_LATENCIES = tuple(f"{k}_{s}" for k in ("ttft", "itl", "e2e") for s in ("p50", "p95", "p99", "mean"))
METRICS = _LATENCIES + ("tokens_per_s", "ms_per_token", "speedup", "acceptance_rate", "acceptance_length",
                        "mismatches")
_OPS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}
_MISSED = {"<=": ">", ">=": "<", "<": "≥", ">": "≤"}  # the operator that holds when the condition does not
_ALIASES = {"≤": "<=", "≥": ">="}
_PART = re.compile(r"\s*([A-Za-z0-9_]+)\s*(<=|>=|≤|≥|<|>)\s*(\S*)\s*")  # an empty value is named below


@dataclass(frozen=True, slots=True)
class Condition:
    metric: str  # one of METRICS
    op: str  # "<=" | ">=" | "<" | ">"
    value: float

    def met(self, measured: float) -> bool:
        return {"<=": measured <= self.value, ">=": measured >= self.value,
                "<": measured < self.value, ">": measured > self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True, slots=True)
class Verdict:
    keep: bool | None  # None: the baseline, which is what the others are judged against
    metric: str | None  # what decided: the condition missed or not measured; when kept, speedup if uncertain
    text: str

    @property
    def short(self) -> str:
        if self.keep is None:
            return "baseline"
        if self.keep:
            return f"keep, {self.metric} uncertain" if self.metric else "keep"
        return f"don't keep: {self.metric}"


def parse_goal(text: str) -> tuple[Condition, ...]:
    """'itl_p95<=0.25, speedup>=1.05' -> (Condition('itl_p95', '<=', 0.25), Condition('speedup', '>=', 1.05))."""
    if not text.strip():
        raise ValueError(f"empty goal: give conditions such as 'itl_p95<=0.25,speedup>=1.05'; "
                         f"metrics: {', '.join(METRICS)}")
    out = []
    for part in text.split(","):
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"goal part {part.strip()!r}: expected METRIC OP VALUE with OP one of "
                             f"<=, >=, <, > (e.g. speedup>=1.05); metrics: {', '.join(METRICS)}")
        metric, op, value = m.groups()
        if metric not in METRICS:
            raise ValueError(f"goal part {part.strip()!r}: unknown metric {metric!r}; metrics: {', '.join(METRICS)}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not value:
            raise ValueError(f"goal part {part.strip()!r}: no value after {op!r}")
        if not math.isfinite(number):
            raise ValueError(f"goal part {part.strip()!r}: {value!r} is not a finite number")
        out.append(Condition(metric, _ALIASES.get(op, op), number))
    return tuple(out)


def measured(row, metric: str) -> float | None:
    """The metric's value in a summary Row (latencies in seconds); None when not measured."""
    if metric in _LATENCIES:
        kind, _, stat = metric.partition("_")
        return getattr(getattr(row, kind), stat)
    return getattr(row, metric)


def _num(v: float, bound: float) -> str:
    """Three significant digits, more when that would print the value as the bound it differs from."""
    for digits in range(3, 8):
        s = f"{v:.{digits}g}"
        if v == bound or s != f"{bound:g}":
            return s
    return s


def _speedup_caveat(row, c: Condition) -> str | None:
    """When the point estimate meets the condition: the interval's far side that does not, if any."""
    lo, hi = row.speedup_lo, row.speedup_hi
    if lo is None or hi is None:
        return "one prompt: no interval"
    if not c.met(lo if c.op in (">=", ">") else hi):
        return f"interval [{lo:.2f}, {hi:.2f}] includes a miss"
    return None


def judge(row, goal: tuple[Condition, ...], baseline: str, mismatches_checked: bool = True) -> Verdict:
    """Keep the row's configuration only if it meets every condition; the first condition missed
    (or not measured) decides. mismatches_checked: False when outputs were not compared (sampling)."""
    if row.config == baseline:
        return Verdict(None, None, "baseline")
    met, caveat = [], None
    for c in goal:
        v = measured(row, c.metric)
        if c.metric == "mismatches" and not mismatches_checked:
            v = None
        if v is None:
            return Verdict(False, c.metric, f"don't keep ({c.metric} not measured)")
        if not c.met(v):
            return Verdict(False, c.metric, f"don't keep ({c.metric} {_num(v, c.value)} {_MISSED[c.op]} {c.value:g})")
        met.append(f"{c.metric} {_num(v, c.value)} {_OPS[c.op]} {c.value:g}")
        if c.metric == "speedup" and caveat is None:
            caveat = _speedup_caveat(row, c)
    note = f"; {caveat}" if caveat else ""
    return Verdict(True, "speedup" if caveat else None, f"keep ({', '.join(met)}{note})")
