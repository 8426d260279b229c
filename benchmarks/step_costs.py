"""Where a run's time went, per category and configuration, summed over its requests (all repeats):
wall, prefill, drafting and verification seconds, rounds, plain steps, proposed and accepted
draft tokens, ms per target forward after the prefill (verification rounds and plain steps alike)
and drafting ms per proposed token; then, for an `auto` configuration, its steps by how many draft
tokens they proposed (a round verifies one more; 0: a plain step or a draft dropped whole), with
their median measured ms (rounds catching up on more than 2 tokens left out).

    .venv/bin/python benchmarks/step_costs.py docs/data/planner_torch_v15 model
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from draftwise.bench.results import Results

def ms_per_forward(verify_s: float, rounds: float, plain_steps: float, requests: float = 1) -> float:
    """Verification ms per target forward after the prefill, over `requests` requests' totals: each
    request's first token is counted as a plain step but comes from the prefill's forward."""
    return 1000 * verify_s / max(rounds + plain_steps - requests, 1)


KEYS = ("requests", "wall_s", "prefill_s", "draft_s", "verify_s", "verification_rounds", "plain_steps",
        "proposed_tokens", "accepted_draft_tokens")


def main(run: str, drafter: str) -> None:
    reqs = list(Results.load(run).requests.values())  # one row per request key, as the summary reads them
    cats = list(dict.fromkeys(r["category"] for r in reqs))
    cfgs = ["plain"] + sorted({r["config"] for r in reqs if r["config"].startswith(drafter + ":")})
    tot: dict = defaultdict(lambda: defaultdict(float))
    for r in reqs:
        for k in KEYS:
            tot[(r["category"], r["config"])][k] += r["stats"][k] if k != "requests" else 1
    print(f"{'category':14} {'config':11} {'wall':>6} {'pre':>5} {'draft':>6} {'verify':>6} {'rounds':>6} "
          f"{'plain':>5} {'prop':>5} {'acc':>5}  ms/forward  draft ms/token")
    for c in cats:
        for g in cfgs:
            a = tot[(c, g)]
            print(f"{c:14} {g:11} {a['wall_s']:6.1f} {a['prefill_s']:5.1f} {a['draft_s']:6.1f} {a['verify_s']:6.1f} "
                  f"{a['verification_rounds']:6.0f} {a['plain_steps']:5.0f} {a['proposed_tokens']:5.0f} "
                  f"{a['accepted_draft_tokens']:5.0f}  {ms_per_forward(a['verify_s'], a['verification_rounds'], a['plain_steps'], a['requests']):10.0f}  "
                  f"{1000 * a['draft_s'] / max(a['proposed_tokens'], 1):13.0f}")
    auto = f"{drafter}:auto"
    print(f"\n{auto} steps by draft tokens proposed (0: a plain step or a draft dropped whole): count x median ms")
    for c in cats:
        ms: dict = defaultdict(list)
        for r in reqs:
            if r["config"] == auto and r["category"] == c:
                for p in r.get("plans") or []:  # [planned D, proposed, behind, predicted ms, measured ms, ...]
                    if p[2] <= 2:
                        ms[p[1]].append(p[4])
        print(f"{c:14} " + "  ".join(f"{k}: {len(v)} x {statistics.median(v):.0f}" for k, v in sorted(ms.items())))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "model")
