"""Run-to-run noise of a benchmark matrix: two runs of the same prompts and configurations (each
speedup against its own run's plain decoding), per category and configuration the ratio of the
second run's speedup to the first's, and the spread (sd of log ratio) over the fixed-D cells,
whose code did not change between the runs — what the noise allows a one-run comparison.

    .venv/bin/python benchmarks/run_noise.py docs/data/planner_torch_v14 docs/data/planner_torch_v15
"""
from __future__ import annotations

import csv
import math
import statistics
import sys


def summary_field(run: str, field: str) -> dict[tuple[str, str], float]:
    """One numeric column of a run's summary.csv, by (scope, configuration); empty cells left out."""
    with open(f"{run}/summary.csv") as f:
        return {(r["scope"], r["config"]): float(r[field]) for r in csv.DictReader(f) if r[field]}


def speedups(run: str) -> dict[tuple[str, str], float]:
    return {(s.removeprefix("category:"), c): v for (s, c), v in summary_field(run, "speedup").items()
            if s.startswith("category:") and c != "plain"}


def main(first: str, second: str) -> None:
    a, b = speedups(first), speedups(second)
    cells = [k for k in a if k in b]
    cats = list(dict.fromkeys(c for c, _ in cells))
    cfgs = sorted({g for _, g in cells}, key=lambda g: (g.split(":")[0], g.endswith("auto"), g))
    print(f"# speedup in {second} / speedup in {first}")
    print(f"{'category':14}" + "".join(f"{g:>12}" for g in cfgs))
    for c in cats:
        print(f"{c:14}" + "".join(f"{b[(c, g)] / a[(c, g)]:12.2f}" if (c, g) in a and (c, g) in b else f"{'-':>12}"
                                  for g in cfgs))
    logs = [math.log(b[k] / a[k]) for k in cells if not k[1].endswith("auto")]
    print(f"fixed-D cells: {len(logs)}, sd of log ratio {statistics.pstdev(logs):.3f}, "
          f"largest |log ratio| {max(abs(x) for x in logs):.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
