"""Replay the planner of a draft model or, without its profile, of a drafter with no model
(n-gram, suffix, suffix-tree: `--drafter`; draftwise.replay) on a run's teacher-forced traces
(benchmarks/trace_agreement.py) or, for a drafter with no model, on a bench run's plain outputs
(a run directory: no model is loaded, its prompts are rebuilt and tokenized), in the run's order
(a suffix drafter keeping its global trie across requests), one planner for all requests as in
the bench; prints per category (and per pass of a run asked twice) the speedup over plain
decoding of auto and fixed D = 2, 4, 8 under the cost curves given, how many requests speculated
and how many rounds caught up on more than the two tokens a fully accepted round leaves (after
plain steps: the prompt or the skipped tokens).

    .venv/bin/python benchmarks/replay_planner.py docs/data/traces_prose16.jsonl \
        docs/data/profile_qwen2.5-coder-1.5b_torch_hybrid_method2_xeon.json \
        docs/data/profile_qwen2.5-coder-0.5b_torch_method2_xeon.json
    .venv/bin/python benchmarks/replay_planner.py results/suffix_editeval_llama \
        docs/data/profile_qwen2.5-coder-1.5b_llama_repacked_k33_epyc.json --drafter suffix

`--margin M` replaces the planner's margin (default: draftwise.draft_length.config_for for the
curves); `--set NAME=VALUE` (repeatable) any other numeric field of
draftwise.draft_length.PlannerConfig, e.g. `--set probe_max=1`;
`--per-request` also prints each request: auto and D = 2 against plain, auto's rounds, plain steps,
draft tokens proposed and accepted and catch-ups, and D = 2's rounds, proposed and accepted.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import os

from draftwise.costs import CostCurve
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.draft_length import config_for
from draftwise.planner import Planner
from draftwise.profile import ProfileResult
from draftwise.replay import replay, replay_cheap

CHEAP = {"ngram": NgramDrafter, "suffix": SuffixDrafter, "suffix-tree": lambda: SuffixDrafter(tree=True)}


def curve(path: str) -> CostCurve:
    return CostCurve.from_profile(ProfileResult.load(path))


def _counts(c: dict, keys: str) -> str:
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys.split())


def run_traces(run: str, tok=None) -> list[dict]:
    """A bench run's plain requests in run order as traces for a drafter with no model: prompt ids
    (the prompts rebuilt from the run's plan, tokenized by `tok`, by default the target's) and
    output."""
    from draftwise.bench.config import run_prompts
    from draftwise.bench.results import Results
    from draftwise.models.load import load_tokenizer
    from draftwise.models.registry import resolve

    res = Results.load(run)
    meta, plan = res.meta["conditions"], res.sessions[0]["plan"]
    prompts, tok = run_prompts(plan, meta), tok or load_tokenizer(resolve(meta["target"]))
    out = []
    for r in sorted((r for r in res.requests.values() if r["config"] == "plain"),
                    key=lambda r: (r["repeat"], r["order"])):
        ids = prompts[r["prompt_id"]].token_ids(tok)
        cat = r["category"] + (f" (pass {r['repeat'] + 1})" if plan.get("repeats", 1) > 1 else "")
        out.append({"prompt_id": r["prompt_id"], "category": cat, "prompt_tokens": len(ids), "prompt_ids": ids,
                    "tokens": r["token_ids"]})
    return out


def replay_run(traces: str, target_profile: str, draft_profile: str | None = None, per_request: bool = False,
               drafter: str = "ngram", tok=None, **kw) -> dict:
    """Without a draft model's profile, `drafter` (n-gram: prompt lookup, n = 2..4; suffix), one
    instance per configuration (auto, D = 2, 4, 8) for the whole run."""
    if os.path.isdir(traces):
        trs = run_traces(traces, tok)
    else:
        trs = sorted((json.loads(x) for x in open(traces)), key=lambda r: r["order"])
    vt, dt = curve(target_profile), (curve(draft_profile) if draft_profile else None)
    name = "model" if dt else drafter
    max_draft = 16 if dt else 32
    config = config_for(name, dt is None, max_draft)
    planner = Planner(vt, dt, config, online=False, **kw)
    cols: tuple = (2, 4, 8) if dt else (2, 4, 8, "oracle")
    if dt:
        def run(tr, pl, fixed=0, i=0):
            return replay(tr, pl, fixed)
    else:
        drafters = {D: CHEAP[drafter]() for D in (0, 2, 4, 8, "oracle")}

        def run(tr, pl, fixed=0, i=0):
            if fixed == "oracle":
                return replay_cheap(tr, pl, drafters[fixed], key=i, oracle=True)
            return replay_cheap(tr, pl, drafters[fixed], fixed, key=i)
    cats: dict[str, list] = defaultdict(list)
    for i, tr in enumerate(trs):
        plain = vt.raw(tr["prompt_tokens"]) + (len(tr["tokens"]) - 1) * vt.raw(1)
        auto, c = run(tr, planner, 0, i)
        runs = {D: run(tr, planner, D, i) for D in cols}
        fixed = {D: r[0] for D, r in runs.items()}
        cats[tr["category"]].append((plain, auto, fixed, c))
        if per_request:
            print(f"{tr['prompt_id']:18} {tr['category']:14} auto {plain / auto:.3f}  D=2 {plain / fixed[2]:.3f}  "
                  f"auto: {_counts(c, 'rounds plain proposed accepted catch_up')}  "
                  f"D=2: {_counts(runs[2][1], 'rounds proposed accepted')}")
    res = {}
    print(f"{'category':14} {'auto':>6} {'D=2':>6} {'D=4':>6} {'D=8':>6}" + ("  oracle" if not dt else "")
          + "  spec'd  catch-ups")
    for cat, rows in cats.items():
        P = sum(r[0] for r in rows)
        sp = {"auto": P / sum(r[1] for r in rows)} | {D: P / sum(r[2][D] for r in rows) for D in cols}
        spec = sum(r[3].get("rounds", 0) > 0 for r in rows)
        cu = sum(r[3].get("catch_up", 0) for r in rows)
        best = f"  {sp['oracle']:6.3f}" if "oracle" in sp else ""
        print(f"{cat:14} {sp['auto']:6.3f} {sp[2]:6.3f} {sp[4]:6.3f} {sp[8]:6.3f}{best}  {spec:2}/{len(rows):<3}  {cu}")
        res[cat] = sp
    return res


def _number(text: str) -> int | float:
    return int(text) if text.lstrip("-").isdigit() else float(text)


def parse_args(argv: list[str] | None = None) -> tuple[list[str], dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces")
    ap.add_argument("target_profile")
    ap.add_argument("draft_profile", nargs="?", help="without it, --drafter is replayed")
    ap.add_argument("--drafter", choices=sorted(CHEAP), default="ngram", help="without a draft profile")
    ap.add_argument("--margin", type=_number)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="any other numeric field of draftwise.draft_length.PlannerConfig")
    ap.add_argument("--per-request", action="store_true")
    a = ap.parse_args(argv)
    kw = {} if a.margin is None else {"margin": a.margin}
    for item in a.set:
        name, _, value = item.partition("=")
        kw[name] = _number(value)
    if a.per_request:
        kw["per_request"] = True
    if a.drafter != "ngram":
        kw["drafter"] = a.drafter
    return [a.traces, a.target_profile] + ([a.draft_profile] if a.draft_profile else []), kw


def main(argv: list[str] | None = None) -> dict:
    pos, kw = parse_args(argv)
    return replay_run(*pos, **kw)


if __name__ == "__main__":
    main()
