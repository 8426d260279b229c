"""Absolute tokens per second of two runs of one matrix, per category: plain decoding and the
fastest configuration of each run (from each run's summary.csv), and their ratios.

    .venv/bin/python benchmarks/abs_speed.py docs/data/planner_torch_v15r2 docs/data/planner_torch_v16
"""
from __future__ import annotations

import sys

from run_noise import summary_field  # benchmarks/run_noise.py


def main(a_run: str, b_run: str) -> None:
    a, b = summary_field(a_run, "tokens_per_s"), summary_field(b_run, "tokens_per_s")
    scopes = [s for s in dict.fromkeys(k[0] for k in b) if s.startswith("category:")] + ["all"]
    print(f"{'category':15}{'plain A':>9}{'plain B':>9}{'B/A':>6}   {'fastest A':>20}   {'fastest B':>20}{'B/A':>6}")
    for s in scopes:
        pa, pb = a[(s, "plain")], b[(s, "plain")]
        fa = max((v, k[1]) for k, v in a.items() if k[0] == s)
        fb = max((v, k[1]) for k, v in b.items() if k[0] == s)
        print(f"{s.removeprefix('category:'):15}{pa:9.2f}{pb:9.2f}{pb / pa:6.2f}   {fa[0]:6.2f} ({fa[1]:>11})"
              f"   {fb[0]:6.2f} ({fb[1]:>11}){fb[0] / fa[0]:6.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
