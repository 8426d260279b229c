"""What the running planner predicted against what its steps measured, per category, from the
per-step plan log of a bench run's `auto` rows (GenerationResult.plans: D planned, proposed,
catch-up tokens, predicted ms, measured ms, one draft step's ms as the planner then priced it):

- steps, plain share, resumes (a round after a plain step, past the request's first round) and the
  mean tokens caught up at a resume;
- measured / predicted time (median) of plain steps, of rounds by tokens proposed, of rounds an
  early stop cut short (priced at D planned), and of rounds that caught up on more than the two
  tokens a fully accepted round leaves;
- the planner's price of one draft step at the category's first and last step.

    .venv/bin/python benchmarks/plan_log.py docs/data/planner_torch_v12 model:auto
"""
import statistics
import sys
from collections import defaultdict

from draftwise.bench.results import Results


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}" if xs else "  - "


def main(run: str, config: str) -> None:
    cats = defaultdict(list)  # category -> [plans of each request, in run order]
    for r in Results.load(run).requests.values():
        if r["config"] == config and r.get("plans"):
            cats[r["category"]].append(r["plans"])
    print(f"{'category':14} {'steps':>5} {'plain':>6} {'resumes':>7} {'caught up':>9}  meas/pred: "
          f"{'plain':>5} {'k<=2':>5} {'k3-4':>5} {'k5-8':>5} {'k>8':>5} {'cut':>5} {'catch-up':>8}  draft ms first/last")
    for cat, reqs in cats.items():
        steps = [s for p in reqs for s in p]
        ratio = defaultdict(list)
        resumes, behind = 0, []
        for p in reqs:
            first = next((i for i, s in enumerate(p) if s[1] > 0), None)
            for i, (d, prop, b, pred, meas, _) in enumerate(p):
                if prop == 0:
                    ratio["plain"].append(meas / pred)
                    continue
                if b > 2:
                    ratio["catch"].append(meas / pred)
                    if i != first and p[i - 1][1] == 0:
                        resumes += 1
                        behind.append(b)
                    continue
                if prop < d:  # an early stop: priced as d, ran fewer
                    ratio["cut"].append(meas / pred)
                    continue
                ratio["k<=2" if prop <= 2 else "k3-4" if prop <= 4 else "k5-8" if prop <= 8 else "k>8"].append(meas / pred)
        plain = sum(s[1] == 0 for s in steps)
        cu = f"{statistics.mean(behind):.1f}" if behind else "-"
        print(f"{cat:14} {len(steps):5} {plain / len(steps):6.2f} {resumes:7} {cu:>9}  {'':10} "
              + " ".join(f"{_med(ratio[k]):>5}" for k in ("plain", "k<=2", "k3-4", "k5-8", "k>8", "cut"))
              + f" {_med(ratio['catch']):>8}  {steps[0][5]:.0f} / {steps[-1][5]:.0f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
