"""Each request of a bench run against the guest kernel's counters while it ran
(benchmarks/guest_counters.sh): its ms per target forward, that over the median of the same
prompt's plain and fixed-D configurations, and per second of the request the CPU ticks in user,
system and steal time (2 cores: 200 ticks/s in all), page faults, compaction stalls and
transparent-huge-page faults and collapses, and khugepaged's ticks.

    .venv/bin/python benchmarks/guest_counters.py docs/data/planner_torch_v17 1 \
        docs/data/guest_counters_v17/vmsample.log.gz
"""
from __future__ import annotations

import gzip
import statistics
import sys

from forward_ms import request_ms  # benchmarks/forward_ms.py

from draftwise.bench.results import Results

REF = ("plain", "ngram:2", "ngram:4", "ngram:8", "model:2", "model:4")


def load(path: str) -> list[tuple[float, list[int], list[int], int]]:
    out = []
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        for line in f:
            t, cpu, vm, khp = line.split("|")
            out.append((float(t), [int(x) for x in cpu.split()[1:]], [int(x) for x in vm.split()], int(khp)))
    return out


def rates(samples, a: float, b: float) -> dict[str, float] | None:
    """Per second between the first and last sample inside [a, b]."""
    xs = [s for s in samples if a <= s[0] <= b]
    if len(xs) < 2:
        return None
    (t0, c0, v0, k0), (t1, c1, v1, k1) = xs[0], xs[-1]
    dt = t1 - t0
    c = [(y - x) / dt for x, y in zip(c0, c1)]
    v = [(y - x) / dt for x, y in zip(v0, v1)]  # pgfault, pgmajfault, compact_stall, thp_fault, thp_collapse
    return {"user": c[0], "sys": c[2], "steal": c[7], "pgfault": v[0], "compact": v[2], "thp_fault": v[3],
            "thp_collapse": v[4], "khugepaged": (k1 - k0) / dt}


def main(run: str, repeat: int, log: str) -> None:
    samples = load(log)
    rows = [r for r in Results.load(run).requests.values() if r["repeat"] == repeat]
    ms = {(k[1], k[3]): v for k, v in request_ms(run).items() if k[2] == repeat}  # (prompt, config)
    for r in sorted(rows, key=lambda r: r["started_unix"]):
        d = rates(samples, r["started_unix"], r["started_unix"] + r["e2e_s"])
        if d is None:
            continue
        own = ms[(r["prompt_id"], r["config"])]
        ref = statistics.median(ms[(r["prompt_id"], c)] for c in REF if (r["prompt_id"], c) in ms)
        print(f"{r['prompt_id'][:14]:14} {r['config']:11} {own:5.0f} {own / ref:5.2f}  "
              + " ".join(f"{k}={v:.0f}" for k, v in d.items()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
