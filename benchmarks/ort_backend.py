"""The onnx backend (ONNX Runtime GenAI) beside llama.cpp on the same machine (docs/design.md, CPU backends).

`curves`: ms per forward of k new tokens (logits at all k), one sequence, context 256, for the onnx
runner (one-token forwards padded to two, its default, and unpadded) and llama.cpp's standard and
repacked kernels, all loaded in one process and measured in
passes that take each runner in turn (a slow spell of a shared machine hits one pass of all three,
not all passes of one), medians; with each runner's prefill of the 256-token context.

`agree`: greedy plain decoding of the same prompts on the onnx model (int4, converted from the GGUF)
and on the GGUF through llama.cpp: where each pair of outputs first differs, and both models' top-2
logit margins there (each fed the common prefix); then the onnx backend's own speculative decoding
(n-gram, D auto) against its plain greedy output, token for token, with the time per output token.

    flock /work/runs/cpu.lock .venv/bin/python benchmarks/ort_backend.py curves --out docs/data/ort_backend
    flock /work/runs/cpu.lock .venv/bin/python benchmarks/ort_backend.py agree --out docs/data/ort_backend

`humaneval`: the conversion's quality cost. The 164 HumanEval problems completed by greedy plain
decoding on both models (the raw prompt, Codex's stop sequences, up to --max-tokens), each
completion run against the problem's tests in a fresh interpreter (10 s limit; the model's code runs
on this machine): pass@1 of each, the problems where exactly one passes, and identical completions.
Rows are appended to OUT/humaneval.jsonl as they are computed; a rerun skips the problems it holds.

    flock /work/runs/cpu.lock .venv/bin/python benchmarks/ort_backend.py humaneval --max-tokens 384 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftwise.compare import first_divergence, top2_margin
from draftwise.models.load import load_runner
from draftwise.profile import profile_runner

KS = (1, 2, 4, 8, 16)


def _runners(model: str, threads: int, which: list[str], ctx: int = 512) -> dict:
    out = {}
    for name in which:
        if name.startswith("onnx"):
            out[name] = load_runner(model, "onnx", threads, ctx)
            out[name][0].pad = name != "onnx-unpadded"  # unpadded: a one-token forward on its own kernel
        else:
            out[name] = load_runner(model, "llama.cpp", threads, ctx, n_seq_max=1,
                                    fast_kernels=name == "llama.cpp-repacked")
    return out


def curves(a) -> dict:
    return interleaved_curves({n: r for n, (r, _) in _runners(a.model, a.threads, a.runners).items()}, a.repeats)


def interleaved_curves(runners: dict, repeats: int, context_len: int = 256) -> dict:
    """{"rows": per runner its median ms per k and ratios to k = 1, "table": markdown}: `repeats`
    passes over every runner after one warming pass."""
    ms = {n: {k: [] for k in KS} for n in runners}
    prefill = {n: [] for n in runners}
    for rep in range(repeats + 1):  # pass 0 warms every runner up
        for n, r in runners.items():
            res = profile_runner(r, KS, (1,), context_len=context_len, repeats=1, warmup=0, seed=rep)
            if rep:
                for row in res.rows:
                    ms[n][row["k"]].append(row["ms_median"])
                prefill[n].append(res.meta["prefill"]["ms_median"])
    rows = []
    for n in runners:
        med = {k: statistics.median(v) for k, v in ms[n].items()}
        rows.append({"runner": n, "ms": med, "ratio": {k: med[k] / med[1] for k in KS}, "ms_all": ms[n],
                     "prefill_256_ms": statistics.median(prefill[n])})
    lines = ["| runner | " + " | ".join(f"k={k}" for k in KS) + " | T(8)/T(1) | prefill 256 |",
             "|---" * (len(KS) + 3) + "|"]
    for r in rows:
        cells = [f"{r['ms'][k]:.1f} ({r['ratio'][k]:.2f}×)" for k in KS]
        lines.append(f"| {r['runner']} | " + " | ".join(cells) + f" | {r['ratio'][8]:.2f} | {r['prefill_256_ms']:.0f} ms |")
    return {"rows": rows, "table": "\n".join(lines)}


def _teacher_margin(runner, prompt: list[int], prefix: list[int]) -> tuple[int, float]:
    """(argmax, top-2 margin) of the runner's next-token logits after prompt + prefix."""
    s = runner.new_sequence()
    try:
        row = runner.forward([s], [prompt + prefix], [1])[0][-1]
    finally:
        runner.free(s)
    return int(row.argmax()), top2_margin(row)


def agree(a) -> dict:
    from draftwise.bench.config import BenchConfig, load_prompts

    runners = _runners(a.model, a.threads, ["onnx", "llama.cpp-standard"])
    (onnx, tok), (llama, _) = runners["onnx"], runners["llama.cpp-standard"]
    prompts = load_prompts(BenchConfig(workload=a.workload, n_per_category=a.n, seed=0))
    return agreement(onnx, llama, tok, prompts, a.max_tokens)


def agreement(onnx, llama, tok, prompts, max_tokens: int) -> dict:
    """Plain greedy on both runners and speculative (n-gram, D auto) on `onnx`, per prompt."""
    from draftwise.drafters.ngram import NgramDrafter
    from draftwise.engine import Engine

    plain_onnx, plain_llama = Engine(onnx, tok), Engine(llama, tok)
    spec = Engine(onnx, tok, NgramDrafter(), "auto")
    rows = []
    for p in prompts:
        ids = p.token_ids(tok)
        o = plain_onnx.generate(ids, max_tokens=max_tokens)
        ll = plain_llama.generate(ids, max_tokens=max_tokens)
        sp = spec.generate(ids, max_tokens=max_tokens)
        i = first_divergence(o.token_ids, ll.token_ids)
        row = {"id": p.id, "category": p.category, "prompt_tokens": len(ids), "tokens": len(o.token_ids),
               "onnx_vs_llama_first_divergence": i, "spec_equals_plain": sp.token_ids == o.token_ids,
               "spec_first_divergence": first_divergence(o.token_ids, sp.token_ids),
               "plain_ms_per_token": 1e3 * (o.stats.wall_s - o.stats.prefill_s) / max(1, len(o.token_ids) - 1),
               "spec_ms_per_token": 1e3 * (sp.stats.wall_s - sp.stats.prefill_s) / max(1, len(sp.token_ids) - 1),
               "llama_plain_ms_per_token": 1e3 * (ll.stats.wall_s - ll.stats.prefill_s) / max(1, len(ll.token_ids) - 1),
               "ttft_s": {"onnx": o.ttft_s, "llama.cpp": ll.ttft_s},
               "spec_acceptance_length": sp.stats.acceptance_length}
        if i is not None and i < min(len(o.token_ids), len(ll.token_ids)):
            common = o.token_ids[:i]
            row["at_divergence"] = {"onnx": _teacher_margin(onnx, ids, common),
                                    "llama.cpp": _teacher_margin(llama, ids, common)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    n_same = sum(r["onnx_vs_llama_first_divergence"] is None for r in rows)
    return {"rows": rows, "summary": {"prompts": len(rows), "identical_outputs": n_same,
                                      "spec_equals_plain": sum(r["spec_equals_plain"] for r in rows)}}


STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]  # Codex's (Chen et al. 2021): the function's body ends


def passes(problem: dict, completion: str, timeout_s: float = 10.0) -> bool:
    """Does prompt + completion pass the problem's own tests (a fresh interpreter, `timeout_s`)?"""
    program = f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    with tempfile.TemporaryDirectory() as d:
        try:
            r = subprocess.run([sys.executable, "-I", "-c", program], cwd=d, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def humaneval(a) -> dict:
    import gzip

    from draftwise.engine import Engine
    from draftwise.prompts import data_file

    problems = [json.loads(x) for x in gzip.open(data_file("humaneval/HumanEval.jsonl.gz"), "rt")][: a.n or None]
    path = Path(a.out or ".") / "humaneval.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(x)["task_id"]: json.loads(x) for x in path.read_text().splitlines()} if path.exists() else {}
    runners = _runners(a.model, a.threads, ["onnx", "llama.cpp-standard"], ctx=2048)
    engines = {"onnx": Engine(*runners["onnx"]), "llama.cpp": Engine(*runners["llama.cpp-standard"])}
    for pr in problems:
        if pr["task_id"] in done:
            continue
        row = {"task_id": pr["task_id"]}
        for name, eng in engines.items():
            res = eng.generate(pr["prompt"], max_tokens=a.max_tokens, stop=STOPS)
            row[name] = {"passed": passes(pr, res.text), "tokens": len(res.token_ids), "completion": res.text}
        row["identical"] = row["onnx"]["completion"].rstrip() == row["llama.cpp"]["completion"].rstrip()
        done[pr["task_id"]] = row
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(pr["task_id"], row["llama.cpp"]["passed"], row["onnx"]["passed"], row["identical"], flush=True)
    rows = [done[p["task_id"]] for p in problems if p["task_id"] in done]
    n = len(rows)
    summary = {"problems": n, "identical_completions": sum(r["identical"] for r in rows),
               **{f"pass@1 {b}": round(sum(r[b]["passed"] for r in rows) / max(n, 1), 4) for b in ("llama.cpp", "onnx")},
               "only llama.cpp passes": [r["task_id"] for r in rows if r["llama.cpp"]["passed"] and not r["onnx"]["passed"]],
               "only onnx passes": [r["task_id"] for r in rows if r["onnx"]["passed"] and not r["llama.cpp"]["passed"]]}
    return {"summary": summary}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("curves", "agree", "humaneval"))
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="curves: timed passes over every runner")
    p.add_argument("--runners", nargs="+", default=["onnx", "onnx-unpadded", "llama.cpp-standard", "llama.cpp-repacked"])
    p.add_argument("--workload", default="editeval,humaneval,writing")
    p.add_argument("--n", type=int, default=2, help="agree: prompts per category; humaneval: the first N problems (0: all)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="a directory for the JSON (and the curves' markdown table)")
    a = p.parse_args(argv)
    t0 = time.time()
    res = {"curves": curves, "agree": agree, "humaneval": humaneval}[a.what](a)
    res["meta"] = {"model": a.model, "threads": a.threads, "seconds": round(time.time() - t0),
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": _cpu(), "args": vars(a)}
    if "table" in res:
        print(res["table"])
    else:
        print(json.dumps(res["summary"]))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{a.what}.json").write_text(json.dumps(res, indent=1) + "\n")
        if "table" in res:
            (out / f"{a.what}.md").write_text(res["table"] + "\n")


def _cpu() -> str:
    from draftwise.machine import cpu_model

    return cpu_model()


if __name__ == "__main__":
    main()
