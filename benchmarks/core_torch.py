"""Issue-2 benchmark: draftwise vs transformers on the torch backend, side by side in one run.

Qwen2.5-Coder-1.5B target (fp32, CPU), greedy, 128 new tokens. Per prompt, in interleaved order:
transformers generate() plain, draftwise plain, draftwise speculative, transformers speculative
(prompt lookup on EditEval, assistant model on HumanEval). Results go to a JSONL file one run at
a time, so an interrupted run resumes where it stopped.

    .venv/bin/python benchmarks/core_torch.py --out results/core_torch.jsonl
    .venv/bin/python benchmarks/report_core.py results/core_torch.jsonl
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from draftwise.build import make_planner
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.load import load_torch
from divergences import append_divergences  # benchmarks/divergences.py
from draftwise.prompts import edit_eval, humaneval


def hf_generate(model, tok, ids, max_new, **kw) -> tuple[list[int], float]:
    x = torch.tensor([ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=sorted(tok.eos_token_ids), pad_token_id=sorted(tok.eos_token_ids)[0], **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/core_torch.jsonl")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ngram-d", default="10", help="D of the n-gram drafter, or auto (the planner); "
                    "comma-separated for several configurations side by side (10,auto)")
    ap.add_argument("--model-d", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="editeval,humaneval")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers generate() rows")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["prompt_id"], r["config"]) for r in map(json.loads, out.open())} if out.exists() else set()

    target, tok = load_torch("qwen2.5-coder-1.5b", threads=args.threads)
    hf_t = target.model
    plain = Engine(target, tok)
    ngrams = []
    for d in args.ngram_d.split(","):
        drafter = NgramDrafter(2, 4)
        d = d if d == "auto" else int(d)
        ngrams.append((f"dw_ngram_d{d}", Engine(target, tok, drafter, d,
                                                planner=make_planner(target, drafter) if d == "auto" else None)))
    if "humaneval" in args.workloads:
        draft, _ = load_torch("qwen2.5-coder-0.5b", threads=args.threads, pack="off")
        hf_d = draft.model
        hf_d.generation_config.num_assistant_tokens = args.model_d
        model = Engine(target, tok, ModelDrafter(draft), args.model_d)
    meta = {"torch": torch.__version__, "threads": args.threads, "machine": platform.machine(),
            "max_tokens": args.max_tokens, "packed_linear": target.packed}
    plan = []
    if "editeval" in args.workloads:
        plan += [(p, [("hf_plain", None), ("dw_plain", plain), *ngrams,
                      ("hf_prompt_lookup_10", {"prompt_lookup_num_tokens": 10})]) for p in edit_eval(args.n)]
    if "humaneval" in args.workloads:
        plan += [(p, [("hf_plain", None), ("dw_plain", plain), (f"dw_model_d{args.model_d}", model),
                      ("hf_assistant", {"assistant_model": hf_d})]) for p in humaneval(args.n)]
    if args.no_hf:
        plan = [(p, [c for c in cfgs if not c[0].startswith("hf_")]) for p, cfgs in plan]
    # warm-up: one short run of each path
    ids0 = plan[0][0].token_ids(tok)
    hf_generate(hf_t, tok, ids0, 4)
    for eng in {id(e): e for _, cfgs in plan for _, e in cfgs if isinstance(e, Engine)}.values():
        eng.generate(ids0, max_tokens=4)
    for prompt, configs in plan:
        ids = prompt.token_ids(tok)
        for name, how in configs:
            if (prompt.id, name) in done:
                continue
            row = {"prompt_id": prompt.id, "category": prompt.category, "config": name,
                   "prompt_tokens": len(ids), **meta}
            if isinstance(how, Engine):
                r = how.generate(ids, max_tokens=args.max_tokens)
                row.update(tokens=r.token_ids, seconds=r.stats.wall_s, stats=r.stats.to_dict())
            else:
                toks, secs = hf_generate(hf_t, tok, ids, args.max_tokens, **(how or {}))
                row.update(tokens=toks, seconds=secs)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{prompt.id:14} {name:22} {len(row['tokens']):4d} tok {len(row['tokens']) / row['seconds']:6.2f} tok/s", flush=True)
    append_divergences(out, target, tok, {p.id: p for p, _ in plan})


if __name__ == "__main__":
    main()
