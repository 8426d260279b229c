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
"""
from __future__ import annotations

import functools
import sys
from collections import defaultdict

from draftwise.bench.summary import summarise


def _ci(r) -> str:
    if r.speedup is None:
        return "-"
    if r.speedup_lo is None:
        return f"{r.speedup:.2f}"
    return f"{r.speedup:.2f} [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]"


def main(path: str, fixed_from: str | None = None) -> None:
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
    print(f"output check: {len(s.mismatches)} of {s.checked} outputs differ from plain decoding\n")
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
    from draftwise.bench.results import Results

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


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: report_planner.py RESULTS_DIR [EARLIER_RUN_FOR_FIXED_D]")
    main(*sys.argv[1:])
