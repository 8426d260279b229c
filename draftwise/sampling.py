"""Sampling settings and the logits -> probabilities warp shared by target and drafter."""
from __future__ import annotations

from dataclasses import dataclass

import torch


GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one so small that logits / T overflows to inf (then softmax is NaN):
        below 1e-5 sampling is argmax in all but ties, so it is decoded greedily (as vLLM does)."""
        return self.temperature < GREEDY_BELOW

    def generator(self) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] logits -> [N, V] float32 probabilities after temperature, top-k, then top-p.

    Applied identically to target and draft logits, so p and q live in the same warped space.
    """
    if params.greedy:
        raise ValueError("warp() is for temperature > 0; greedy decoding uses argmax")
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [N, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p)
    return probs


# Candidates per row for top-p: at temperature 0.7 the nucleus of top-p 0.9 / 0.95 held at most
# 141 / 313 tokens over 742 positions of Qwen2.5-Coder-1.5B's logits (EditEval, writing, QA
# prompts); at temperature 1.0, 6-10% of rows held more and are sorted in full (docs/design.md,
# "The decoding loop", has the command).
TOP_P_CANDIDATES = 1024


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] probabilities -> the same with each row kept to the smallest prefix of its tokens in
    descending order whose mass reaches top_p (the first always), renormalised.

    The prefix is found among each row's TOP_P_CANDIDATES most probable tokens (torch.topk: 0.9 ms
    a row of a 152k vocabulary on 2 CPU cores, where sorting it takes 13 ms); a row whose
    candidates carry less than top_p is sorted in full. The kept set is the full sort's: a token
    past the candidates follows a prefix whose mass already reaches top_p, and the cumulative sums
    of the two orders agree on the candidates (up to the order of exactly equal probabilities)."""
    k = min(TOP_P_CANDIDATES, probs.shape[-1])
    vals, order = torch.topk(probs, k, dim=-1)  # [N, k] descending
    out = _keep_prefix(vals, order, top_p, probs)
    full = vals.cumsum(-1)[:, -1] < top_p  # [N] rows whose candidates carry less than top_p
    if bool(full.any()):
        rows = probs[full]
        out[full] = _keep_prefix(*torch.sort(rows, dim=-1, descending=True), top_p, rows)
    return out / out.sum(-1, keepdim=True)


def _keep_prefix(vals: torch.Tensor, order: torch.Tensor, top_p: float, like: torch.Tensor) -> torch.Tensor:
    """Descending (vals, order) [N, k] -> [N, V] zeros but the smallest prefix reaching top_p."""
    drop = (vals.cumsum(-1) - vals) >= top_p
    drop[..., 0] = False  # also when top_p rounds to 0 in float32 (a denormal top_p)
    return torch.zeros_like(like).scatter_(-1, order, vals.masked_fill(drop, 0.0))


def mask_logits(
    logits: torch.Tensor,  # [N, V]
    allowed: torch.Tensor,  # [N, V] bool: a grammar's mask per row (draftwise.grammar)
) -> torch.Tensor:  # [N, V]
    """The logits with every token the mask refuses at -inf: warped, they give the masked,
    renormalised distribution p' (temperature, top-k and top-p then act on the allowed tokens);
    their argmax is the best allowed token."""
    if allowed.shape != logits.shape:
        raise ValueError(f"mask {tuple(allowed.shape)} must match the logits {tuple(logits.shape)}: "
                         "compile the grammar for the target's vocabulary size")
    return logits.masked_fill(~allowed, float("-inf"))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax of [..., V] logits, the first of equal maxima (as torch.argmax); [...] int64.
    On CPU through NumPy: torch's CPU argmax walks a 152k vocabulary in ~0.2 ms a row and its
    threads queue behind a spinning llama.cpp pool; NumPy's single-threaded SIMD one takes ~0.02 ms."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float16, torch.float64):
        return torch.as_tensor(logits.detach().numpy().argmax(-1))
    return logits.argmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One categorical draw from a [V] probability vector."""
    return int(torch.multinomial(probs, 1, generator=generator))


def target_top(logits: torch.Tensor, proposed: int, accepted: int) -> list[float]:
    """The target's own top probability (raw logits, temperature 1) at each position a step's
    verification reached: row j scored draft token j+1, so rows 0..min(accepted+1, proposed)-1,
    or row 0 alone at a plain step. logits: [d+1, V]. The planner learns from these how often a
    draft model agrees with the target (draftwise.planner.Planner.commit)."""
    n = max(min(accepted + 1, proposed), 1)
    return torch.softmax(logits[:n].float(), dim=-1).amax(dim=-1).tolist()  # [n]
