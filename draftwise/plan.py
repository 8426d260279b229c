"""`draftwise plan`: measured curves -> predicted speedup per D -> chosen policy -> measured speedup.

Prediction is a replay: a pilot run at the largest D records, per verification round, how many
tokens the drafter proposed (L_r) and how many the target accepted (a_r). A draft at a smaller D
proposes a prefix of the same tokens (n-gram lookup and greedy drafting are prefix-consistent),
so at D the round would emit min(a_r, D) + 1 tokens and cost draft(min(L_r, D)) + verify(min(L_r,
D) + 1) on the measured curves. Steps without a proposal stay plain steps. Later rounds would start
at other positions; the replay ignores that, which is why the measured run follows.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from draftwise.engine import Engine
from draftwise.request import GenerationResult
from draftwise.planner import Planner


@dataclass(slots=True)
class Pilot:
    rounds: list[tuple[int, int]]  # (proposed, accepted) per verification round
    plain_steps: int  # steps after the first token without a proposal
    max_draft: int
    draft_s_per_step: float = 0.0  # measured drafting time per decode step
    other_s_per_step: float = 0.0  # measured bookkeeping per decode step
    prefill_s: float = 0.0  # mean measured prefill per prompt


def pilot(engine: Engine, prompts: list[list[int]], max_tokens: int) -> Pilot:
    """Greedy runs at the engine's fixed D, keeping each round's (proposed, accepted)."""
    rounds, plain, draft_s, other_s, prefill_s = [], 0, 0.0, 0.0, 0.0
    for ids in prompts:
        r: GenerationResult = engine.generate(ids, max_tokens=max_tokens)
        rounds += [(x.proposed, x.accepted) for x in r.rounds]
        plain += r.stats.plain_steps - 1  # the prefill step is not a decode step
        draft_s, other_s = draft_s + r.stats.draft_s, other_s + r.stats.other_s
        prefill_s += r.stats.prefill_s
    steps = max(len(rounds) + plain, 1)
    return Pilot(rounds, plain, engine.num_draft_tokens, draft_s / steps, other_s / steps,
                 prefill_s / max(len(prompts), 1))


def calibrate(planner: Planner, p: Pilot) -> None:
    """A cheap drafter's call time and the per-step bookkeeping, as measured in the pilot."""
    if planner.draft is None:
        planner.draft_call_s = p.draft_s_per_step
    planner.overhead_s = p.other_s_per_step


def predict(planner: Planner, p: Pilot, max_tokens: int | None = None) -> dict[int, float]:
    """Predicted speedup over plain decoding for each fixed D in 0..pilot D (replay, above); with
    max_tokens, end to end for requests of that many tokens (the pilot's mean prefill included)."""
    t1 = planner.verify(1) + planner.overhead_s
    out = {}
    for d in range(0, p.max_draft + 1):
        tokens, time = float(p.plain_steps), p.plain_steps * t1
        for proposed, accepted in p.rounds:
            k = min(proposed, d)
            tokens += min(accepted, d) + 1
            time += planner.draft_cost(k) + planner.verify(k + 1) + planner.overhead_s if k else t1
        out[d] = (tokens / time) * t1 if time > 0 else 1.0
        if max_tokens is not None:  # prefill + max_tokens decode steps, plain vs at this rate
            out[d] = (p.prefill_s + max_tokens * t1) / (p.prefill_s + max_tokens * t1 / out[d])
    return out


def curves_text(planner: Planner, max_k: int = 17) -> str:
    lines = ["k   verify ms" + ("   draft ms" if planner.draft is not None else "")]
    for k in range(1, max_k + 1):
        row = f"{k:<3} {1e3 * planner.verify(k):9.1f}"
        if planner.draft is not None:
            row += f"  {1e3 * planner.draft(k):9.1f}"
        lines.append(row)
    if planner.draft is None:
        lines.append(f"drafter: {1e3 * planner.draft_call_s:.2f} ms per proposal (measured in the pilot)")
    return "\n".join(lines)


def hardware() -> dict:
    from draftwise.machine import cpu_model

    import os

    return {"cpu": cpu_model() or platform.processor(), "cores": os.cpu_count(), "machine": platform.machine(),
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def engine_configs(drafter: str, d: int, draft_model: str | None, ngram: tuple[int, int], target: str) -> dict:
    """The setting as a vLLM --speculative-config JSON and as SGLang flags (D = 0: speculation off)."""
    if d == 0:
        return {"vllm": None, "sglang": "", "note": "speculation does not pay here: serve without it"}
    if drafter == "ngram":
        vllm = {"method": "ngram", "num_speculative_tokens": d, "prompt_lookup_min": ngram[0],
                "prompt_lookup_max": ngram[1]}
        sglang = f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {d + 1}"
    else:
        vllm = {"method": "draft_model", "model": draft_model, "num_speculative_tokens": d}
        sglang = (f"--speculative-algorithm STANDALONE --speculative-draft-model-path {draft_model} "
                  f"--speculative-num-steps {d} --speculative-eagle-topk 1 --speculative-num-draft-tokens {d + 1}")
    return {"vllm": vllm, "sglang": sglang, "target": target}


def write_predictions(out_dir: Path, planner: Planner, pred: dict[int, float], p: Pilot, meta: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    best = max(pred, key=pred.get)
    doc = {"kind": "plan-prediction", "hardware": hardware(), **meta,
           "curves_ms": {"verify": [1e3 * planner.verify(k) for k in range(1, 18)],
                         "draft": [1e3 * planner.draft(k) for k in range(1, 18)] if planner.draft else None},
           "pilot": {"rounds": len(p.rounds), "plain_steps": p.plain_steps, "max_draft": p.max_draft},
           "predicted_speedup": {str(d): v for d, v in pred.items()}, "best_fixed_d": best}
    path = out_dir / "plan_predictions.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def save_engine_configs(out_dir: Path, cfgs: dict) -> list[Path]:
    label = hardware()
    paths = []
    if cfgs["vllm"] is not None:
        paths.append(out_dir / "vllm_speculative_config.json")
        paths[-1].write_text(json.dumps(cfgs["vllm"]) + "\n")
    paths.append(out_dir / "engine_settings.json")
    paths[-1].write_text(json.dumps({"measured_on": label, **cfgs}, indent=1) + "\n")
    return paths
