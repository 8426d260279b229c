"""The torch backend on a CUDA GPU: exactness of speculative decoding, and the forward-cost curves.

No real weights travel to the GPU machine, so this uses randomly initialised models:
1. exactness: a tiny Qwen2 target, a draft that is the target with perturbed weights (partial
   acceptance), greedy plain vs model drafter (D = 4 and auto) vs n-gram drafter: identical tokens;
   seeded sampling repeats itself; rejection sampling runs end to end on GPU-produced logits.
2. cost curves: forward over k = 1..17 new tokens (logits at all k) for the Qwen2.5-Coder-1.5B and
   0.5B *architectures* in bf16. A forward's time does not depend on the weights' values, so these
   are the curves the planner would measure for the real models on this GPU.

    python benchmarks/gpu_check.py --out $OUT
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

ARCH = {  # Qwen2.5-Coder-1.5B and -0.5B shapes (config.json of the released checkpoints)
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=True),
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=True),
}


class Ids:
    """Token ids as their own text: the engine only needs encode/decode and an EOS set."""
    eos_token_ids = frozenset()

    def encode(self, text):
        raise NotImplementedError

    def decode(self, ids):
        return " ".join(map(str, ids))

    def fingerprint(self):
        return "ids"


def tiny(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)
    return Qwen2ForCausalLM(cfg).float()


def exactness(device: str) -> dict:
    target = tiny(0)
    draft = tiny(0)
    with torch.no_grad():  # a draft that agrees often but not always
        for p in draft.parameters():
            p.add_(0.05 * p.std() * torch.randn_like(p))
    t_run, d_run = TorchRunner(target, device=device), TorchRunner(draft, device=device)
    prompt = [5, 9, 17, 33, 65, 129, 257] * 6
    plain = Engine(t_run, Ids())
    out = {"device": device}
    ref = plain.generate(prompt, max_tokens=96).token_ids
    prof = profile_runner(t_run, range(1, 18), (1,), context_len=64, repeats=2)
    dprof = profile_runner(d_run, range(1, 18), (1,), context_len=64, repeats=2)
    planner = Planner(CostCurve.from_profile(prof), CostCurve.from_profile(dprof), prior=PRIORS["model"])
    runs = {"model:4": Engine(t_run, Ids(), ModelDrafter(d_run), 4),
            "model:auto": Engine(t_run, Ids(), ModelDrafter(d_run), "auto", planner=planner),
            "ngram:4": Engine(t_run, Ids(), NgramDrafter(), 4)}
    for name, eng in runs.items():
        r = eng.generate(prompt, max_tokens=96)
        out[name] = {"identical": r.token_ids == ref, "acceptance_rate": r.stats.acceptance_rate,
                     "rounds": r.stats.verification_rounds, "plain_steps": r.stats.plain_steps}
    eng = runs["model:4"]
    a = eng.generate(prompt, max_tokens=48, temperature=0.8, top_p=0.9, seed=7)
    b = eng.generate(prompt, max_tokens=48, temperature=0.8, top_p=0.9, seed=7)
    out["sampling_seeded_repeat"] = a.token_ids == b.token_ids
    out["sampling_acceptance_rate"] = a.stats.acceptance_rate
    return out


def curves(device: str) -> dict:
    res = {}
    for name, kw in ARCH.items():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=4096, **kw)).to(torch.bfloat16)
        runner = TorchRunner(model, device=device)
        t0 = time.perf_counter()
        prof = profile_runner(runner, range(1, 18), (1, 2, 4), context_len=256, repeats=5, warmup=2)
        prof.meta.update(model_architecture=name, dtype="bfloat16", device=torch.cuda.get_device_name(0),
                         weights="random (cost does not depend on values)", seconds=time.perf_counter() - t0)
        res[name] = json.loads(prof.to_json())
        print(prof.format_table(), flush=True)
        del runner, model
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-curves", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
    import transformers
    env["transformers"] = transformers.__version__
    ex = exactness(device)
    print(json.dumps(ex, indent=1), flush=True)
    (out / "gpu_exactness.json").write_text(json.dumps({"env": env, **ex}, indent=1))
    if a.skip_curves:
        return
    cv = curves(device)
    (out / "gpu_curves.json").write_text(json.dumps({"env": env, "curves": cv}, indent=1))


if __name__ == "__main__":
    main()
