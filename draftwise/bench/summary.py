"""Per-configuration aggregates of a results file, per scope (all prompts, each category, each
context-length bucket) and concurrency.

Latencies are as a user sees them: from the moment the request is submitted, so a request that
waits for others in a sequential group counts its wait (queue_s; 0 at concurrency 1).
- speedup = baseline's ms per emitted token / the configuration's, on the prompts both ran,
  summed over repeats; its 95% interval resamples prompts (bootstrap). An interval holding 1 means
  the difference is inside the noise.
- decode_speedup: the same after the first token (baseline's time per output token, TPOT: (E2E -
  TTFT) / (tokens - 1), over the configuration's): where the prefill is most of a request (long
  prompts, short answers) it separates drafting's effect from the prompt's.
- tokens_per_s = emitted tokens / elapsed time of their groups (throughput).
- acceptance rate, AL, per-position acceptance, time split: from the summed SpecStats.
- verdict: keep or not, against a service goal when one is given (draftwise/bench/goal.py).
"""
from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from draftwise.bench.check import Mismatch, find_mismatches
from draftwise.bench.goal import Verdict, judge, parse_goal
from draftwise.bench.results import Results
from draftwise.stats import SpecStats, aggregate


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default): p50 of [1, 2, 3, 4] is 2.5."""
    return float(np.percentile(values, q)) if len(values) else None


@dataclass(slots=True)
class Latency:  # seconds
    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None

    @staticmethod
    def of(values: list[float]) -> Latency:
        v = [x for x in values if x is not None]
        return Latency(len(v), float(np.mean(v)) if v else None, *(percentile(v, q) for q in (50, 95, 99)))


def bootstrap_ratio(base_t, base_n, cfg_t, cfg_n, n_boot: int = 2000, seed: int = 0
                    ) -> tuple[float, float | None, float | None]:
    """Speedup (base ms/token over cfg ms/token) with a 95% interval from resampling prompts.

    Arguments are per prompt, paired: [P] seconds and [P] emitted tokens. With one prompt there is
    nothing to resample: the interval is None, not a zero-width one that looks certain."""
    bt, bn, ct, cn = (np.asarray(a, dtype=float) for a in (base_t, base_n, cfg_t, cfg_n))
    point = (bt.sum() / bn.sum()) / (ct.sum() / cn.sum())
    if len(bt) < 2:
        return float(point), None, None
    idx = np.random.default_rng(seed).integers(0, len(bt), size=(n_boot, len(bt)))  # [n_boot, P]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (bt[idx].sum(1) / bn[idx].sum(1)) / (ct[idx].sum(1) / cn[idx].sum(1))
    ratios = ratios[np.isfinite(ratios)]
    return float(point), float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def in_noise(lo: float, hi: float) -> bool:
    """Whether a speedup's interval holds 1: the two configurations are not told apart."""
    return lo <= 1.0 <= hi


@dataclass(slots=True)
class Row:
    scope: str  # "all" | "category:<name>" | "bucket:<range>"
    config: str
    concurrency: int
    sequential: bool  # concurrency simulated one request after another: no break-even from it
    requests: int
    prompts: int
    emitted_tokens: int
    ttft: Latency
    itl: Latency
    e2e: Latency
    tokens_per_s: float | None
    ms_per_token: float | None
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    decode_speedup: float | None = None  # the same after the first token (TPOT)
    decode_speedup_lo: float | None = None
    decode_speedup_hi: float | None = None
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    predicted_speedup: float | None = None  # the planner's own prediction (auto configurations)
    per_position_acceptance: list[float] = field(default_factory=list)
    step_ms: dict | None = None  # per target step after prefill: draft, verify, other; and prefill per request
    rss_peak_bytes: int | None = None
    rss_growth_bytes: int | None = None  # most a request added to resident memory while it ran
    kv_peak_bytes: int | None = None
    draft_kv_peak_bytes: int | None = None
    draft_weight_bytes: int | None = None
    drafter_nodes: int | None = None  # the drafter's state shared across requests (suffix trie) at its largest
    drafter_rounds: dict | None = None  # --drafter auto: steps per drafter chosen ("none": plain steps)
    mismatches: int = 0
    probe_share: float | None = None  # of request time spent reading KV sizes: the harness's own cost
    cdf: dict | None = None  # scope "all": e2e_s, ttft_s, itl_s at percentiles 0..100
    verdict: Verdict | None = None  # against the service goal, when one is given

    @property
    def in_noise(self) -> bool | None:
        return None if self.speedup_lo is None else in_noise(self.speedup_lo, self.speedup_hi)


@dataclass(slots=True)
class Summary:
    conditions: dict
    resolved: dict  # what the conditions resolved to: tokenizer fingerprint, backend, precision
    sessions: list[dict]
    baseline: str
    checked: int | None  # outputs compared with the baseline's; None when not greedy
    mismatches: list[Mismatch]
    rows: list[Row]
    goal: str | None = None  # the service goal the rows' verdicts answer

    def to_dict(self) -> dict:
        return {"conditions": self.conditions, "resolved": self.resolved, "sessions": self.sessions,
                "baseline": self.baseline, "checked": self.checked, "goal": self.goal,
                "mismatches": [m.to_dict() for m in self.mismatches],
                "rows": [asdict(r) | {"in_noise": r.in_noise} for r in self.rows]}

    @property
    def stem(self) -> str:
        """Its files' name: `summary`, or `summary_vs_CONFIG` when re-summarised against another
        configuration than the run's baseline (the run's own summary is then left as it was)."""
        if self.baseline == self.conditions["baseline"]:
            return "summary"
        return "summary_vs_" + "".join(c if c.isalnum() else "_" for c in self.baseline)

    def save(self, out_dir: str | Path) -> tuple[Path, Path]:
        d, stem = Path(out_dir), self.stem
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.json").write_text(json.dumps(self.to_dict(), indent=1))
        with (d / f"{stem}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(_csv_header())
            for r in self.rows:
                w.writerow(_csv_row(r))
        return d / f"{stem}.json", d / f"{stem}.csv"


_LAT = ("ttft", "itl", "e2e")
_SKIP = {"per_position_acceptance", "step_ms", "cdf", "drafter_rounds", "verdict", *_LAT}
_STEP = ("steps", "prefill_per_request", "draft", "verify", "other")  # step_ms keys, in CSV order
_STEP_CSV = ("steps", "prefill_ms", "draft_ms", "verify_ms", "other_ms")


def _csv_header() -> list[str]:
    return ([f.name for f in fields(Row) if f.name not in _SKIP]
            + [f"{k}_{s}_s" for k in _LAT for s in ("mean", "p50", "p95", "p99")] + ["in_noise"]
            + list(_STEP_CSV) + ["verdict"])


def _csv_row(r: Row) -> list:
    return ([getattr(r, f.name) for f in fields(Row) if f.name not in _SKIP]
            + [getattr(getattr(r, k), s) for k in _LAT for s in ("mean", "p50", "p95", "p99")] + [r.in_noise]
            + [(r.step_ms or {}).get(k) for k in _STEP] + [r.verdict and r.verdict.text])


def _spec_stats(d: dict) -> SpecStats:
    return SpecStats(**{k: v for k, v in d.items() if k in SpecStats.__slots__})


def _seen(r: dict, k: str) -> float | None:
    """Latency from submission: the request's own plus its wait in a sequential group."""
    return None if r[k] is None else r[k] + r.get("queue_s", 0.0)


def _per_prompt(recs: list[dict], decode: bool = False) -> dict[str, tuple[float, int]]:
    """prompt -> (seconds, tokens) summed over its requests: from submission to the last token,
    or (`decode`) from the first token to the last, for the tokens after the first."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for r in recs:
        if not decode:
            t, n = _seen(r, "e2e_s"), r["emitted_tokens"]
        elif r.get("ttft_s") is not None:
            t, n = r["e2e_s"] - r["ttft_s"], max(r["emitted_tokens"] - 1, 0)
        else:
            continue  # no first token: nothing after it
        out[r["prompt_id"]][0] += t
        out[r["prompt_id"]][1] += n
    return {k: (t, n) for k, (t, n) in out.items()}


def paired_speedup(recs: list[dict], base: list[dict], n_boot: int = 2000, seed: int = 0, decode: bool = False):
    """(point, lo, hi) of the baseline's seconds per token over the configuration's, on the
    prompts both ran (bootstrap over prompts); None when none."""
    mine, theirs = _per_prompt(recs, decode), _per_prompt(base, decode)
    both = [p for p in mine if p in theirs and mine[p][1] and theirs[p][1]]
    if not both:
        return None, None, None
    return bootstrap_ratio([theirs[p][0] for p in both], [theirs[p][1] for p in both],
                           [mine[p][0] for p in both], [mine[p][1] for p in both], n_boot, seed)


def _row(scope, config, conc, recs, base, servers, describe, mism, n_boot, seed) -> Row:
    e2e = [_seen(r, "e2e_s") for r in recs]
    tokens = sum(r["emitted_tokens"] for r in recs)
    groups: dict = defaultdict(float)  # (repeat, group) -> elapsed
    for r, t in zip(recs, e2e):
        groups[(r["repeat"], r["group"])] = max(groups[(r["repeat"], r["group"])], t)
    row = Row(scope, config, conc, any(r.get("sequential") for r in recs), len(recs),
              len({r["prompt_id"] for r in recs}), tokens, Latency.of([_seen(r, "ttft_s") for r in recs]),
              Latency.of([x for r in recs for x in r["itl_s"]]), Latency.of(e2e),
              tokens / sum(groups.values()) if sum(groups.values()) > 0 else None,
              1000 * sum(e2e) / tokens if tokens else None, mismatches=mism)
    if recs and base and recs[0]["config"] == base[0]["config"]:
        row.speedup = row.decode_speedup = 1.0  # the baseline itself: by definition, no interval
    elif recs and base:
        row.speedup, row.speedup_lo, row.speedup_hi = paired_speedup(recs, base, n_boot, seed)
        row.decode_speedup, row.decode_speedup_lo, row.decode_speedup_hi = paired_speedup(recs, base, n_boot, seed, True)
    st = [_spec_stats(r["stats"]) for r in recs if r.get("stats")] or \
         [_spec_stats(s["stats"]) for s in servers]
    if st:
        s = aggregate(st)
        row.acceptance_rate, row.acceptance_length = s.acceptance_rate, s.acceptance_length
        row.per_position_acceptance = s.per_position_acceptance
        row.predicted_speedup = s.predicted_speedup
        steps = s.verification_rounds + s.plain_steps - s.requests
        if s.requests and s.wall_s > 0:
            row.step_ms = {"prefill_per_request": 1000 * s.prefill_s / s.requests, "steps": steps,
                           **{k: 1000 * getattr(s, f"{k}_s") / steps if steps > 0 else None
                              for k in ("draft", "verify", "other")}}
    top = lambda k: max((r[k] for r in recs if r.get(k) is not None), default=None)  # noqa: E731
    row.rss_peak_bytes, row.kv_peak_bytes, row.draft_kv_peak_bytes = top("rss_peak_bytes"), top("kv_peak_bytes"), \
        top("draft_kv_peak_bytes")
    growth = [r["rss_peak_bytes"] - r["rss_start_bytes"] for r in recs if r.get("rss_peak_bytes") is not None]
    row.rss_growth_bytes = max(growth) if growth else None
    row.draft_weight_bytes = describe.get("draft_weight_bytes")
    row.drafter_nodes = top("drafter_nodes")
    chosen = Counter(p[6] for r in recs for p in decisions(r) if len(p) > 6 and p[6] is not None)
    row.drafter_rounds = dict(chosen) or None
    own = sum(r["e2e_s"] for r in recs)
    row.probe_share = sum(r.get("probe_s") or 0.0 for r in recs) / own if own > 0 else None
    if scope == "all":
        ttft = [x for x in (_seen(r, "ttft_s") for r in recs) if x is not None]
        itl = [x for r in recs for x in r["itl_s"]]
        row.cdf = {k: np.percentile(v, range(101)).tolist() if v else []
                   for k, v in (("e2e_s", e2e), ("ttft_s", ttft), ("itl_s", itl))}
    return row


def summarise(path: str | Path, n_boot: int = 2000, seed: int = 0, goal: str | None = None,
              baseline: str | None = None) -> Summary:
    """Aggregate a results file (or its directory) measured by run_bench; with a service goal
    (draftwise.bench.goal), each row also gets its verdict. `baseline`: another of the run's
    configurations to measure speedups (paired per prompt, as against plain) and outputs against;
    default: the run's own."""
    judged_by = parse_goal(goal) if goal is not None else None  # a malformed goal fails before the work
    res = Results.load(path)
    if res.meta is None or not res.requests:
        raise ValueError(f"{path}: no benchmark results")
    cond = res.meta["conditions"]
    recs = sorted(res.requests.values(), key=lambda r: r.get("order", 0))
    baseline = baseline or cond["baseline"]
    configs = list(dict.fromkeys(r["config"] for r in recs))
    if baseline not in configs:
        raise ValueError(f"baseline {baseline!r} is not a configuration of {path} ({', '.join(configs)})")
    greedy = cond["temperature"] == 0
    mism, checked = find_mismatches(recs, baseline, res.divergences) if greedy else ([], None)
    describe = {}
    for s in res.sessions:
        describe.update(s.get("targets", {}))
    scopes = [("all", lambda r: True)]
    for f in ("category", "bucket"):
        scopes += [(f"{f}:{v}", lambda r, f=f, v=v: r[f] == v) for v in dict.fromkeys(r[f] for r in recs)]
    repeats = sorted({r["repeat"] for r in recs})
    if len(repeats) > 1:  # each pass over the prompts apart: a drafter that learns across requests gains
        scopes += [(f"repeat:{v}", lambda r, v=v: r["repeat"] == v) for v in repeats]
    rows = []
    for scope, keep in scopes:
        sub = [r for r in recs if keep(r)]
        ids = {r["prompt_id"] for r in sub}
        for conc in sorted({r["concurrency"] for r in sub}):
            base = [r for r in sub if r["config"] == baseline and r["concurrency"] == conc]
            for config in configs:
                mine = [r for r in sub if r["config"] == config and r["concurrency"] == conc]
                if not mine:
                    continue
                srv = [s for s in res.servers.values() if s["config"] == config and s["concurrency"] == conc
                       and set(s["prompt_ids"]) <= ids]
                n_mism = sum(1 for m in mism if m.config == config and m.concurrency == conc and m.prompt_id in ids)
                rows.append(_row(scope, config, conc, mine, base, srv, describe.get(config, {}), n_mism,
                                 n_boot, seed))
    if judged_by is not None:
        for r in rows:
            r.verdict = judge(r, judged_by, baseline, mismatches_checked=checked is not None)
    return Summary(cond, res.meta.get("resolved", {}), res.sessions, baseline, checked, mism, rows, goal)


def decisions(row: dict) -> list:
    """A request row's planner log (rows written before 2026-12-07 call it "plans")."""
    return row.get("decisions") or row.get("plans") or []
