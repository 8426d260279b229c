"""Markdown table of saved `draftwise profile` curves: ms per forward of k new tokens (logits at
all k) for each batch size, and the ratio to k = 1.

    .venv/bin/python benchmarks/profile_table.py results/profile_*.json
"""
from __future__ import annotations

import sys
from pathlib import Path

from draftwise.profile import ProfileResult


def main(paths: list[str]) -> None:
    for path in paths:
        res = ProfileResult.load(path)
        ks = sorted({r["k"] for r in res.rows})
        batches = sorted({r["batch"] for r in res.rows})
        print(f"**{Path(path).stem}** ({res.backend}, context {res.context_len}, median of {res.repeats})\n")
        print("| b \\ k | " + " | ".join(str(k) for k in ks) + " |")
        print("|---" * (len(ks) + 1) + "|")
        for b in batches:
            base = res.ms(b, 1)
            cells = [f"{res.ms(b, k):.0f} ({res.ms(b, k) / base:.2f}×)" for k in ks]
            print(f"| {b} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
