"""Per-round trace of `auto`: what the planner chose and predicted against what the round cost.

    .venv/bin/python benchmarks/diag_planner.py --backend torch --workload writing --n 3 --max-tokens 64

Prints one line per round (D planned, catch-up, proposed, draft forwards, accepted, predicted vs
measured draft and verify seconds) and per-request totals: where the planner's prediction errs."""
import argparse
import time

from draftwise.build import EngineSpec, build_engine
from draftwise.prompts import load_workload, sample


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--drafter", default="model")
    ap.add_argument("--workload", default="writing")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    eng, runner, tok = build_engine(EngineSpec(drafter=a.drafter, backend=a.backend, threads=a.threads))
    pl = eng.planner
    log = []
    plan0, commit0, obs0 = pl.plan, pl.commit, pl.observe_times

    def plan(req, n_seqs=1, available=None, behind=1):
        p = plan0(req, n_seqs, available, behind)
        log.append({"d": p.d, "behind": behind, "probe": p.probe, "E": p.tokens,
                    "pred_draft": pl.draft_cost(p.d, behind), "pred_verify": pl.verify(p.d + 1),
                    "conf": [] if p.stop is None else
                    [f"{a:.2f}/{b:.2f}" for a, b in zip(p.stop.keep, p.stop.go_on)] + [f"{p.stop.keep[-1]:.2f}"]})
        return p

    def observe_times(k, n_seqs, forward_s, d, behind, draft_s, overhead_s):
        log[-1].update(k=k, fwd=forward_s, forwards=d, draft_s=draft_s)
        obs0(k, n_seqs, forward_s, d, behind, draft_s, overhead_s)

    def commit(req, p, proposed, accepted, emitted, *rest):
        log[-1].update(proposed=proposed, accepted=accepted, emitted=emitted)
        commit0(req, p, proposed, accepted, emitted, *rest)

    pl.plan, pl.commit, pl.observe_times = plan, commit, observe_times
    prompts = sample(load_workload(a.workload), a.n)
    for pr in prompts:
        ids = pr.token_ids(tok)
        plain_t = time.perf_counter()
        eng.generate(ids, max_tokens=a.max_tokens, num_draft_tokens=0)
        plain_t = time.perf_counter() - plain_t
        log.clear()
        t = time.perf_counter()
        r = eng.generate(ids, max_tokens=a.max_tokens)
        t = time.perf_counter() - t
        print(f"\n{pr.id}: plain {plain_t:.2f}s auto {t:.2f}s ({plain_t / t:.2f}x); predicted "
              f"{r.stats.predicted_plain_s / max(r.stats.predicted_s, 1e-9):.2f}x")
        print("  d beh probe   E  prop fwd acc | draft pred/meas ms | verify k pred/meas ms | keep/go_on bars")
        for x in log:
            if "k" not in x:
                continue
            print(f"{x['d']:3d} {x['behind']:3d} {int(x['probe']):5d} {x['E']:4.2f} {x.get('proposed', 0):4d} "
                  f"{x['forwards']:3d} {x.get('accepted', 0):3d} | {1e3 * x['pred_draft']:7.0f} "
                  f"{1e3 * x['draft_s']:7.0f} | {x['k']:3d} {1e3 * x['pred_verify']:6.0f} {1e3 * x['fwd']:6.0f} | "
                  + " ".join(x["conf"]))
        tot = {k: sum(x.get(k, 0) for x in log if "k" in x) for k in ("pred_draft", "draft_s", "pred_verify", "fwd")}
        print("  totals s:", {k: round(v, 2) for k, v in tot.items()}, "scale draft/verify",
              round(pl.draft.scale if pl.draft else 0, 2), round(pl.verify.scale, 2))


if __name__ == "__main__":
    main()
