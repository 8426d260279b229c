"""Per-category markdown of a planner benchmark (a `draftwise bench` results directory holding plain,
<drafter>:auto and fixed <drafter>:D configurations): auto against plain and against the best fixed
D of the same category, with bootstrap 95% intervals, the planner's predicted speedup, and the
output check.

    .venv/bin/python benchmarks/report_planner.py results/planner_llama > docs/data/planner_llama.md

With a second directory (an earlier run of the same prompts), fixed-D configurations this run
lacks are taken from that one, each as a speedup over *its own run's* plain decoding, marked `*`
(a ratio of ratios across runs: noisier than side by side, and labelled so; the "all" row
compares like with like only when both runs hold the same prompts).

A fixed D that ran fewer of a scope's prompts than plain decoding (a run stopped and resumed with
fewer configurations) is not a candidate for that scope's best fixed D; the table of fixed D
shows its speedup on the prompts it ran, with "(k of n)".

`--steps DRAFTER` prints instead where the run's time went, per category and configuration of
plain and that drafter, summed over its requests (all repeats): wall, prefill, drafting and
verification seconds, rounds, plain steps, proposed and accepted draft tokens, ms per target
forward after the prefill (verification rounds and plain steps alike) and drafting ms per proposed
token; then `auto`'s steps by how many draft tokens they proposed (a round verifies one more; 0: a
plain step or a draft dropped whole), with their median measured ms (rounds catching up on more
than 2 tokens left out).

    .venv/bin/python benchmarks/report_planner.py results/planner_torch --steps model

`--decode` prints, per configuration, its speedup over plain on the requests whose output equals
plain decoding's, end to end and after the first token (decoding alone, without the prefill that
every configuration shares), with the prefill's share of plain's time. Where prompts are long and
answers short (Spec-Bench rag), time per emitted token measures mostly the prefill, and an output
that ends earlier or later at a near-tie moves it more than the drafting does.

    .venv/bin/python benchmarks/report_planner.py results/suffix_rag_llama --decode

`--against OLD` prints, per category and configuration, this run's and an older checkout's run's
speedups over their own plain decoding (the same prompts, run back to back) and the newer over
the older: how a change moved each configuration.

    .venv/bin/python benchmarks/report_planner.py results/new --against results/old

`--costs` prints, per configuration and prompt length, the measured over the planner's predicted
seconds of its rounds and of its plain steps (`plans`): how well the cost curve priced them.

`--members` prints, per category, what `--drafter auto` (configurations `auto:*`) chose: its
drafted rounds and how many each member drafted, and its prompt catch-ups: the requests whose
member with a model (draft model, head) drafted at all, each first reading the whole prompt and
the output so far in one round (that round's measured seconds, least to most; the request's
`plans` rows).

    .venv/bin/python benchmarks/report_planner.py results/auto_torch10 --members
"""
from __future__ import annotations

import argparse
import functools
import statistics
from collections import Counter, defaultdict

from draftwise.bench.results import Results
from draftwise.bench.summary import paired_speedup, summarise
from draftwise.bench.summary import decisions
from draftwise.request import DecisionLog


def _ci(r) -> str:
    if r.speedup is None:
        return "-"
    if r.speedup_lo is None:
        return f"{r.speedup:.2f}"
    return f"{r.speedup:.2f} [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]"


def report(path: str, fixed_from: str | None = None) -> None:
    s = summarise(path)
    rows = defaultdict(dict)  # scope -> config -> Row
    for r in s.rows:
        if r.concurrency == 1:
            rows[r.scope][r.config] = r
    drafters = sorted({c.split(":")[0] for c in rows["all"] if ":" in c})
    scopes = [sc for sc in rows if sc.startswith("category:")] + ["all"]
    if fixed_from is not None:  # fixed D this run lacks, from the earlier run: "<drafter>:<D>*"
        for r in summarise(fixed_from).rows:
            d = r.config.split(":")
            if r.concurrency == 1 and r.scope in scopes and len(d) == 2 and d[1].isdigit() \
                    and r.config not in rows[r.scope]:
                rows[r.scope][r.config + "*"] = r
    print(f"output check: {len(s.mismatches)} of {s.checked} outputs differ from the baseline ({s.baseline})\n")
    for d in drafters:
        print(f"### {d}\n")
        print("| category | plain tok/s | auto speedup [95% CI] | planner predicted | best fixed D | its speedup "
              "[95% CI] | auto / best | auto >= 0.97 | within 5% of best | D=0 steps share |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for sc in scopes:
            cfg = rows[sc]
            auto = cfg.get(f"{d}:auto")
            fixed = {c: r for c, r in cfg.items() if c.startswith(f"{d}:") and c != f"{d}:auto"
                     and _complete(c, r, cfg.get("plain"))}
            if auto is None or not fixed or "plain" not in cfg:
                continue
            best_name, best = max(fixed.items(), key=lambda kv: kv[1].speedup or 0)
            ratio = auto.speedup / best.speedup if best.speedup else None
            plain_share = _plain_share(path, d, sc)
            print(f"| {sc.removeprefix('category:')} | {cfg['plain'].tokens_per_s:.2f} | {_ci(auto)} | "
                  f"{auto.predicted_speedup or 0:.2f} | {best_name.split(':')[1]} | {_ci(best)} | "
                  f"{ratio:.3f} | {'yes' if auto.speedup >= 0.97 else 'NO'} | "
                  f"{'yes' if ratio >= 0.95 else 'NO'} | {plain_share} |")
        print()
        fixed_names = sorted({c for c in rows["all"] if c.startswith(f"{d}:") and c != f"{d}:auto"},
                             key=lambda c: int(c.split(":")[1].rstrip("*")))
        print("| category | " + " | ".join(fixed_names) + " |")
        print("|---|" + "---|" * len(fixed_names))
        for sc in scopes:
            print(f"| {sc.removeprefix('category:')} | "
                  + " | ".join(_fixed_cell(rows[sc], c) for c in fixed_names) + " |")
        print()
    if s.mismatches:
        print("### output differences\n")
        for m in s.mismatches:
            print(f"- {m.config} {m.prompt_id}: {m.to_dict()}")


def _complete(name: str, r, plain) -> bool:
    """Whether a configuration ran every prompt plain decoding ran in the scope (a fixed D taken
    from an earlier run, `*`, is that run's own comparison)."""
    return plain is None or name.endswith("*") or r.prompts >= plain.prompts


def _fixed_cell(cfg: dict, name: str) -> str:
    if name not in cfg:
        return "-"
    r, plain = cfg[name], cfg.get("plain")
    return _ci(r) if _complete(name, r, plain) else f"{_ci(r)} ({r.prompts} of {plain.prompts})"


@functools.lru_cache(maxsize=None)
def _requests(path: str) -> list[dict]:
    return list(Results.load(path).requests.values())


def _plain_share(path: str, drafter: str, scope: str) -> str:
    """Share of auto's decode steps that were plain steps (D = 0 chosen, or nothing proposed)."""
    steps = plain = 0
    for r in _requests(path):
        if r["config"] != f"{drafter}:auto" or (scope != "all" and f"category:{r['category']}" != scope):
            continue
        st = r["stats"]
        steps += st["verification_rounds"] + st["plain_steps"] - 1
        plain += st["plain_steps"] - 1
    return f"{plain / steps:.2f}" if steps else "-"


# --- where the time went ----------------------------------------------------------------------

def ms_per_forward(verify_s: float, rounds: float, plain_steps: float, requests: float = 1) -> float:
    """Verification ms per target forward after the prefill, over `requests` requests' totals: each
    request's first token is counted as a plain step but comes from the prefill's forward."""
    return 1000 * verify_s / max(rounds + plain_steps - requests, 1)


KEYS = ("requests", "wall_s", "prefill_s", "draft_s", "verify_s", "verification_rounds", "plain_steps",
        "proposed_tokens", "accepted_draft_tokens")


def step_costs(run: str, drafter: str) -> None:
    reqs = list(Results.load(run).requests.values())  # one row per request key, as the summary reads them
    cats = list(dict.fromkeys(r["category"] for r in reqs))
    cfgs = ["plain"] + sorted({r["config"] for r in reqs if r["config"].startswith(drafter + ":")})
    tot: dict = defaultdict(lambda: defaultdict(float))
    for r in reqs:
        for k in KEYS:
            tot[(r["category"], r["config"])][k] += r["stats"][k] if k != "requests" else 1
    print(f"{'category':14} {'config':11} {'wall':>6} {'pre':>5} {'draft':>6} {'verify':>6} {'rounds':>6} "
          f"{'plain':>5} {'prop':>5} {'acc':>5}  ms/forward  draft ms/token")
    for c in cats:
        for g in cfgs:
            a = tot[(c, g)]
            print(f"{c:14} {g:11} {a['wall_s']:6.1f} {a['prefill_s']:5.1f} {a['draft_s']:6.1f} {a['verify_s']:6.1f} "
                  f"{a['verification_rounds']:6.0f} {a['plain_steps']:5.0f} {a['proposed_tokens']:5.0f} "
                  f"{a['accepted_draft_tokens']:5.0f}  {ms_per_forward(a['verify_s'], a['verification_rounds'], a['plain_steps'], a['requests']):10.0f}  "
                  f"{1000 * a['draft_s'] / max(a['proposed_tokens'], 1):13.0f}")
    auto = f"{drafter}:auto"
    print(f"\n{auto} steps by draft tokens proposed (0: a plain step or a draft dropped whole): count x median ms")
    for c in cats:
        ms: dict = defaultdict(list)
        for r in reqs:
            if r["config"] == auto and r["category"] == c:
                for p in decisions(r):  # [D, proposed, unseen, predicted ms, measured ms, ...]
                    if p[2] <= 2:
                        ms[p[1]].append(p[4])
        print(f"{c:14} " + "  ".join(f"{k}: {len(v)} x {statistics.median(v):.0f}" for k, v in sorted(ms.items())))


def decode_only(run: str) -> None:
    """Speedups over plain on the (prompt, repeat) pairs whose outputs equal plain's, summed per
    prompt (the interval resamples prompts, as the bench summary's does)."""
    by = defaultdict(dict)  # (prompt, repeat) -> config -> request
    for r in _requests(run):
        if r["concurrency"] == 1:
            by[r["prompt_id"], r["repeat"]][r["config"]] = r
    print("| config | identical to plain | tokens per request | prefill share (plain) | speedup end to end "
          "| speedup after the first token [95% CI] |\n|---|---|---|---|---|---|")
    for c in sorted({c for v in by.values() for c in v} - {"plain"}):
        same = [v for v in by.values() if c in v and "plain" in v and v[c]["token_ids"] == v["plain"]["token_ids"]]
        if not same:
            print(f"| {c} | 0 of {len(by)} | | | | |")
            continue
        mine, plain = [v[c] for v in same], [v["plain"] for v in same]
        e2e = paired_speedup(mine, plain)[0]
        dec = paired_speedup(mine, plain, decode=True)
        share = sum(v["plain"]["ttft_s"] for v in same) / sum(v["plain"]["e2e_s"] for v in same)
        ci = f"{dec[0]:.2f}" if dec[1] is None else f"{dec[0]:.2f} [{dec[1]:.2f}, {dec[2]:.2f}]"
        print(f"| {c} | {len(same)} of {len(by)} | {sum(v[c]['emitted_tokens'] for v in same) / len(same):.1f} "
              f"| {share:.2f} | {e2e:.3f} | {ci} |")


def round_costs(run: str) -> None:
    """The planner's predicted seconds against the measured, summed per configuration and prompt
    length, for rounds (a draft verified) and plain steps apart: where the cost curve prices
    rounds low (its profile is measured at a 256-token context), the ratio grows with the prompt."""
    sizes = ("< 300", "300-599", ">= 600")
    by = defaultdict(lambda: [0, 0.0, 0.0])  # (config, length, round?) -> [steps, predicted, measured]
    for r in _requests(run):
        size = sizes[(r["prompt_tokens"] >= 300) + (r["prompt_tokens"] >= 600)]
        for p in map(DecisionLog._make, decisions(r)):
            if p.unseen == 0:  # a draft model's catch-up is priced on its own curve
                got = by[r["config"], size, p.proposed > 0]
                got[0] += 1
                got[1] += p.predicted_ms
                got[2] += p.measured_ms
    print("| config | prompt tokens | rounds: n, measured / predicted | plain steps: n, measured / predicted |\n"
          "|---|---|---|---|")
    for config, size in sorted({k[:2] for k in by}, key=lambda k: (k[0], sizes.index(k[1]))):
        cells = [f"{n}, {m / pr:.3f}" if n else "-" for n, pr, m in (by[config, size, x] for x in (True, False))]
        print(f"| {config} | {size} | {cells[0]} | {cells[1]} |")


def members(run: str) -> None:
    """`--drafter auto`'s rounds per member and prompt catch-ups, per category (from `plans`)."""
    by = defaultdict(list)  # (config, category) -> each request's drafted rounds
    for r in _requests(run):
        if r["config"].startswith("auto:") and r["concurrency"] == 1 and decisions(r):
            rounds = [p for p in map(DecisionLog._make, decisions(r)) if p.d > 0]
            by[r["config"], r["category"]].append(rounds)
            by[r["config"], "all"].append(rounds)
    print("| config | category | requests | drafted rounds | by member | prompt catch-ups | their rounds' s |\n"
          "|---|---|---|---|---|---|---|")
    for (config, cat), reqs in sorted(by.items()):
        per = Counter(p.drafter for rounds in reqs for p in rounds)
        # a member with a model catches up (unseen > 0) on the prompt at its first round
        secs = sorted(next(p for p in rounds if p.unseen > 0).measured_ms / 1e3
                      for rounds in reqs if any(p.unseen > 0 for p in rounds))
        span = f"{secs[0]:.1f}–{secs[-1]:.1f}" if secs else "-"
        print(f"| {config} | {cat} | {len(reqs)} | {sum(per.values())} | "
              f"{', '.join(f'{m} {n}' for m, n in sorted(per.items()))} | {len(secs)} | {span} |")


def against(new: str, old: str) -> None:
    """Two runs of the same prompts back to back (an older checkout's, `old`, and a newer one's):
    each configuration's speedup over its own run's plain, end to end and after the first token,
    per category with intervals, and the newer over the older (a ratio of ratios across runs:
    noisier than side by side, so the intervals are printed with it)."""
    def rows(path):
        return {(r.scope, r.config): r for r in summarise(path).rows
                if r.concurrency == 1 and not r.scope.startswith("bucket:")}

    def ci(point, lo, hi) -> str:
        return "-" if point is None else f"{point:.2f}" if lo is None else f"{point:.2f} [{lo:.2f}, {hi:.2f}]"

    o, n = rows(old), rows(new)
    print("| scope | config | old e2e | new e2e | new/old | old after 1st token | new after 1st token |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted((k for k in n if k in o and k[1] != "plain"), key=lambda k: (k[0] == "all", k)):
        ro, rn = o[k], n[k]
        ratio = f"{rn.speedup / ro.speedup:.3f}" if ro.speedup and rn.speedup else "-"
        print(f"| {k[0].removeprefix('category:')} | {k[1]} ({rn.prompts} prompts) "
              f"| {ci(ro.speedup, ro.speedup_lo, ro.speedup_hi)} | {ci(rn.speedup, rn.speedup_lo, rn.speedup_hi)} "
              f"| {ratio} | {ci(ro.decode_speedup, ro.decode_speedup_lo, ro.decode_speedup_hi)} "
              f"| {ci(rn.decode_speedup, rn.decode_speedup_lo, rn.decode_speedup_hi)} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a `draftwise bench` results directory")
    ap.add_argument("fixed_from", nargs="?", help="an earlier run of the same prompts, for fixed D this one lacks")
    ap.add_argument("--steps", metavar="DRAFTER", help="print where the time went for plain and DRAFTER (ngram, model)")
    ap.add_argument("--decode", action="store_true",
                    help="speedups on the outputs identical to plain, end to end and after the first token")
    ap.add_argument("--members", action="store_true", help="--drafter auto's rounds per member and prompt catch-ups")
    ap.add_argument("--costs", action="store_true", help="measured over predicted seconds of rounds and plain steps")
    ap.add_argument("--against", metavar="OLD", help="an older checkout's run of the same prompts: both runs' "
                                                     "speedups over their own plain, and new over old")
    a = ap.parse_args(argv)
    if a.against:
        against(a.run, a.against)
    elif a.members:
        members(a.run)
    elif a.costs:
        round_costs(a.run)
    elif a.decode:
        decode_only(a.run)
    else:
        step_costs(a.run, a.steps) if a.steps else report(a.run, a.fixed_from)


if __name__ == "__main__":
    main()
