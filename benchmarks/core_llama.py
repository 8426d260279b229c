"""Issue-3 benchmark: draftwise on llama.cpp vs llama-cpp-python's own decoding, one run.

Qwen2.5-Coder-1.5B Q4_K_M, greedy, 128 new tokens, 2 threads, on the first 10 EditEval prompts
and 10 Spec-Bench prose prompts (first 4 writing, 3 roleplay, 3 humanities). Per prompt, in
interleaved order, each configuration of --configs:
  llama_plain         llama_cpp.Llama.generate, greedy (the high-level API)
  llama_pld:N         llama_cpp.Llama with LlamaPromptLookupDecoding(num_pred_tokens=N)
  dw_plain            draftwise plain decoding on the llama.cpp runner
  dw_ngram:D          draftwise n-gram drafter, D draft tokens
  dw_model:D          draftwise with the Qwen 0.5B draft model on llama.cpp, D draft tokens
Rows are appended to --out as they finish (resumable); report with benchmarks/report_core.py.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import llama_cpp

from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.load import load_runner
from draftwise.models.registry import resolve
from divergences import append_divergences  # benchmarks/divergences.py
from draftwise.prompts import edit_eval, spec_bench


def llama_generate(llm: llama_cpp.Llama, ids: list[int], max_new: int, eos: frozenset[int]) -> tuple[list[int], float]:
    t = time.perf_counter()
    out: list[int] = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if tok in eos or len(out) >= max_new:
            break
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/core_llama.jsonl")
    ap.add_argument("--configs", default="llama_plain,dw_plain,dw_ngram:8,llama_pld:10,dw_model:4")
    ap.add_argument("--workloads", default="editeval,prose")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ngram", default="2,4", help="min_n,max_n")
    ap.add_argument("--fast-kernels", action="store_true", help="draftwise runners with repacked kernels "
                    "(what llama_cpp.Llama uses by default)")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["prompt_id"], r["config"]) for r in map(json.loads, out.open())} if out.exists() else set()
    target_path = resolve("qwen2.5-coder-1.5b").path
    target, tok = load_runner("qwen2.5-coder-1.5b", "llama.cpp", args.threads, fast_kernels=args.fast_kernels)
    configs = args.configs.split(",")
    engines: dict[str, object] = {}
    min_n, max_n = map(int, args.ngram.split(","))
    for c in configs:
        kind, _, d = c.partition(":")
        if kind == "dw_plain":
            engines[c] = Engine(target, tok)
        elif kind == "dw_ngram":
            engines[c] = Engine(target, tok, NgramDrafter(min_n, max_n), int(d))
        elif kind == "dw_model":
            draft, _ = load_runner("qwen2.5-coder-0.5b", "llama.cpp", args.threads, fast_kernels=args.fast_kernels)
            engines[c] = Engine(target, tok, ModelDrafter(draft), int(d))
        elif kind == "llama_plain":
            engines[c] = llama_cpp.Llama(target_path, n_ctx=4096, n_threads=args.threads, verbose=False)
        elif kind == "llama_pld":
            engines[c] = llama_cpp.Llama(target_path, n_ctx=4096, n_threads=args.threads, verbose=False,
                                         draft_model=llama_cpp.llama_speculative.LlamaPromptLookupDecoding(
                                             num_pred_tokens=int(d)))
        else:
            raise SystemExit(f"unknown configuration {c}")
    prompts = []
    if "editeval" in args.workloads:
        prompts += edit_eval(args.n)
    if "prose" in args.workloads:
        prose = spec_bench(("writing",), 4) + spec_bench(("roleplay",), 3) + spec_bench(("humanities",), 3)
        prompts += prose[: args.n]
    meta = {"backend": "llama.cpp", "fast_kernels": args.fast_kernels, "llama_cpp_python": llama_cpp.__version__, "threads": args.threads,
            "machine": platform.machine(), "max_tokens": args.max_tokens, "torch": "-"}
    warm = prompts[0].token_ids(tok)
    for eng in engines.values():  # warm-up
        eng.generate(warm, max_tokens=4) if isinstance(eng, Engine) else llama_generate(eng, warm, 4, tok.eos_token_ids)
    for p in prompts:
        ids = p.token_ids(tok)
        for name, eng in engines.items():
            if (p.id, name) in done:
                continue
            row = {"prompt_id": p.id, "category": "prose" if p.category != "editeval" else "editeval",
                   "config": name, "prompt_tokens": len(ids), **meta}
            if isinstance(eng, Engine):
                r = eng.generate(ids, max_tokens=args.max_tokens)
                row.update(tokens=r.token_ids, seconds=r.stats.wall_s, stats=r.stats.to_dict())
            else:
                toks, secs = llama_generate(eng, ids, args.max_tokens, tok.eos_token_ids)
                row.update(tokens=toks, seconds=secs)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{p.id:16} {name:14} {len(row['tokens']):4d} tok {len(row['tokens']) / row['seconds']:6.2f} tok/s", flush=True)
    append_divergences(out, target, tok, {p.id: p for p in prompts})


if __name__ == "__main__":
    main()
