"""Per request, ms per target forward after the prefill (verification time over rounds and plain
steps), for the same prompt and repeat side by side across configurations: how much the cost of
the same kind of forward moves between requests of one run (the machine's noise); then each
configuration against the median of the fixed-D configurations listed, request by request.

    .venv/bin/python benchmarks/forward_ms.py docs/data/planner_torch_v16 writing,humanities plain,ngram:auto,ngram:4,ngram:8
"""
from __future__ import annotations

import statistics
import sys

from step_costs import ms_per_forward  # benchmarks/step_costs.py

from draftwise.bench.results import Results


def request_ms(run: str) -> dict[tuple[str, str, int, str], float]:
    """(category, prompt, repeat, config) -> ms per target forward after the prefill."""
    ms = {}
    for r in Results.load(run).requests.values():
        s = r["stats"]
        ms[(r["category"], r["prompt_id"], r["repeat"], r["config"])] = \
            ms_per_forward(s["verify_s"], s["verification_rounds"], s["plain_steps"])
    return ms


def main(run: str, cats: list[str], cfgs: list[str]) -> None:
    ms = request_ms(run)
    print(f"{'category':12} {'prompt':18} {'rep':>3} " + "".join(f"{c:>12}" for c in cfgs))
    for cat in cats:
        keys = sorted({k[:3] for k in ms if k[0] == cat})
        for k in keys:
            print(f"{cat:12} {k[1]:18} {k[2]:3} " + "".join(f"{ms.get(k + (c,), float('nan')):12.0f}" for c in cfgs))
        for c in cfgs:
            v = [ms[k + (c,)] for k in keys if k + (c,) in ms]
            if v:
                print(f"{cat:12} {c:18} min {min(v):.0f} median {statistics.median(v):.0f} max {max(v):.0f}")
    fixed = [c for c in cfgs if c.split(":")[-1].isdigit()]  # each request against the fixed-D median
    keys = [k for k in sorted({k[:3] for k in ms if k[0] in cats}) if all(k + (c,) in ms for c in cfgs)]
    print(f"\nover {len(keys)} requests, ms per forward / the median of {', '.join(fixed)} on the same request:")
    for c in cfgs:
        rel = [ms[k + (c,)] / statistics.median(ms[k + (f,)] for f in fixed) for k in keys]
        print(f"  {c:12} median {statistics.median(rel):.3f}, above 1 on {sum(x > 1 for x in rel)} of {len(rel)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","))
