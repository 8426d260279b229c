"""Cost curves: the table of saved `draftwise profile` curves (docs/design.md, Measured cost curves), and ragged batched
steps measured against what the planner predicts for them (docs/planner.md, "Batches").

`table`: ms per forward of k new tokens (logits at all k), one row per curve and batch size, with
the ratio to k = 1 of the same batch size.

`native`: llama.cpp's verify curve next to native `llama-bench` (built by scripts/setup_peers.sh) in
the same sitting: draftwise's LlamaRunner forward of k tokens at a fixed context with logits at all
k rows (what verification needs) and at the last row only (what llama-bench's ppK times), standard
and repacked kernels, interleaved per repeat; the time inside llama_decode apart from the Python
around it; and llama-bench ppK at the same depth with --repack 0 and 1 (docs/design.md, Measured cost curves).

`ragged`: a batched step whose sequences feed different numbers of tokens, measured against its
prediction from the cost curve (measured on even batches): priced as the forwards the runner runs
it as (ModelRunner.forward_parts; llama.cpp: equal-split ubatches), and as one forward
padded to the longest feed. The server's runner and cached curve, so `draftwise serve
--max-running 16 --max-context 1024` on the same model prices steps exactly as here.

    .venv/bin/python benchmarks/cost_curves.py table docs/data/profile_*_method2_xeon.json
    .venv/bin/python benchmarks/cost_curves.py ragged --model qwen2.5-coder-1.5b
    .venv/bin/python benchmarks/cost_curves.py native --model qwen2.5-coder-1.5b
    .venv/bin/python benchmarks/cost_curves.py trie
    .venv/bin/python benchmarks/cost_curves.py head --model qwen2.5-coder-1.5b

`trie`: what building the suffix drafter's request trie over a long prompt costs while Python's
cyclic GC walks everything a loaded process holds, and with that frozen as the server does
(docs/server.md; `docs/data/trie_gc.txt`).

`head`: what a draft head costs around the target (docs/heads.md; `docs/data/head_costs_epyc.txt`):
one drafted token of the target's packaged head in float32 and in bfloat16 (HeadRunner, after a
64-position context), and a llama.cpp prefill of the prompt with the per-token embeddings (the
head's features) switched off and on, one output row either way, interleaved per repeat.
"""
from __future__ import annotations

import argparse
import csv
import io
import random
import subprocess
import statistics
import time
from pathlib import Path

from draftwise.backends.base import padded_parts
from draftwise.costs import CostCurve
from draftwise.profile import ProfileResult

CONTEXT = 200  # tokens each sequence holds before a measured ragged step


def table(results: dict[str, ProfileResult]) -> str:
    """One markdown table over every curve (name -> profile), k as columns."""
    ks = sorted({r["k"] for res in results.values() for r in res.rows})
    lines = ["| curve | b | " + " | ".join(f"k={k}" for k in ks) + " |", "|---" * (len(ks) + 2) + "|"]
    for name, res in results.items():
        for b in sorted({r["batch"] for r in res.rows}):
            base = res.ms(b, 1)
            cells = [f"{res.ms(b, k):.0f} ({res.ms(b, k) / base:.2f}×)" for k in ks]
            lines.append(f"| {name} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shapes(n: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """Named per-sequence feeds of a step of n sequences: one, half or all drafting d, and mixes."""
    out = [("all plain", [1] * n)]
    for d in (1, 2, 4, 8):
        out += [(f"one drafts {d}", [d + 1] + [1] * (n - 1)),
                (f"half draft {d}", [d + 1] * (n // 2) + [1] * (n - n // 2)),
                (f"all draft {d}", [d + 1] * n)]
    rng = random.Random(seed)
    out += [(f"mixed {i + 1}", [rng.choice([1, 1, 2, 3, 5, 9]) for _ in range(n)]) for i in range(4)]
    return out


def measure(runner, curve: CostCurve, n: int, reps: int = 9) -> list[dict]:
    """Median seconds of each shape's forward against its two predictions."""
    seqs = [runner.new_sequence() for _ in range(n)]
    for s in seqs:
        runner.forward([s], [[(7 * i) % 97 + 3 for i in range(CONTEXT)]], [1])
    rows = []
    try:
        for name, ks in shapes(n):
            ts = []
            for _ in range(reps + 1):
                t = time.perf_counter()
                runner.forward(seqs, [[5] * k for k in ks], ks)
                ts.append(time.perf_counter() - t)
                for s in seqs:
                    runner.truncate(s, CONTEXT)
            rows.append({"shape": name, "feeds": ks, "measured_ms": 1e3 * statistics.median(ts[1:]),
                         "split_ms": 1e3 * curve.parts(runner.forward_parts(ks)),
                         "padded_ms": 1e3 * curve.parts(padded_parts(ks))})
    finally:
        for s in seqs:
            runner.free(s)
    return rows


def ragged_table(rows: list[dict], n: int) -> str:
    def err(r, key):
        return f"{100 * (r[key] / r['measured_ms'] - 1):+.0f}%"
    lines = [f"batch of {n}: measured ms | split prediction | padded prediction",
             f"{'shape':<16} {'measured':>9} {'split':>14} {'padded':>14}"]
    for r in rows:
        lines.append(f"{r['shape']:<16} {r['measured_ms']:9.1f} {r['split_ms']:8.1f} {err(r, 'split_ms'):>5} "
                     f"{r['padded_ms']:8.1f} {err(r, 'padded_ms'):>5}")
    for key in ("split_ms", "padded_ms"):
        e = [abs(r[key] / r["measured_ms"] - 1) for r in rows]
        lines.append(f"median |error| {key[:-3]}: {100 * statistics.median(e):.0f}%, worst {100 * max(e):.0f}%")
    return "\n".join(lines)


LLAMA_BENCH = Path(__file__).resolve().parent.parent / ".peers/llama-build/bin/llama-bench"


def native_bench(model_path: str, ks: list[int], depth: int, reps: int) -> dict:
    """{(repack, k): ms} of llama-bench ppK at depth `depth` (logits for the last token only)."""
    if not LLAMA_BENCH.exists():
        raise SystemExit(f"{LLAMA_BENCH} is missing: build it with scripts/setup_peers.sh")
    out = subprocess.run([str(LLAMA_BENCH), "-m", model_path, "-p", ",".join(map(str, ks)), "-n", "0",
                          "-d", str(depth), "-r", str(reps), "--repack", "0,1", "-o", "csv"],
                         capture_output=True, text=True, check=True).stdout
    return {(int(r["repack"]), int(r["n_prompt"])): float(r["avg_ns"]) / 1e6 for r in csv.DictReader(io.StringIO(out))}


def runner_curves(model_path: str, ks: list[int], depth: int, reps: int) -> dict:
    """{(kernels, rows, k): (median ms of forward, median ms inside llama_decode)}: a LlamaRunner per
    kernel set, one sequence at `depth` tokens, each k with logits at all k ("all") and at the last
    ("last"), every configuration once per repeat (interleaved, so drift hits all alike)."""
    from draftwise.backends.llama_runner import LlamaRunner

    runners = {kern: LlamaRunner(model_path, n_ctx=depth + 64, n_seq_max=1, extra_bufts=kern == "repacked")
               for kern in ("standard", "repacked")}
    ctx = [(7 * i) % 5000 + 100 for i in range(depth)]
    seqs = {kern: r.new_sequence() for kern, r in runners.items()}
    for kern, r in runners.items():
        r.forward([seqs[kern]], [ctx], [1])
    times: dict = {}
    for rep in range(reps + 1):  # the first repeat warms up
        for kern, r in runners.items():
            decode, inner = r._decode, []

            def timed(*a, _d=decode, _t=inner):
                t = time.perf_counter()
                _d(*a)
                _t.append(time.perf_counter() - t)
            r._decode = timed
            for k in ks:
                for rows in ("all", "last"):
                    inner.clear()
                    t = time.perf_counter()
                    r.forward([seqs[kern]], [ctx[:k]], [k if rows == "all" else 1])
                    total = time.perf_counter() - t
                    r.truncate(seqs[kern], depth)
                    if rep:
                        times.setdefault((kern, rows, k), []).append((1e3 * total, 1e3 * sum(inner)))
            r._decode = decode
    for r in runners.values():
        r.close()
    return {key: (statistics.median(t for t, _ in v), statistics.median(d for _, d in v)) for key, v in times.items()}


def native_table(nat: dict, ours: dict, ks: list[int]) -> str:
    """Per kernel set: llama-bench ppK, draftwise last-row and all-rows forwards (ms and x k=1 of
    the same column), the Python around llama_decode, and what the extra output rows cost."""
    lines = []
    for repack, kern in ((0, "standard"), (1, "repacked")):
        base = {c: None for c in ("nat", "last", "all")}
        lines += [f"\n{kern} kernels (llama-bench --repack {repack})",
                  f"{'k':>3} {'llama-bench ppK':>16} {'draftwise, last row':>20} {'draftwise, all k rows':>22} "
                  f"{'python':>7} {'k-1 rows':>9}"]
        for k in ks:
            cells = {"nat": nat[(repack, k)], "last": ours[(kern, "last", k)][0], "all": ours[(kern, "all", k)][0]}
            for c, v in cells.items():
                base[c] = base[c] or v
            py = ours[(kern, "all", k)][0] - ours[(kern, "all", k)][1]
            lines.append(f"{k:>3} " + " ".join(f"{cells[c]:8.1f} ({cells[c] / base[c]:4.2f}×)".rjust(w)
                                                 for c, w in (("nat", 16), ("last", 20), ("all", 22)))
                         + f" {py:7.2f} {cells['all'] - cells['last']:9.1f}")
    return "\n".join(lines)


def trie_builds(lengths: list[int], reps: int, vocab: int = 3000) -> list[tuple[int, int, float, float]]:
    """(prompt tokens, trie nodes, ms to build the suffix drafter's request trie with the cyclic
    GC walking every object the process holds, ms with those frozen: draftwise.build.freeze_heap),
    median of `reps` random prompts each. Freezes this process's heap."""
    import gc

    import transformers  # noqa: F401 - what a serving process holds besides torch

    from draftwise.build import freeze_heap
    from draftwise.drafters.suffix import SuffixTrie

    rng = random.Random(0)
    prompts = {n: [[rng.randrange(vocab) for _ in range(n)] for _ in range(reps)] for n in lengths}

    def build(seq: list[int]) -> tuple[float, int]:
        t = time.perf_counter()
        trie = SuffixTrie(24)
        trie.add(seq)
        return 1e3 * (time.perf_counter() - t), trie.nodes
    gc.collect()
    walked = {n: [build(p) for p in prompts[n]] for n in lengths}
    freeze_heap()
    frozen = {n: [build(p)[0] for p in prompts[n]] for n in lengths}
    return [(n, walked[n][0][1], statistics.median(t for t, _ in walked[n]), statistics.median(frozen[n]))
            for n in lengths]


def head_costs(model: str, head: str | None, prompt_tokens: int, reps: int) -> list[str]:
    """Lines of the `head` report: medians of `reps` (ms)."""
    import torch

    from draftwise.backends.head_runner import HeadRunner
    from draftwise.models.head import load_head
    from draftwise.models.heads import resolve_head
    from draftwise.models.load import load_runner

    runner, tok = load_runner(model, "llama.cpp", 2)
    path = resolve_head(head, model)
    out = [f"# {model}, llama.cpp; head {path.name}; median of {reps} (ms)"]
    for dtype in (torch.float32, torch.bfloat16):
        hr = HeadRunner(load_head(path, runner).to(dtype), "", runner.max_context, runner.vocab_size)
        seq = hr.new_sequence()
        hr.give_features(seq, torch.randn(64, runner.hidden_size))
        hr.forward([seq], [[1] * 64], [1])
        ms = []
        for _ in range(reps + 1):
            t = time.perf_counter()
            hr.forward([seq], [[7]], [1])
            ms.append(1e3 * (time.perf_counter() - t))
            hr.truncate(seq, 64)
        out.append(f"head drafted token, {str(dtype).removeprefix('torch.')}: {statistics.median(ms[1:]):.2f}")
    ids = (tok.encode("def f(x):\n    return x * 2\n") * prompt_tokens)[:prompt_tokens]
    times = {False: [], True: []}
    for i in range(reps + 1):
        for on in (False, True):
            seq = runner.new_sequence()
            t = time.perf_counter()
            if on:
                runner.forward_features([seq], [ids], [1], [])
            else:
                runner.forward([seq], [ids], [1])
            if i:
                times[on].append(1e3 * (time.perf_counter() - t))
            runner.free(seq)
    for on in (False, True):
        out.append(f"prefill of {prompt_tokens} tokens, 1 output row, embeddings {'on' if on else 'off'}: "
                   f"{statistics.median(times[on]):.0f}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="markdown table of saved profiles")
    t.add_argument("profiles", nargs="+", help="JSON files written by `draftwise profile --out`")
    r = sub.add_parser("ragged", help="ragged batched steps, measured against the predictions (llama.cpp)")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    r.add_argument("--max-running", type=int, default=16)
    r.add_argument("--max-context", type=int, default=1024)
    r.add_argument("--reps", type=int, default=9)
    nv = sub.add_parser("native", help="verify curve next to native llama-bench (llama.cpp)")
    nv.add_argument("--model", default="qwen2.5-coder-1.5b")
    nv.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 12, 16])
    nv.add_argument("--depth", type=int, default=256, help="tokens in the sequence before each forward")
    nv.add_argument("--reps", type=int, default=9)
    tr = sub.add_parser("trie", help="the suffix drafter's request trie build, GC walking the heap or frozen")
    tr.add_argument("--lengths", type=int, nargs="+", default=[500, 1000, 1500, 3000])
    tr.add_argument("--reps", type=int, default=5)
    hd = sub.add_parser("head", help="a draft head's token in fp32 and bf16; prefill with embeddings off and on (llama.cpp)")
    hd.add_argument("--model", default="qwen2.5-coder-1.5b")
    hd.add_argument("--head", default=None, help="a head directory or packaged name (default: the model's packaged head)")
    hd.add_argument("--prompt-tokens", type=int, default=300)
    hd.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    if a.cmd == "head":
        print("\n".join(head_costs(a.model, a.head, a.prompt_tokens, a.reps)))
        return
    if a.cmd == "trie":
        print("prompt tokens | trie nodes | ms, GC walking the heap | ms, heap frozen")
        for n, nodes, walked, frozen in trie_builds(a.lengths, a.reps):
            print(f"{n:13d} | {nodes:10d} | {walked:23.1f} | {frozen:15.1f}")
        return
    if a.cmd == "native":
        from draftwise.models.load import resolve

        path = str(resolve(a.model).path)
        print(f"# {a.model} at depth {a.depth}, median of {a.reps} (ms)")
        print(native_table(native_bench(path, a.ks, a.depth, a.reps), runner_curves(path, a.ks, a.depth, a.reps), a.ks))
        return
    if a.cmd == "table":
        print(table({Path(p).stem.removeprefix("profile_"): ProfileResult.load(p) for p in a.profiles}))
        return
    from draftwise.build import EngineSpec, load_target
    from draftwise.profile import cached_profile

    spec = EngineSpec(target=a.model, backend="llama.cpp", max_running=a.max_running, max_context=a.max_context)
    runner, _ = load_target(spec)
    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b < a.max_running) + (a.max_running,)
    curve = CostCurve.from_profile(cached_profile(runner, sizes, range(1, 18)))
    print(f"{a.model}, llama.cpp, {spec.kernels} kernels")
    for n in a.batch:
        print(ragged_table(measure(runner, curve, n, a.reps), n))


if __name__ == "__main__":
    main()
