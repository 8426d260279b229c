"""Markdown table of saved `draftwise profile` curves: ms per forward of k new tokens (logits at
all k), one row per curve and batch size, with the ratio to k = 1 of the same batch size.

    .venv/bin/python benchmarks/profile_table.py docs/data/profile_*_method2_xeon.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from draftwise.profile import ProfileResult


def table(results: dict[str, ProfileResult]) -> str:
    """One markdown table over every curve (name -> profile), k as columns."""
    ks = sorted({r["k"] for res in results.values() for r in res.rows})
    lines = ["| curve | b | " + " | ".join(f"k={k}" for k in ks) + " |", "|---" * (len(ks) + 2) + "|"]
    for name, res in results.items():
        for b in sorted({r["batch"] for r in res.rows}):
            base = res.ms(b, 1)
            cells = [f"{res.ms(b, k):.0f} ({res.ms(b, k) / base:.2f}×)" for k in ks]
            lines.append(f"| {name} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="JSON files written by `draftwise profile --out`")
    a = ap.parse_args(argv)
    print(table({Path(p).stem.removeprefix("profile_"): ProfileResult.load(p) for p in a.profiles}))


if __name__ == "__main__":
    main()
