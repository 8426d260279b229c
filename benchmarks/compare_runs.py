"""Two `draftwise bench` results directories of the same prompts, run back to back (an older
checkout's and a newer one's): each configuration's speedup over *its own run's* plain decoding,
end to end and after the first token, per category, with bootstrap 95% intervals, and the newer
over the older. A ratio of ratios across two runs: noisier than side by side, so the intervals
are printed with it.

    .venv/bin/python benchmarks/compare_runs.py results/old results/new > docs/data/<run>/compare.md
"""
from __future__ import annotations

import argparse

from draftwise.bench.summary import summarise


def _ci(point, lo, hi) -> str:
    if point is None:
        return "-"
    return f"{point:.2f}" if lo is None else f"{point:.2f} [{lo:.2f}, {hi:.2f}]"


def _rows(path: str) -> dict[tuple[str, str], object]:
    return {(r.scope, r.config): r for r in summarise(path).rows
            if r.concurrency == 1 and not r.scope.startswith("bucket:")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--names", nargs=2, default=("old", "new"))
    a = ap.parse_args()
    old, new = _rows(a.old), _rows(a.new)
    keys = [k for k in new if k in old and k[1] != "plain"]
    keys.sort(key=lambda k: (k[0] == "all", k[0], k[1]))
    o, n = a.names
    print(f"| scope | config | {o} e2e | {n} e2e | {n}/{o} | {o} after 1st token | {n} after 1st token |")
    print("|---|---|---|---|---|---|---|")
    for k in keys:
        ro, rn = old[k], new[k]
        ratio = f"{rn.speedup / ro.speedup:.3f}" if ro.speedup and rn.speedup else "-"
        print(f"| {k[0].removeprefix('category:')} | {k[1]} ({rn.prompts} prompts) "
              f"| {_ci(ro.speedup, ro.speedup_lo, ro.speedup_hi)} | {_ci(rn.speedup, rn.speedup_lo, rn.speedup_hi)} "
              f"| {ratio} | {_ci(ro.decode_speedup, ro.decode_speedup_lo, ro.decode_speedup_hi)} "
              f"| {_ci(rn.decode_speedup, rn.decode_speedup_lo, rn.decode_speedup_hi)} |")


if __name__ == "__main__":
    main()
