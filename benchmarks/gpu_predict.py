"""Predicted speedup per fixed D on the H200 curves (docs/data/gpu_curves_h200.json, from
benchmarks/gpu_check.py) for the acceptance measured on the CPU with the real models
(docs/data/core_torch_packed.jsonl, from benchmarks/core.py torch) and, for the packaged head, its
acceptance per position on the plain outputs (docs/data/head_llama10/teacher_forced.json): what the
planner would expect on that GPU, and the acceptance a head would need there for 1.8x and 2.0x.
Forward costs only (no per-round Python overhead, no prefill).

    .venv/bin/python benchmarks/gpu_predict.py
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from draftwise.costs import CostCurve
from draftwise.planner import Planner
from draftwise.profile import ProfileResult
from draftwise.stats import SpecStats, aggregate


def curve(doc: dict, name: str) -> CostCurve:
    return CostCurve.from_profile(ProfileResult(**doc["curves"][name]))


def alpha(cfg: str, path: str = "docs/data/core_torch_packed.jsonl", n: int = 16) -> tuple[np.ndarray, float]:
    """Conditional acceptance per position of one configuration's rows, and its share of
    verification rounds among decode steps."""
    rows = [json.loads(line) for line in open(path)]
    st = aggregate([SpecStats(**{k: v for k, v in r["stats"].items() if k in SpecStats.__slots__})
                    for r in rows if r["config"] == cfg])
    acc, prop = np.array(st.accepted_per_position, float), np.array(st.proposed_per_position, float)
    reached = np.minimum(np.concatenate([[prop[0]], acc[:-1]]), prop)
    a = acc / np.maximum(reached, 1)
    share = st.verification_rounds / max(st.verification_rounds + st.plain_steps - st.requests, 1)
    return np.concatenate([a, np.full(n - len(a), a[-1])])[:n], share


def head_lines(doc: dict, target: CostCurve, path: str) -> None:
    """The packaged head on the H200 curves: verification with features, one head forward per token."""
    if "qwen2.5-coder-1.5b-head" not in doc["curves"]:
        return
    verify, head = curve(doc, "qwen2.5-coder-1.5b+features"), curve(doc, "qwen2.5-coder-1.5b-head")
    print(f"head: k=1 {1e3 * head(1):.2f} ms ({head(1) / target(1):.3f} of a target step); target with "
          f"features k=1 {1e3 * verify(1):.1f} ms")
    pl = Planner(verify, head, prior=0.5, max_draft=16)
    scale = target(1) / verify(1)  # against plain decoding, which returns no features

    def pred(al) -> dict[int, float]:
        al = list(al) + [al[-1]] * (16 - len(al))
        return {d: v * scale for d, v in pl.predicted_speedup(np.array(al[:16])).items()}

    tf = json.load(open(path))["teacher_forced"]
    for cat in ("humaneval", "all"):
        al = tf[cat]["acceptance_per_position"]
        p = pred(al)
        best = max(p, key=p.get)
        print(f"head, {cat}: alpha_1..3 = {np.round(al, 2).tolist()}; predicted speedup "
              + ", ".join(f"D={d} {p[d]:.2f}x" for d in (1, 2, 3, 4, 8)) + f"; best D={best} ({p[best]:.2f}x)")
    for bar in (1.8, 2.0):
        need = next((a for a in np.arange(0.05, 1.0, 0.01) if max(pred([a]).values()) >= bar), None)
        print(f"head needs alpha >= {need:.2f} at every position for {bar}x" if need else f"no alpha < 1 gives {bar}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curves", default="docs/data/gpu_curves_h200.json")
    ap.add_argument("--rows", default="docs/data/core_torch_packed.jsonl")
    ap.add_argument("--head-acceptance", default="docs/data/head_llama10/teacher_forced.json")
    a = ap.parse_args(argv)
    doc = json.load(open(a.curves))
    target, draft = curve(doc, "qwen2.5-coder-1.5b"), curve(doc, "qwen2.5-coder-0.5b")
    print(f"H200, bf16, HF eager: 1.5B k=1 {1e3 * target(1):.1f} ms, k=8 {1e3 * target(8):.1f} ms, "
          f"k=16 {1e3 * target(16):.1f} ms; 0.5B k=1 {1e3 * draft(1):.1f} ms "
          f"({draft(1) / target(1):.2f} of a target step)")
    for label, cfg, dcurve in (("0.5B draft, HumanEval", "dw_model_d4", draft),
                               ("n-gram, EditEval", "dw_ngram_d10", None)):
        al, share = alpha(cfg, a.rows)
        pl = Planner(target, dcurve, prior=0.5, max_draft=16)
        pred = pl.predicted_speedup(al)
        if dcurve is None:  # steps without an n-gram match are plain steps
            pred = {d: 1 / (share / v + (1 - share)) for d, v in pred.items()}
        best = max(pred, key=pred.get)
        print(f"{label}: alpha_1..4 = {np.round(al[:4], 2).tolist()}; predicted speedup "
              + ", ".join(f"D={d} {pred[d]:.2f}x" for d in (1, 2, 4, 8, 16)) + f"; best D={best} ({pred[best]:.2f}x)")
    head_lines(doc, target, a.head_acceptance)


if __name__ == "__main__":
    main()
