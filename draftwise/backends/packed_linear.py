"""fp32 linear layers on MKL's packed GEMM, for short forwards on a CPU.

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
A tied output projection is packed as its own copy; the embedding keeps the original.
"""
from __future__ import annotations

import os

import torch
from torch import nn

PACK_ROWS = 16  # the row count MKL is told to pack for; larger calls still compute correctly
HYBRID_ROWS = (4, 32)  # hybrid mode: only calls with this many rows use the packed GEMM
MODES = ("off", "hybrid", "full")


def available() -> bool:
    return bool(torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W held in MKL's packed layout; inference only."""

    def __init__(self, linear: nn.Linear, keep_original: bool = False):
        super().__init__()
        w = linear.weight.detach()  # [N, K]
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])
        self.register_buffer("packed", torch.ops.mkl._mkl_reorder_linear_weight(w.contiguous(), PACK_ROWS),
                             persistent=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        # `_mkl_linear` reads only the sizes and dtype of the original weight on the packed path
        # (it is taken only when its batch argument equals the row count, which forward ensures)
        self.register_buffer("shape_only", torch.zeros(1).expand(self.out_features, self.in_features),
                             persistent=False)
        self.weight = nn.Parameter(w, requires_grad=False) if keep_original else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        rows = x.numel() // self.in_features
        if self.weight is not None and not HYBRID_ROWS[0] <= rows <= HYBRID_ROWS[1]:
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.shape_only, self.bias, rows)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=mkl"


def pack_linears(model: nn.Module, mode: str = "hybrid") -> int:
    """Replace every fp32 `nn.Linear` of a CPU model by a PackedLinear, in place; returns how many.
    In "full" mode layers are packed one at a time and their weights dropped, so memory peaks at
    one layer's copy."""
    if mode not in MODES:
        raise ValueError(f"packed linear mode must be one of {MODES}, got {mode!r}")
    if mode == "off" or not available():
        return 0
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and isinstance(emb, nn.Embedding):  # untie: the embedding keeps its weight
        emb.weight = nn.Parameter(emb.weight.detach(), requires_grad=False)
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child, keep_original=mode == "hybrid"))
                count += 1
    if hasattr(model, "config"):
        model.config.tie_word_embeddings = False  # the output projection is now its own copy
    return count


def choose_mode(model: nn.Module, requested: str | None = None) -> str:
    """The requested mode, else DRAFTWISE_TORCH_PACK, else "hybrid" when the packed copy (~1.4×
    the linear weights) fits in available memory with 2 GiB to spare, "full" otherwise."""
    mode = requested or os.environ.get("DRAFTWISE_TORCH_PACK") or None
    if mode in ("0", "1"):
        mode = {"0": "off", "1": "hybrid"}[mode]
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"packed linear mode must be one of {MODES}, got {mode!r}")
        return mode
    linear_bytes = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is nn.Linear)
    return "hybrid" if 1.4 * linear_bytes + 2 * 2**30 < _available_bytes() else "full"


def _available_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")
