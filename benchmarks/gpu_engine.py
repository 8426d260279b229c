"""End to end on a CUDA GPU: plain vs speculative decoding through the engine, Qwen2.5-Coder-1.5B and
-0.5B *architectures* with random weights (no real weights reach the GPU machine), bf16.

Random weights make acceptance meaningless as a property of the models, so this measures the
engine and the planner, not the drafters: with the n-gram drafter the random target falls into
repeating loops that prompt lookup copies (high acceptance), and a random 0.5B draft agrees with
the random target almost never (the planner should stop drafting with it). Greedy outputs are
compared with plain decoding.

    python benchmarks/gpu_engine.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from draftwise.backends.torch_runner import TorchRunner
from draftwise.build import PRIORS
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.planner import CostCurve, Planner
from draftwise.profile import profile_runner

from gpu_check import ARCH, Ids


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test with tiny shapes


def model(name: str, seed: int) -> TorchRunner:
    torch.manual_seed(seed)
    kw = ARCH[name] if DEVICE == "cuda" else dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=6000)
    m = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=4096, **kw))
    return TorchRunner(m.to(torch.bfloat16) if DEVICE == "cuda" else m, device=DEVICE)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    target, draft = model("qwen2.5-coder-1.5b", 0), model("qwen2.5-coder-0.5b", 1)
    curve = lambda r: CostCurve.from_profile(profile_runner(r, range(1, 18), (1,), 256, repeats=3))  # noqa: E731
    t_curve, d_curve = curve(target), curve(draft)
    engines = {
        "plain": Engine(target, Ids()),
        "ngram:4": Engine(target, Ids(), NgramDrafter(), 4),
        "ngram:16": Engine(target, Ids(), NgramDrafter(), 16),
        "ngram:auto": Engine(target, Ids(), NgramDrafter(), "auto",
                             planner=Planner(t_curve, None, prior=PRIORS["ngram"])),
        "model:4": Engine(target, Ids(), ModelDrafter(draft), 4),
        "model:auto": Engine(target, Ids(), ModelDrafter(draft), "auto",
                             planner=Planner(t_curve, d_curve, prior=PRIORS["model"])),
    }
    prompts = [[(7 * i + j) % 5000 + 100 for j in range(64)] for i in range(4)]
    for e in engines.values():  # warm-up: kernels, allocator, the planners' first estimates
        e.generate(prompts[0], max_tokens=16)
    rows = []
    for i, p in enumerate(prompts):
        for name, e in engines.items():
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = e.generate(p, max_tokens=a.max_tokens)
            dt = time.perf_counter() - t0
            rows.append({"prompt": i, "config": name, "seconds": dt, "tokens": r.token_ids,
                         "stats": r.stats.to_dict()})
    out = {"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else None, "torch": torch.__version__, "max_tokens": a.max_tokens,
           "rows": rows, "summary": {}}
    base = {r["prompt"]: r for r in rows if r["config"] == "plain"}
    for name in engines:
        mine = [r for r in rows if r["config"] == name]
        t = sum(r["seconds"] for r in mine)
        n = sum(len(r["tokens"]) for r in mine)
        tb = sum(base[r["prompt"]]["seconds"] for r in mine)
        nb = sum(len(base[r["prompt"]]["tokens"]) for r in mine)
        st = [r["stats"] for r in mine]
        prop = sum(s["proposed_tokens"] for s in st)
        out["summary"][name] = {
            "tokens_per_s": n / t, "speedup": (tb / nb) / (t / n),
            "identical": all(r["tokens"] == base[r["prompt"]]["tokens"] for r in mine),
            "acceptance_rate": sum(s["accepted_draft_tokens"] for s in st) / prop if prop else None,
            "rounds": sum(s["verification_rounds"] for s in st), "plain_steps": sum(s["plain_steps"] for s in st)}
    print(json.dumps(out["summary"], indent=1))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu_engine.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
