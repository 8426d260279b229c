"""Where an `auto` configuration's time went, per category, from a bench run's rows: how many
requests drafted, its rounds and plain steps against a fixed-D configuration's, drafting
seconds per round, and, over the requests that never drafted, their speed against their plain
request (geometric mean) and the median time of a plain step in each.

    .venv/bin/python benchmarks/auto_breakdown.py docs/data/planner_llama_v10 model:auto
    .venv/bin/python benchmarks/auto_breakdown.py docs/data/planner_torch_v10 model:auto model:2
"""
import math
import statistics
import sys
from collections import defaultdict

from draftwise.bench.results import Results


def _rows(run: str) -> dict:
    by = defaultdict(dict)  # prompt -> config -> row
    for r in Results.load(run).requests.values():
        by[r["prompt_id"]][r["config"]] = r
    return by


def _tpt(r: dict) -> float:  # seconds per emitted token
    return r["e2e_s"] / r["emitted_tokens"]


def _step_ms(r: dict) -> float:  # a plain step's time where the request only took plain steps
    s = r["stats"]
    return 1e3 * s["verify_s"] / max(s["plain_steps"], 1)


def main(run: str, config: str, fixed: str | None = None) -> None:
    cats = defaultdict(list)
    for d in _rows(run).values():
        if config in d and "plain" in d:
            cats[d[config]["category"]].append(d)
    print(f"{'category':14} {'drafted':>8} {'rounds':>7} {'plain':>6} {'draft ms/round':>15}"
          f" {'no-draft x plain':>17} {'plain-step ms plain/auto':>25}")
    for cat, ds in list(cats.items()) + [("all", [d for v in cats.values() for d in v])]:
        cfgs = [config] + ([fixed] if fixed else [])
        line = f"{cat:14} {sum(d[config]['stats']['verification_rounds'] > 0 for d in ds):>3}/{len(ds):<4}"
        parts = []
        for c in cfgs:
            st = [d[c]["stats"] for d in ds if c in d]
            rounds = sum(s["verification_rounds"] for s in st)
            parts.append((rounds, sum(s["plain_steps"] for s in st),
                          1e3 * sum(s["draft_s"] for s in st) / max(rounds, 1)))
        for j, (width, fmt) in enumerate(((7, "{:.0f}"), (6, "{:.0f}"), (15, "{:.0f}"))):
            line += " " + "/".join(fmt.format(p[j]) for p in parts).rjust(width)
        nd = [d for d in ds if d[config]["stats"]["verification_rounds"] == 0]
        if nd:
            g = math.exp(statistics.mean(math.log(_tpt(d["plain"]) / _tpt(d[config])) for d in nd))
            ms = [statistics.median(_step_ms(d[c]) for d in nd) for c in ("plain", config)]
            line += f" {g:>11.3f} ({len(nd):>2}) {ms[0]:>16.1f} / {ms[1]:.1f}"
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:4])
