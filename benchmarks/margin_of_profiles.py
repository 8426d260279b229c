"""The draft model's planner margin (draftwise.build.margin_for) on a pair of cached profiles, with
the one-token costs it is derived from.

    .venv/bin/python benchmarks/margin_of_profiles.py TARGET_PROFILE DRAFT_PROFILE [TARGET DRAFT ...]
"""
from __future__ import annotations

import sys

from draftwise.build import margin_for
from draftwise.planner import CostCurve
from draftwise.profile import ProfileResult


def main(paths: list[str]) -> None:
    for tp, dp in zip(paths[::2], paths[1::2]):
        v, d = (CostCurve.from_profile(ProfileResult.load(p)) for p in (tp, dp))
        print(f"{tp}\n  draft k=1 {1e3 * d.raw(1):.1f} ms, target k=1 {1e3 * v.raw(1):.1f} ms, "
              f"margin_for {margin_for(v, d):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
