"""Replay the planner of a draft model or, without its profile, of the n-gram drafter
(draftwise.replay) on a run's teacher-forced traces
(benchmarks/trace_agreement.py), in the run's order, one planner for all requests as in the
bench; prints per category the speedup over plain decoding of auto and fixed D = 2, 4, 8 under the
cost curves given, how many requests speculated and how many rounds caught up on more than the
two tokens a fully accepted round leaves (after plain steps: the prompt or the skipped tokens).

    .venv/bin/python benchmarks/replay_planner.py results/traces_llama.jsonl \
        docs/data/profile_qwen2.5-coder-1.5b_llama.json docs/data/profile_qwen2.5-coder-0.5b_llama.json

`--margin M` replaces the planner's margin (default: draftwise.build.margin_for the curves; the
risk term: draftwise.build.risk_for);
`--keep-margin M` the margin a caught-up draft model must keep beating plain by (default: the margin);
`--set NAME=VALUE` (repeatable) any other numeric argument of draftwise.planner.Planner, e.g.
`--set whole_z=0.75`;
`--per-request` also prints each request: auto and D = 2 against plain, auto's rounds, plain steps,
draft tokens proposed and accepted and catch-ups, and D = 2's rounds, proposed and accepted.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

from draftwise.build import margin_for, prior_for, risk_for
from draftwise.planner import CostCurve, Planner
from draftwise.profile import ProfileResult
from draftwise.replay import replay, replay_ngram


def curve(path: str) -> CostCurve:
    return CostCurve.from_profile(ProfileResult.load(path))


def _counts(c: dict, keys: str) -> str:
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys.split())


def main(traces: str, target_profile: str, draft_profile: str | None = None, per_request: bool = False,
         **kw) -> dict:
    """Without a draft model's profile, the n-gram drafter (prompt lookup, n = 2..4)."""
    trs = sorted((json.loads(x) for x in open(traces)), key=lambda r: r["order"])
    vt, dt = curve(target_profile), (curve(draft_profile) if draft_profile else None)
    name = "model" if dt else "ngram"
    run = replay if dt else replay_ngram
    kw.setdefault("margin", margin_for(vt, dt))
    kw.setdefault("risk", risk_for(dt))
    planner = Planner(vt, dt, prior=prior_for(name, 16), max_draft=16, online=False, **kw)
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


if __name__ == "__main__":
    args = sys.argv[1:]  # TRACES TARGET_PROFILE [DRAFT_PROFILE] [--margin M] [--keep-margin M] [--set NAME=VALUE]...
    kw, pos = {}, []
    while args:
        a = args.pop(0)
        if a == "--per-request":
            kw["per_request"] = True
        elif a in ("--margin", "--keep-margin", "--set"):  # --margin M is --set margin=M
            name, value = (a[2:].replace("-", "_"), args.pop(0)) if a != "--set" else args.pop(0).split("=", 1)
            kw[name] = int(value) if value.lstrip("-").isdigit() else float(value)
        else:
            pos.append(a)
    main(*pos, **kw)
