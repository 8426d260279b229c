"""Replay the planner offline on a run's teacher-forced traces or plain outputs; `traces` writes those traces.

Replay (the default): the planner of a draft model or, without its profile, of a drafter with no
model (n-gram, suffix, suffix-tree: `--drafter`; draftwise.replay) on a run's teacher-forced traces
(the `traces` subcommand below) or, for a drafter with no model, on a bench run's plain outputs
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

`traces RUN OUT`: teacher-forced traces of a bench run's plain outputs, for the replay. For every
plain request of RUN (its prompt rebuilt from the run's workload and seed), both models score
prompt + output in one forward each; per output position t the trace holds the target's token and
top probability and the draft model's argmax and its probability. Greedy acceptance of any round
is then known: a draft started at t is accepted up to the first position where the draft's argmax
differs from the target's token (accepted tokens are the target's, so the draft's context is the
one it was scored in). With `--head [NAME|DIR]` it measures a draft head instead: its
teacher-forced acceptance per draft position (train-head's unroll, draftwise.train_head.ttt_losses)
over the chains that start in each plain output, per category and overall, next to what the run's
head configurations accepted in generation (docs/heads.md).

    .venv/bin/python benchmarks/replay_planner.py traces docs/data/plain_llama_prose16 results/traces.jsonl
    .venv/bin/python benchmarks/replay_planner.py traces results/head_llama10 results/head_tf.json --head
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch

from draftwise.bench.config import run_prompts as prompts_of_run
from draftwise.bench.results import Results
from draftwise.costs import CostCurve
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.draft_length import config_for
from draftwise.planner import Planner
from draftwise.profile import ProfileResult
from draftwise.replay import replay, replay_cheap

CHEAP = {"ngram": NgramDrafter, "suffix": SuffixDrafter, "suffix-tree": lambda: SuffixDrafter(tree=True)}


# ---- traces: teacher-forced traces of a run's plain outputs (and a draft head's acceptance) ----

def run_prompts(run: str) -> tuple[list[dict], dict]:
    """The run's plain requests in run order, and its prompts by id (rebuilt from its plan)."""
    res = Results.load(run)
    plain = sorted((r for r in res.requests.values() if r["config"] == "plain"), key=lambda r: r["order"])
    return plain, prompts_of_run(res.sessions[0]["plan"], res.meta["conditions"])


def trace(request: dict, prompt_ids: list[int], target, draft) -> dict:
    """One plain request's trace: both models score prompt + output in one forward each."""
    out = request["token_ids"]
    feed, n = prompt_ids + out[:-1], len(out)
    rec = {"prompt_id": request["prompt_id"], "category": request["category"], "order": request["order"],
           "prompt_tokens": len(prompt_ids), "prompt_ids": prompt_ids, "tokens": out}
    for name, m in (("target", target), ("draft", draft)):
        s = m.new_sequence()
        p = torch.softmax(m.forward([s], [feed], [n])[0].float(), -1)  # [n, V]
        m.free(s)
        top, arg = p.max(-1)
        rec[name + "_top"] = [round(float(x), 4) for x in top]
        rec[name + "_argmax"] = arg.tolist()
    return rec


def write_traces(run: str, out: str, target, draft, tok) -> None:
    plain, prompts = run_prompts(run)
    with open(out, "w") as f:
        for r in plain:
            rec = trace(r, prompts[r["prompt_id"]].token_ids(tok), target, draft)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            agree = sum(a == b for a, b in zip(rec["draft_argmax"], rec["tokens"])) / len(rec["tokens"])
            print(r["prompt_id"], r["category"], rec["prompt_tokens"], len(rec["tokens"]), f"agree {agree:.2f}",
                  flush=True)


def head_acceptance(run: str, out: str, target, tok, head_spec: str | None, target_name: str, steps: int = 3) -> dict:
    """The head's teacher-forced acceptance on the run's plain outputs, next to generation's."""
    from draftwise.models.head import load_head
    from draftwise.models.heads import resolve_head
    from draftwise.train_head import acceptance, features_of, ttt_losses

    head = load_head(resolve_head(head_spec, target_name), target)
    t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d[head.draft_to_target] = torch.arange(head.config.draft_vocab_size)
    plain, prompts = run_prompts(run)
    hits, tot = defaultdict(lambda: [0] * steps), defaultdict(lambda: [0] * steps)
    for r in plain:
        ids = prompts[r["prompt_id"]].token_ids(tok) + r["token_ids"]
        logits, feats = features_of(target, ids)
        greedy = logits.argmax(-1)
        with torch.no_grad():
            _, _, alive, _ = ttt_losses(head, torch.tensor([ids]), feats[None], greedy[None], steps, t2d)
        first = len(ids) - len(r["token_ids"]) - 1  # chain i starts at position i + 1: the output's
        for key in (r["category"], "all"):
            for k, a in enumerate(alive):
                hits[key][k] += int(a[0, first:].sum())
                tot[key][k] += a[0, first:].numel()
        print(r["prompt_id"], f"{hits['all'][0] / max(tot['all'][0], 1):.3f}", flush=True)
    gen = defaultdict(lambda: [[0] * 16, [0] * 16])
    for r in Results.load(run).requests.values():
        if r["config"].startswith("head:"):
            st = r["stats"]
            for k, (p, a) in enumerate(zip(st["proposed_per_position"], st["accepted_per_position"])):
                gen[r["config"]][0][k] += a
                gen[r["config"]][1][k] += p
    res = {"teacher_forced": {k: acceptance(hits[k], tot[k]) for k in hits},
           "generation": {c: acceptance([a for a, p in zip(*v) if p], [p for p in v[1] if p]) for c, v in gen.items()}}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res


def _load(name: str, threads: int):
    from draftwise.build import EngineSpec, build_engine

    _, runner, tok = build_engine(EngineSpec(target=name, drafter="none", num_draft_tokens=0,
                                             backend="llama.cpp", threads=threads))
    return runner, tok


def traces_main(argv: list[str] | None = None) -> None:
    """The `traces` subcommand: write a run's teacher-forced traces, or with --head a head's acceptance."""
    ap = argparse.ArgumentParser(prog="replay_planner.py traces",
                                 description="Teacher-forced traces of a bench run's plain outputs, for the replay "
                                             "(with --head: a draft head's teacher-forced acceptance).")
    ap.add_argument("run", help="a `draftwise bench` results directory with plain requests")
    ap.add_argument("out", help="traces file to write (JSONL)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head", nargs="?", const="", default=None,
                    help="measure a draft head (a name or directory; bare: the target's packaged head)")
    a = ap.parse_args(argv)
    target, tok = _load(a.target, a.threads)
    if a.head is not None:
        res = head_acceptance(a.run, a.out, target, tok, a.head or None, a.target)
        for k, v in res["teacher_forced"].items():
            print(f"teacher-forced {k}: " + ", ".join(f"{x:.3f}" for x in v["acceptance_per_position"]))
        for k, v in res["generation"].items():
            print(f"generation {k}: " + ", ".join(f"{x:.3f}" for x in v["acceptance_per_position"]))
        return
    draft, _ = _load(a.draft, a.threads)
    write_traces(a.run, a.out, target, draft, tok)


# ---- replay: the planner on those traces or on a run's plain outputs ----

def curve(path: str) -> CostCurve:
    return CostCurve.from_profile(ProfileResult.load(path))


def _counts(c: dict, keys: str) -> str:
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys.split())


def run_traces(run: str, tok=None) -> list[dict]:
    """A bench run's plain requests in run order as traces for a drafter with no model: prompt ids
    (the prompts rebuilt from the run's plan, tokenized by `tok`, by default the target's) and
    output."""
    from draftwise.models.load import load_tokenizer
    from draftwise.models.registry import resolve

    res = Results.load(run)
    meta, plan = res.meta["conditions"], res.sessions[0]["plan"]
    prompts, tok = prompts_of_run(plan, meta), tok or load_tokenizer(resolve(meta["target"]))
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="`replay_planner.py traces RUN OUT [--head ...]` writes the traces "
                                        "(`replay_planner.py traces --help`).")
    ap.add_argument("traces", help="a traces file (the `traces` subcommand) or a bench run directory")
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


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["traces"]:
        return traces_main(argv[1:])
    pos, kw = parse_args(argv)
    return replay_run(*pos, **kw)


if __name__ == "__main__":
    main()
