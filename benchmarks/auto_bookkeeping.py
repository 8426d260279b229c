"""The engine's own cost per step of `auto` with a draft model that never pays, against plain
decoding, with a model that costs nothing: a runner returning fixed logits over Qwen's vocabulary
(151,936), so what is left is the engine loop, the planner (plan, commit, online update) and the
target's top probability at each step. Three alternating repeats of 400 steps each.

    .venv/bin/python benchmarks/auto_bookkeeping.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakes import CharTokenizer, CycleRunner  # noqa: E402

from draftwise.drafters.model import ModelDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.planner import CostCurve, Planner  # noqa: E402

VOCAB, STEPS = 151936, 400


class FixedLogits(CycleRunner):
    """Next token after t is (t + 1) % 5; each row a fixed random vector over the vocabulary."""

    def __init__(self):
        super().__init__(vocab=VOCAB, period=5, max_context=4096)
        self.rows = [torch.randn(VOCAB) for _ in range(5)]
        for t, row in enumerate(self.rows):
            row[(t + 1) % 5] = 30.0

    def logits_after(self, t):
        return self.rows[t % 5]


def main() -> None:
    target = CostCurve({1: [94, 127, 161, 196, 224, 251, 275, 287, 288, 291, 292, 288, 296, 300, 303, 308, 397]})
    draft = CostCurve({1: [90.0] * 17})  # a draft step as dear as a target step: drafting never pays
    for _ in range(3):
        for name in ("plain", "auto"):
            if name == "plain":
                eng = Engine(FixedLogits(), CharTokenizer())
            else:
                eng = Engine(FixedLogits(), CharTokenizer(), ModelDrafter(FixedLogits()), "auto",
                             planner=Planner(target, draft, prior=0.5, max_draft=16))
            t = time.perf_counter()
            r = eng.generate([1, 2, 3, 4], max_tokens=STEPS)
            ms = 1e3 * (time.perf_counter() - t) / STEPS
            print(f"{name:6} {ms:.3f} ms per step  (rounds: {r.stats.verification_rounds})")


if __name__ == "__main__":
    main()
