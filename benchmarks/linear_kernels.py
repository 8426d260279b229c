"""Cost of one fp32 linear layer against its row count, per kernel, on this CPU.

A verification forward of D + 1 tokens sends D + 1 rows through every linear layer; how that cost
grows with the row count decides what speculation can gain on torch. This times one Qwen-1.5B
MLP projection (1536 -> 8960 by default) for 1..17 rows through
- `sgemm`: `F.linear` (MKL's sgemm in the PyTorch CPU wheel),
- `mkl_packed`: MKL's packed GEMM (`_mkl_reorder_linear_weight` + `_mkl_linear`, packed_linear.py),
- `onednn`: oneDNN's matmul on a weight reordered for it (`mkldnn._reorder_linear_weight` +
  `mkldnn._linear_pointwise`, the op inductor emits for frozen linears without MKL),
interleaved per repeat so a slow second of the machine hits all three alike.

    .venv/bin/python benchmarks/linear_kernels.py [--in 1536 --out 8960 --repeats 30 --threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from draftwise.backends import packed_linear


def kernels(w: torch.Tensor) -> dict:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w
    out = {"sgemm": lin}  # nn.Linear: F.linear, MKL's sgemm
    if packed_linear.available():
        out["mkl_packed"] = packed_linear.PackedLinear(lin)  # packed only: every row count on MKL's packed GEMM
    if packed_linear.onednn_available():
        out["onednn"] = packed_linear.OneDNNLinear(lin)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in", dest="k_in", type=int, default=1536)
    ap.add_argument("--out", dest="n_out", type=int, default=8960)
    ap.add_argument("--rows", type=int, default=17)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
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


if __name__ == "__main__":
    main()
