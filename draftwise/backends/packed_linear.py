"""fp32 linear layers on MKL's packed GEMM or oneDNN's matmul, for short forwards on a CPU.

`F.linear` on a CPU sends a few rows through MKL's plain sgemm, whose cost rises in steps with
the row count here (1–3 rows ≈ 1 unit, 4–6 ≈ 2, 7–9 ≈ 3, 10–12 ≈ 4: a 1536→8960 projection took
1.0 / 2.1 / 3.0 / 4.0 ms for 1 / 4 / 8 / 10 rows on this project's 2-core machine). A verification
forward of D + 1 tokens is exactly such a call, so on torch it cost ~3× a plain step at D = 10.
MKL's packed GEMM (`cblas_sgemm_pack` once at load, `cblas_sgemm_compute` per call; the op
PyTorch's inductor emits for frozen fp32 linears) keeps the cost nearly flat up to 16 rows
(1.05 / 1.07 / 1.5 / 1.74 ms for 1 / 4 / 10 / 16 rows), which is what speculation needs.

On the Intel Xeon machine it is also batch-invariant: a row's result does not depend on how many
rows share the call (checked in tests/test_packed_linear.py), so a token scored inside a
verification forward gets the same projections as when decoded alone — fewer near-tie divergences
from plain decoding. On 2 AMD EPYC cores it is not (a call of 11 rows differed from 11 one-row
calls in the last bits): MKL picks its kernels per CPU.

For one or two rows the packed layout is ~10% slower than plain sgemm over a whole model (it
reads ~1.4× the bytes: MKL pads each packed matrix), so there are two modes:
- "hybrid" (default): keep the original weight too; calls of 3–32 rows (verification forwards) go
  to the packed GEMM, the rest (plain steps, a draft model's steps, prefill, where plain sgemm is
  as fast or faster) to `F.linear`. Fastest at every length; costs the packed copy in memory
  (~1.2× the fp32 weights, 8.3 GB for Qwen-1.5B).
- "full": packed only, the originals freed. Batch-invariant at every length where MKL's packed
  kernels are (the Xeon; not the EPYC, above), so a token scored in a verification forward gets
  the same projections as when decoded alone; ~10% slower plain steps.
- "onednn": every linear on oneDNN's matmul over a weight reordered for it
  (`mkldnn::_reorder_linear_weight` + `mkldnn::_linear_pointwise`, the ops inductor emits for frozen
  fp32 linears without MKL), originals freed. On the 2 AMD EPYC cores MKL takes a slow path: a
  1536 -> 8960 projection cost 3.5 / 7.7 / 11.4 / 8.6 ms for 1 / 2 / 3 / 16 rows on sgemm and
  2.8 / 5.2 / 7.7 / 8.1 packed, but 2.4 / 2.6 / 2.1 / 3.0 on oneDNN (benchmarks/kernels.py linear,
  docs/design.md, Measured cost curves): faster plain steps and a nearly flat verification curve. Not batch-invariant
  at that size (its kernels depend on the row count).
With no mode requested, `choose_mode` times oneDNN against MKL on one of the model's own layers and
takes oneDNN where it is clearly faster at both 1 and 16 rows, else the memory-based MKL choice.
A tied output projection is packed as its own copy; the embedding keeps the original.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from draftwise.machine import cpu_model

PACK_ROWS = 16  # the row count MKL is told to pack for; larger calls still compute correctly
HYBRID_ROWS = (4, 32)  # hybrid mode: only calls with this many rows use the packed GEMM
MODES = ("off", "hybrid", "full", "onednn")
CLEARLY = 0.9  # oneDNN is chosen only where it takes at most this share of MKL's time (choose_mode)
MIN_TIMED = 2**20  # models whose largest linear is smaller are not timed (tests' tiny models: no choice by noise)
_CHOSEN: dict[tuple[int, int], bool] = {}  # layer shape -> oneDNN faster: measured once per process
PAD_MAX, PAD_REPEATS, PAD_CLEARLY = 8, 5, 0.95  # choose_pad: rows tried, passes each, the gain it needs
_PADS: dict[tuple, tuple[int, ...]] = {}  # the model's linear shapes -> pad: measured once per process


def available() -> bool:
    return bool(torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class _ReorderedLinear(nn.Module):
    """y = x @ W.T + b with W held in a kernel's own layout (`reorder(W, PACK_ROWS)`); inference only."""
    kernel = ""

    def __init__(self, linear: nn.Linear, reorder):
        super().__init__()
        w = linear.weight.detach()  # [N, K]
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])
        self.register_buffer("packed", reorder(w.contiguous(), PACK_ROWS), persistent=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.kernel}"


class PackedLinear(_ReorderedLinear):
    """W in MKL's packed layout; with `keep_original`, the original too, for calls outside HYBRID_ROWS."""
    kernel = "mkl"

    def __init__(self, linear: nn.Linear, keep_original: bool = False):
        super().__init__(linear, torch.ops.mkl._mkl_reorder_linear_weight)
        # `_mkl_linear` reads only the sizes and dtype of the original weight on the packed path
        # (it is taken only when its batch argument equals the row count, which forward ensures)
        self.register_buffer("shape_only", torch.zeros(1).expand(self.out_features, self.in_features),
                             persistent=False)
        self.weight = nn.Parameter(linear.weight.detach(), requires_grad=False) if keep_original else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        rows = x.numel() // self.in_features
        if self.weight is not None and not HYBRID_ROWS[0] <= rows <= HYBRID_ROWS[1]:
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.shape_only, self.bias, rows)


class OneDNNLinear(_ReorderedLinear):
    """W reordered for oneDNN's matmul. `pad[m]`: a call of m rows runs as a call of pad[m] rows,
    the extra rows zeros, cut off after (choose_pad; () or m past its end: as it comes). Each output
    row depends only on its own input row, so padding changes which kernel computes it, not what."""
    kernel = "onednn"
    pad: tuple[int, ...] = ()

    def __init__(self, linear: nn.Linear):
        super().__init__(linear, torch.ops.mkldnn._reorder_linear_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        rows = x.numel() // self.in_features
        to = self.pad[rows] if rows < len(self.pad) else rows
        if to <= rows:
            return self._matmul(x.contiguous())
        xp = nn.functional.pad(x.reshape(rows, self.in_features), (0, 0, 0, to - rows))  # [to, K], zero rows after
        return self._matmul(xp)[:rows].reshape(*x.shape[:-1], self.out_features)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module, mode: str = "hybrid") -> int:
    """Replace every fp32 `nn.Linear` of a CPU model by a PackedLinear (or OneDNNLinear), in place;
    returns how many. Outside "hybrid" layers are packed one at a time and their weights dropped,
    so memory peaks at one layer's copy."""
    if mode not in MODES:
        raise ValueError(f"packed linear mode must be one of {MODES}, got {mode!r}")
    if mode == "off" or not (onednn_available() if mode == "onednn" else available()):
        return 0
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and isinstance(emb, nn.Embedding):  # untie: the embedding keeps its weight
        emb.weight = nn.Parameter(emb.weight.detach(), requires_grad=False)
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, OneDNNLinear(child) if mode == "onednn"
                        else PackedLinear(child, keep_original=mode == "hybrid"))
                count += 1
    if hasattr(model, "config"):
        model.config.tie_word_embeddings = False  # the output projection is now its own copy
    return count


def choose_mode(model: nn.Module, requested: str | None = None) -> str:
    """The requested mode, else DRAFTWISE_TORCH_PACK, else measured: "onednn" where it is clearly
    faster than MKL on this CPU (_onednn_faster), else "hybrid" when the packed copy (~1.4× the
    linear weights) fits in available memory with 2 GiB to spare, "full" otherwise. Requested
    "single" (a draft model, stepped one token at a time): "onednn" where it is faster, else "off"."""
    mode = requested or os.environ.get("DRAFTWISE_TORCH_PACK") or None
    if mode in ("0", "1"):
        mode = {"0": "off", "1": "hybrid"}[mode]
    if mode is not None and mode != "single":
        if mode not in MODES:
            raise ValueError(f"packed linear mode must be one of {MODES} (or single), got {mode!r}")
        return mode
    if _onednn_faster(model):
        return "onednn"
    if mode == "single":
        return "off"
    linear_bytes = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    return "hybrid" if 1.4 * linear_bytes + 2 * 2**30 < _available_bytes() else "full"


def _onednn_faster(model: nn.Module, repeats: int = 5) -> bool:
    """Time one of the model's largest linears (not the output projection) at 1 and 16 rows on
    oneDNN and on MKL (sgemm at 1 row, the better of sgemm and packed at 16); True where oneDNN
    takes at most CLEARLY of MKL's time at both; measured once per layer shape and process. Models
    too small to time reliably: False."""
    if not onednn_available():
        return False
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    lins = [m for m in model.modules() if type(m) is nn.Linear and m is not out_emb
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if not lins or max(m.weight.numel() for m in lins) < MIN_TIMED:
        return False
    lin = max(lins, key=lambda m: m.weight.numel())
    shape = tuple(lin.weight.shape)
    if shape not in _CHOSEN:  # two loads of one model in a process get the same kernels
        _CHOSEN[shape] = _time_onednn(lin, repeats)
    return _CHOSEN[shape]


def _time_onednn(lin: nn.Linear, repeats: int) -> bool:
    one = OneDNNLinear(lin)
    mkl = {1: [lin], 16: [lin] + ([PackedLinear(lin)] if available() else [])}  # nn.Linear: sgemm
    with torch.inference_mode():
        for rows, fs in mkl.items():
            x = torch.randn(rows, lin.in_features)
            if _best_s(one, x, repeats) > CLEARLY * min(_best_s(f, x, repeats) for f in fs):
                return False
    return True


def _best_s(f, x: torch.Tensor, repeats: int) -> float:
    """Fastest of `repeats` timed calls, after one warm-up."""
    f(x)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x)
        best = min(best, time.perf_counter() - t0)
    return best


def set_pad(model: nn.Module, pad: tuple[int, ...]) -> None:
    """Every OneDNNLinear of the model pads a call of m rows to pad[m] rows (OneDNNLinear.pad)."""
    for m in model.modules():
        if isinstance(m, OneDNNLinear):
            m.pad = tuple(pad)


def choose_pad(model: nn.Module, cache: Path | None = None) -> tuple[int, ...]:
    """How a model's oneDNN linears pad short calls, measured (or DRAFTWISE_TORCH_PAD: "off", or N:
    calls of fewer than N rows padded to N). One pass of m rows through every linear of the model
    (weights streamed from memory, as in a forward) is timed for m = 1..PAD_MAX, interleaved, the
    median of PAD_REPEATS; a call of m rows is padded to the m' >= m whose pass is fastest, where it
    takes at most PAD_CLEARLY of m's time. On 2 AMD EPYC cores oneDNN's 1- and 2-row kernels are
    slower than its 3-6-row ones (docs/data/linear_kernels_epyc.txt). Models too small to time: ().
    `cache`: a directory where the choice is kept per CPU, torch, threads and the model's shapes
    (like the forward-cost profiles: every later load, and the profile keyed by it, agree)."""
    env = os.environ.get("DRAFTWISE_TORCH_PAD")
    if env:
        if env in ("off", "0"):
            return ()
        if not env.isdigit():
            raise ValueError(f"DRAFTWISE_TORCH_PAD must be off or a row count, got {env!r}")
        n = int(env)
        return (0,) + (n,) * (n - 1) if n > 1 else ()
    lins = [m for m in model.modules() if isinstance(m, OneDNNLinear)]
    if not lins or max(m.in_features * m.out_features for m in lins) < MIN_TIMED:
        return ()
    sig = tuple((m.in_features, m.out_features) for m in lins)
    if sig in _PADS:
        return _PADS[sig]
    path = None if cache is None else cache / f"pad-{_pad_key(sig)}.json"
    if path is not None and path.is_file():
        try:
            _PADS[sig] = tuple(int(m) for m in json.loads(path.read_text())["pad"])
            return _PADS[sig]
        except (ValueError, KeyError, TypeError):  # a torn or foreign file: measured again below
            pass
    t = pass_times(lins, range(1, PAD_MAX + 1), PAD_REPEATS)
    _PADS[sig] = pad_from_times(t)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pad": list(_PADS[sig]), "pass_ms": {m: 1e3 * s for m, s in t.items()}}))
    return _PADS[sig]


def _pad_key(sig: tuple) -> str:
    ident = [cpu_model(), os.cpu_count(), torch.__version__, torch.get_num_threads(), list(sig)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def pad_from_times(t: dict[int, float]) -> tuple[int, ...]:
    """pad[m] for m < max(t): the m' >= m of least time t[m'], where t[m'] <= PAD_CLEARLY t[m]."""
    ms = sorted(t)
    pad = [0]
    for m in range(1, ms[-1]):
        best = min((x for x in ms if x >= m), key=lambda x: (t[x], x))
        pad.append(best if t[best] <= PAD_CLEARLY * t[m] else m)
    while len(pad) > 1 and pad[-1] == len(pad) - 1:  # row counts past the last padded one: as they come
        pad.pop()
    return tuple(pad) if len(pad) > 1 else ()


def pass_times(lins: list, rows, repeats: int) -> dict[int, float]:
    """Median seconds of one call of m rows through every linear in `lins` (unpadded), per m."""
    rows = list(rows)
    xs = {(m, k): torch.randn(m, k) for m in rows for k in {lin.in_features for lin in lins}}
    out: dict[int, list[float]] = {m: [] for m in rows}
    with torch.inference_mode():
        for lin in lins[:4]:  # warm the kernels for every shape and row count
            for m in rows:
                lin._matmul(xs[(m, lin.in_features)])
        for _ in range(repeats):
            for m in rows:
                t0 = time.perf_counter()
                for lin in lins:
                    lin._matmul(xs[(m, lin.in_features)])
                out[m].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in out.items()}


def _available_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")
