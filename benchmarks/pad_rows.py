"""Padding short oneDNN calls: what `choose_pad` measures and what it buys in whole forwards.

Loads a model on torch (oneDNN chosen as the runner chooses it), prints the per-row-count pass
times `packed_linear.choose_pad` decides from and the pad it chose, then times target forwards of
k = 1..K tokens (k = 1: a plain step) with each pad setting, interleaved per repeat over the same
context (up to 256 tokens), median ms. Greedy tokens of a short decode are compared across the settings.

    .venv/bin/python benchmarks/pad_rows.py [--model qwen2.5-coder-1.5b --k 6 --repeats 12]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftwise.backends import packed_linear
from draftwise.engine import Engine


def measure(runner, tok, ctx: list[int], max_k: int, repeats: int, decode: int) -> None:
    """Print the pass times, the pad they give, forward ms per setting and whether greedy output
    matches the unpadded one, for a torch runner on oneDNN linears over context `ctx`."""
    lins = [m for m in runner.model.modules() if isinstance(m, packed_linear.OneDNNLinear)]
    if not lins:
        raise SystemExit("no oneDNN linears: nothing to pad on this machine")
    t = packed_linear.pass_times(lins, range(1, packed_linear.PAD_MAX + 1), packed_linear.PAD_REPEATS)
    print("# one pass of m rows through every linear (ms): " + "  ".join(f"{m}: {1e3 * s:.0f}" for m, s in t.items()))
    print(f"# pad from this pass: {packed_linear.pad_from_times(t)}")
    settings = {"none": (), "chosen": runner.pad, "pad3": (0, 3, 3), "pad5": (0, 5, 5, 5, 5)}
    seq = runner.new_sequence()
    runner.forward([seq], [ctx], [1])
    ms: dict = {(s, k): [] for s in settings for k in range(1, max_k + 1)}
    for _ in range(repeats):
        for s, pad in settings.items():
            packed_linear.set_pad(runner.model, pad)
            for k in range(1, max_k + 1):
                t0 = time.perf_counter()
                runner.forward([seq], [ctx[-k:]], [k])
                ms[(s, k)].append(1e3 * (time.perf_counter() - t0))
                runner.truncate(seq, len(ctx))
    print(f"\n# target forward of k tokens at a {len(ctx)}-token context, median of {repeats} (ms)")
    print("setting " + "".join(f"{'k=' + str(k):>8}" for k in range(1, max_k + 1)))
    for s in settings:
        print(f"{s:7} " + "".join(f"{statistics.median(ms[(s, k)]):8.1f}" for k in range(1, max_k + 1)))
    runner.free(seq)
    outs = {}
    for s, pad in settings.items():  # plain greedy decoding (the engine without a drafter)
        packed_linear.set_pad(runner.model, pad)
        outs[s] = Engine(runner, tok).generate(ctx[:64], max_tokens=decode).token_ids
    print(f"\n# greedy {decode} tokens identical to unpadded: "
          + ", ".join(f"{s}: {outs[s] == outs['none']}" for s in settings if s != "none"))


def main(argv: list[str] | None = None) -> None:
    from draftwise.build import EngineSpec, build_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=32, help="greedy tokens compared across settings")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    _, runner, tok = build_engine(EngineSpec(target=a.model, drafter="none", num_draft_tokens=0, backend="torch",
                                             threads=a.threads))
    print(f"# {a.model}: packed={runner.packed} chosen pad={runner.pad}")
    measure(runner, tok, tok.encode("def quicksort(xs):\n    " * 30)[:256], a.k, a.repeats, a.decode)


if __name__ == "__main__":
    main()
