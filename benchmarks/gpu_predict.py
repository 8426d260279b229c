"""Predicted speedup per fixed D on the H200 curves (docs/data/gpu_curves_h200.json) for the
acceptance measured on the CPU with the real models (docs/data/core_torch.jsonl): what the planner
would expect on that GPU. Forward costs only (no per-round Python overhead, no prefill).

    .venv/bin/python benchmarks/gpu_predict.py
"""
import json

import numpy as np

from draftwise.planner import CostCurve, Planner
from draftwise.profile import ProfileResult
from draftwise.stats import SpecStats, aggregate


def curve(doc, name):
    return CostCurve.from_profile(ProfileResult(**doc["curves"][name]))


def alpha(cfg: str, path="docs/data/core_torch.jsonl", n=16) -> tuple[np.ndarray, float]:
    rows = [json.loads(line) for line in open(path)]
    st = aggregate([SpecStats(**{k: v for k, v in r["stats"].items() if k in SpecStats.__slots__})
                    for r in rows if r["config"] == cfg])
    acc, prop = np.array(st.accepted_per_position, float), np.array(st.proposed_per_position, float)
    reached = np.minimum(np.concatenate([[prop[0]], acc[:-1]]), prop)
    a = acc / np.maximum(reached, 1)
    share = st.verification_rounds / max(st.verification_rounds + st.plain_steps - st.requests, 1)
    return np.concatenate([a, np.full(n - len(a), a[-1])])[:n], share


def main() -> None:
    doc = json.load(open("docs/data/gpu_curves_h200.json"))
    target, draft = curve(doc, "qwen2.5-coder-1.5b"), curve(doc, "qwen2.5-coder-0.5b")
    print(f"H200, bf16, HF eager: 1.5B k=1 {1e3 * target(1):.1f} ms, k=8 {1e3 * target(8):.1f} ms, "
          f"k=16 {1e3 * target(16):.1f} ms; 0.5B k=1 {1e3 * draft(1):.1f} ms "
          f"({draft(1) / target(1):.2f} of a target step)")
    for label, cfg, dcurve in (("0.5B draft, HumanEval", "dw_model_d4", draft),
                               ("n-gram, EditEval", "dw_ngram_d10", None)):
        a, share = alpha(cfg)
        pl = Planner(target, dcurve, prior=0.5, max_draft=16)
        pred = pl.predicted_speedup(a)
        if dcurve is None:  # steps without an n-gram match are plain steps
            pred = {d: 1 / (share / v + (1 - share)) for d, v in pred.items()}
        best = max(pred, key=pred.get)
        print(f"{label}: alpha_1..4 = {np.round(a[:4], 2).tolist()}; predicted speedup "
              + ", ".join(f"D={d} {pred[d]:.2f}x" for d in (1, 2, 4, 8, 16)) + f"; best D={best} ({pred[best]:.2f}x)")


if __name__ == "__main__":
    main()
