"""torch CPU linear kernels: one layer's cost by row count (`linear`), padding short oneDNN calls (`pad`).

`linear`: cost of one fp32 linear layer against its row count, per kernel, on this CPU. A
verification forward of D + 1 tokens sends D + 1 rows through every linear layer; how that cost
grows with the row count decides what speculation can gain on torch. This times one Qwen-1.5B
MLP projection (1536 -> 8960 by default) for 1..17 rows through
- `sgemm`: `F.linear` (MKL's sgemm in the PyTorch CPU wheel),
- `mkl_packed`: MKL's packed GEMM (`_mkl_reorder_linear_weight` + `_mkl_linear`, packed_linear.py),
- `onednn`: oneDNN's matmul on a weight reordered for it (`mkldnn._reorder_linear_weight` +
  `mkldnn._linear_pointwise`, the op inductor emits for frozen linears without MKL),
interleaved per repeat so a slow second of the machine hits all three alike.

`pad`: what `choose_pad` measures and what it buys in whole forwards. Loads a model on torch
(oneDNN chosen as the runner chooses it), prints the per-row-count pass times
`packed_linear.choose_pad` decides from and the pad it chose, then times target forwards of
k = 1..K tokens (k = 1: a plain step) with each pad setting, interleaved per repeat over the same
context (up to 256 tokens), median ms. Greedy tokens of a short decode are compared across the settings.

    .venv/bin/python benchmarks/kernels.py linear [--in 1536 --out 8960 --repeats 30 --threads 2]
    .venv/bin/python benchmarks/kernels.py pad [--model qwen2.5-coder-1.5b --k 6 --repeats 12]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from draftwise.backends import packed_linear
from draftwise.engine import Engine


def kernels(w: torch.Tensor) -> dict:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w
    out = {"sgemm": lin}  # nn.Linear: F.linear, MKL's sgemm
    if packed_linear.available():
        out["mkl_packed"] = packed_linear.PackedLinear(lin)  # packed only: every row count on MKL's packed GEMM
    if packed_linear.onednn_available():
        out["onednn"] = packed_linear.OneDNNLinear(lin)
    return out


def linear(a: argparse.Namespace) -> None:
    """The `linear` subcommand: one fp32 linear per kernel by row count."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    w = torch.randn(a.n_out, a.k_in) * 0.02  # [N, K]
    ks = kernels(w)
    xs = {r: torch.randn(r, a.k_in) for r in range(1, a.rows + 1)}
    ref = {r: F.linear(x, w) for r, x in xs.items()}
    for name, f in ks.items():  # warm up and check each kernel computes the same product
        for r, x in xs.items():
            err = (f(x) - ref[r]).abs().max().item()
            if err > 1e-3:
                raise SystemExit(f"{name} differs from F.linear at {r} rows by {err}")
    ms = {(n, r): [] for n in ks for r in xs}
    with torch.inference_mode():
        for _ in range(a.repeats):
            for r, x in xs.items():
                for n, f in ks.items():
                    t0 = time.perf_counter()
                    f(x)
                    ms[(n, r)].append(1e3 * (time.perf_counter() - t0))
    print(f"# {a.k_in} -> {a.n_out} fp32, {a.threads} threads, median of {a.repeats} (ms); "
          f"x1 = ratio to sgemm at 1 row")
    print("rows " + " ".join(f"{n:>18}" for n in ks))
    base = statistics.median(ms[("sgemm", 1)])
    for r in xs:
        cells = []
        for n in ks:
            m = statistics.median(ms[(n, r)])
            cells.append(f"{m:8.3f} ({m / base:4.2f}x)")
        print(f"{r:4d} " + " ".join(f"{c:>18}" for c in cells))


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


def pad(a: argparse.Namespace) -> None:
    """The `pad` subcommand: a model on torch, padded oneDNN forwards against unpadded."""
    from draftwise.build import EngineSpec, build_engine

    torch.manual_seed(0)
    _, runner, tok = build_engine(EngineSpec(target=a.model, drafter="none", num_draft_tokens=0, backend="torch",
                                             threads=a.threads))
    print(f"# {a.model}: packed={runner.packed} chosen pad={runner.pad}")
    measure(runner, tok, tok.encode("def quicksort(xs):\n    " * 30)[:256], a.k, a.repeats, a.decode)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    li = sub.add_parser("linear", help="one fp32 linear per kernel (sgemm, MKL packed, oneDNN) by row count")
    li.add_argument("--in", dest="k_in", type=int, default=1536)
    li.add_argument("--out", dest="n_out", type=int, default=8960)
    li.add_argument("--rows", type=int, default=17)
    li.add_argument("--repeats", type=int, default=30)
    li.add_argument("--threads", type=int, default=2)
    li.set_defaults(func=linear)
    pa = sub.add_parser("pad", help="padded oneDNN forwards of a model against unpadded")
    pa.add_argument("--model", default="qwen2.5-coder-1.5b")
    pa.add_argument("--k", type=int, default=6)
    pa.add_argument("--repeats", type=int, default=12)
    pa.add_argument("--threads", type=int, default=2)
    pa.add_argument("--decode", type=int, default=32, help="greedy tokens compared across settings")
    pa.set_defaults(func=pad)
    a = ap.parse_args(argv)
    a.func(a)


if __name__ == "__main__":
    main()
