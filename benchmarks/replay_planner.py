"""Replay the planner of a draft model or, without its profile, of the n-gram drafter
(draftwise.replay) on a run's teacher-forced traces
(benchmarks/trace_agreement.py), in the run's order, one planner for all requests as in the
bench; prints per category the speedup over plain decoding of auto and fixed D = 2, 4, 8 under the
cost curves given, how many requests speculated and how many rounds caught up on more than the
two tokens a fully accepted round leaves (after plain steps: the prompt or the skipped tokens).

    .venv/bin/python benchmarks/replay_planner.py docs/data/traces_prose16.jsonl \
        docs/data/profile_qwen2.5-coder-1.5b_torch_hybrid_method2_xeon.json \
        docs/data/profile_qwen2.5-coder-0.5b_torch_method2_xeon.json

`--margin M` replaces the planner's margin (default: draftwise.planner.planner_defaults for the
curves);
`--keep-margin M` the margin a caught-up draft model must keep beating plain by (default: the margin);
`--set NAME=VALUE` (repeatable) any other numeric argument of draftwise.planner.Planner, e.g.
`--set whole_z=0.75`;
`--per-request` also prints each request: auto and D = 2 against plain, auto's rounds, plain steps,
draft tokens proposed and accepted and catch-ups, and D = 2's rounds, proposed and accepted.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from draftwise.planner import CostCurve, Planner, planner_defaults
from draftwise.profile import ProfileResult
from draftwise.replay import replay, replay_ngram


def curve(path: str) -> CostCurve:
    return CostCurve.from_profile(ProfileResult.load(path))


def _counts(c: dict, keys: str) -> str:
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys.split())


def replay_run(traces: str, target_profile: str, draft_profile: str | None = None, per_request: bool = False,
               **kw) -> dict:
    """Without a draft model's profile, the n-gram drafter (prompt lookup, n = 2..4)."""
    trs = sorted((json.loads(x) for x in open(traces)), key=lambda r: r["order"])
    vt, dt = curve(target_profile), (curve(draft_profile) if draft_profile else None)
    name = "model" if dt else "ngram"
    run = replay if dt else replay_ngram
    planner = Planner(vt, dt, max_draft=16, online=False, **{**planner_defaults(name, vt, dt, 16), **kw})
    cats: dict[str, list] = defaultdict(list)
    for tr in trs:
        plain = vt.raw(tr["prompt_tokens"]) + (len(tr["tokens"]) - 1) * vt.raw(1)
        auto, c = run(tr, planner)
        runs = {D: run(tr, planner, D) for D in (2, 4, 8)}
        fixed = {D: r[0] for D, r in runs.items()}
        cats[tr["category"]].append((plain, auto, fixed, c))
        if per_request:
            print(f"{tr['prompt_id']:18} {tr['category']:14} auto {plain / auto:.3f}  D=2 {plain / fixed[2]:.3f}  "
                  f"auto: {_counts(c, 'rounds plain proposed accepted catch_up')}  "
                  f"D=2: {_counts(runs[2][1], 'rounds proposed accepted')}")
    res = {}
    print(f"{'category':14} {'auto':>6} {'D=2':>6} {'D=4':>6} {'D=8':>6}  spec'd  catch-ups")
    for cat, rows in cats.items():
        P = sum(r[0] for r in rows)
        sp = {"auto": P / sum(r[1] for r in rows)} | {D: P / sum(r[2][D] for r in rows) for D in (2, 4, 8)}
        spec = sum(r[3].get("rounds", 0) > 0 for r in rows)
        cu = sum(r[3].get("catch_up", 0) for r in rows)
        print(f"{cat:14} {sp['auto']:6.3f} {sp[2]:6.3f} {sp[4]:6.3f} {sp[8]:6.3f}  {spec:2}/{len(rows):<3}  {cu}")
        res[cat] = sp
    return res


def _number(text: str) -> int | float:
    return int(text) if text.lstrip("-").isdigit() else float(text)


def parse_args(argv: list[str] | None = None) -> tuple[list[str], dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces")
    ap.add_argument("target_profile")
    ap.add_argument("draft_profile", nargs="?", help="without it, the n-gram drafter is replayed")
    ap.add_argument("--margin", type=_number)
    ap.add_argument("--keep-margin", type=_number)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="any other numeric argument of draftwise.planner.Planner")
    ap.add_argument("--per-request", action="store_true")
    a = ap.parse_args(argv)
    kw = {k: v for k, v in (("margin", a.margin), ("keep_margin", a.keep_margin)) if v is not None}
    for item in a.set:
        name, _, value = item.partition("=")
        kw[name] = _number(value)
    if a.per_request:
        kw["per_request"] = True
    return [a.traces, a.target_profile] + ([a.draft_profile] if a.draft_profile else []), kw


def main(argv: list[str] | None = None) -> dict:
    pos, kw = parse_args(argv)
    return replay_run(*pos, **kw)


if __name__ == "__main__":
    main()
