"""The torch backend on a CUDA GPU: exactness, forward-cost curves, and the engine end to end.

No real weights travel to the GPU machine, so this uses randomly initialised models:
1. exactness: a tiny Qwen2 target, a draft that is the target with perturbed weights (partial
   acceptance), greedy plain vs model drafter (D = 4 and auto) vs n-gram drafter: identical tokens;
   seeded sampling repeats itself; rejection sampling runs end to end on GPU-produced logits.
2. cost curves: forward over k = 1..17 new tokens (logits at all k) for the Qwen2.5-Coder-1.5B and
   0.5B *architectures* in bf16, the 1.5B also returning its features (what a head reads), and the
   packaged draft head (its real weights, in the repository) on that target. A forward's time does
   not depend on the weights' values, so these are the curves the planner would measure for the
   real models on this GPU.
3. with --engine: plain vs speculative decoding through the engine on those architectures (random
   weights, bf16) and the packaged head, greedy outputs compared with plain decoding. Random weights make acceptance
   meaningless as a property of the models, so this measures the engine and the planner, not the
   drafters: a random 0.5B draft agrees with the random target almost never (the planner should
   stop drafting with it).

Without a GPU (a smoke test) it runs on the CPU with tiny shapes.

    python benchmarks/gpu_check.py --out $OUT            # 1 and 2: gpu_exactness.json, gpu_curves.json
    python benchmarks/gpu_check.py --engine --out $OUT   # 3: gpu_engine.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from draftwise.backends.torch_runner import TorchRunner
from draftwise.build import load_drafter
from draftwise.costs import CostCurve
from draftwise.drafters.head import HeadDrafter
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.head import HeadConfig, new_head, save_head
from draftwise.draft_length import PRIORS, config_for
from draftwise.planner import Planner
from draftwise.profile import profile_runner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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


class _WithFeatures:
    """A runner whose every forward also returns the target's last-layer features: their cost."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def forward(self, seq_ids, tokens, num_logits, parents=None):
        return self.runner.forward_features(seq_ids, tokens, num_logits, [], parents).logits


def _device_name() -> str | None:
    return torch.cuda.get_device_name(0) if DEVICE == "cuda" else None


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
    hd = head_drafter(t_run, packaged=False)  # a random head for the tiny target: rare acceptance
    runs = {"model:4": Engine(t_run, Ids(), ModelDrafter(d_run), 4),
            "head:4": Engine(t_run, Ids(), hd, 4),
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
    out["head_dtype"] = str(hd.runner.head.fc.weight.dtype)
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
        prof.meta.update(model_architecture=name, dtype="bfloat16", device=_device_name(),
                         weights="random (cost does not depend on values)", seconds=time.perf_counter() - t0)
        res[name] = json.loads(prof.to_json())
        print(prof.format_table(), flush=True)
        if name == "qwen2.5-coder-1.5b":  # with its features (the head's input), and the head on it
            prof = profile_runner(_WithFeatures(runner), range(1, 18), (1,), context_len=256, repeats=5, warmup=2)
            prof.meta.update(model_architecture=name, dtype="bfloat16", device=_device_name(), features="last")
            res[name + "+features"] = json.loads(prof.to_json())
            hrun = head_drafter(runner).runner
            prof = profile_runner(hrun, range(1, 18), (1,), context_len=256, repeats=5, warmup=2)
            prof.meta.update(head="qwen2.5-coder-1.5b-head (packaged weights)", dtype=str(hrun.head.fc.weight.dtype),
                             device=_device_name())
            res["qwen2.5-coder-1.5b-head"] = json.loads(prof.to_json())
            print(prof.format_table(), flush=True)
            del hrun
        del runner, model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return res


def head_drafter(target: TorchRunner, packaged: bool = DEVICE == "cuda") -> HeadDrafter:
    """The packaged head of the 1.5B on `target`, or (tiny shapes) a random head of the target's
    size; loaded as the CLI loads a head: beside the target, in bf16 on a GPU."""
    spec = SimpleNamespace(drafter="head", head=None, target="qwen2.5-coder-1.5b")
    if packaged:
        return load_drafter(spec, None, target=target)
    emb, rows = target.embedding_tables()
    H, V = target.hidden_size, target.vocab_size
    dv = min(V, 1024)
    head = new_head(HeadConfig(H, 4, 2, H // 4, 2 * H, V, dv), emb, rows(torch.arange(dv)), torch.zeros(dv, dtype=torch.long))
    with tempfile.TemporaryDirectory() as d:
        save_head(head, d)
        spec.head = d
        return load_drafter(spec, None, target=target)


def model(name: str, seed: int) -> TorchRunner:
    torch.manual_seed(seed)
    kw = ARCH[name] if DEVICE == "cuda" else dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=6000)
    m = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=4096, **kw))
    return TorchRunner(m.to(torch.bfloat16) if DEVICE == "cuda" else m, device=DEVICE)


def engine_run(max_tokens: int) -> dict:
    """Plain and speculative configurations through the engine on the two architectures, 4 prompts."""
    target, draft = model("qwen2.5-coder-1.5b", 0), model("qwen2.5-coder-0.5b", 1)
    curve = lambda r: CostCurve.from_profile(profile_runner(r, range(1, 18), (1,), 256, repeats=3))  # noqa: E731
    hrun = head_drafter(target).runner
    t_curve, d_curve, h_curve = curve(target), curve(draft), curve(hrun)
    engines = {
        "plain": Engine(target, Ids()),
        "ngram:4": Engine(target, Ids(), NgramDrafter(), 4),
        "ngram:16": Engine(target, Ids(), NgramDrafter(), 16),
        "ngram:auto": Engine(target, Ids(), NgramDrafter(), "auto",
                             planner=Planner(t_curve, None, prior=PRIORS["ngram"])),
        "model:4": Engine(target, Ids(), ModelDrafter(draft), 4),
        "model:auto": Engine(target, Ids(), ModelDrafter(draft), "auto",
                             planner=Planner(t_curve, d_curve, prior=PRIORS["model"])),
        "head:4": Engine(target, Ids(), HeadDrafter(hrun), 4),
        "head:auto": Engine(target, Ids(), HeadDrafter(hrun), "auto",
                            planner=Planner(t_curve, h_curve, config_for("head", False, 16))),
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
            r = e.generate(p, max_tokens=max_tokens)
            dt = time.perf_counter() - t0
            rows.append({"prompt": i, "config": name, "seconds": dt, "tokens": r.token_ids,
                         "stats": r.stats.to_dict()})
    out = {"gpu": _device_name(), "torch": torch.__version__, "max_tokens": max_tokens, "rows": rows,
           "summary": {}}
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
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-curves", action="store_true")
    ap.add_argument("--engine", action="store_true", help="only the engine end to end (gpu_engine.json)")
    ap.add_argument("--max-tokens", type=int, default=128, help="per request, with --engine")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.engine:
        (out / "gpu_engine.json").write_text(json.dumps(engine_run(a.max_tokens)))
        return
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": _device_name()}
    import transformers
    env["transformers"] = transformers.__version__
    ex = exactness(DEVICE)
    print(json.dumps(ex, indent=1), flush=True)
    (out / "gpu_exactness.json").write_text(json.dumps({"env": env, **ex}, indent=1))
    if a.skip_curves:
        return
    cv = curves(DEVICE)
    (out / "gpu_curves.json").write_text(json.dumps({"env": env, "curves": cv}, indent=1))


if __name__ == "__main__":
    main()
