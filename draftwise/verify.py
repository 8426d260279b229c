"""Verification of a draft against the target: pure functions, randomness passed in.

Vocabulary, fixed here and used with exactly these meanings in code, stats and docs:

- **proposed**: the D draft tokens a drafter offers for one verification round.
- **accepted**: the proposed tokens the target keeps; always a prefix of the draft. Token x at
  draft position i is accepted with probability min(1, p_i(x) / q_i(x)) (greedy: x == argmax p_i).
- **recovered**: the token the target emits at the first rejection, drawn from
  norm(max(0, p_i - q_i)) (greedy: argmax p_i). The rest of the draft is dropped.
- **bonus**: the token drawn from p_D when all D proposed tokens were accepted.
- **emitted**: what a round hands to the output: the accepted tokens, then one recovered or bonus
  token, so num_accepted + 1 tokens. A plain step (no draft) emits one token.
- **discarded**: emitted tokens cut off because a stop (EOS, stop string, max_tokens) fell inside
  the round; they are produced by verification but never delivered.

p are the target's probabilities and q the drafter's, both after the same temperature / top-k /
top-p warping (`draftwise.sampling.warp`). Resampling from p instead of the residual at a
rejection would bias the output; the residual is what keeps the target distribution exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class VerifyResult:
    tokens: list[int]  # emitted: accepted draft tokens + one recovered or bonus token
    num_accepted: int
    num_proposed: int

    @property
    def bonus(self) -> bool:
        """True when the last emitted token is a bonus token, False when it is a recovered one."""
        return self.num_accepted == self.num_proposed


def _check(target: torch.Tensor, draft_tokens: torch.Tensor, draft: torch.Tensor | None) -> None:
    if target.dim() != 2 or draft_tokens.dim() != 1:
        raise ValueError(f"expected target [D+1, V] and draft_tokens [D], got {tuple(target.shape)}"
                         f" and {tuple(draft_tokens.shape)}")
    if target.shape[0] != draft_tokens.shape[0] + 1:
        raise ValueError(f"target has {target.shape[0]} rows for {draft_tokens.shape[0]} draft tokens;"
                         " it needs D+1")
    if draft is not None and draft.shape != (draft_tokens.shape[0], target.shape[1]):
        raise ValueError(f"draft_probs {tuple(draft.shape)} must be [D, V] = "
                         f"[{draft_tokens.shape[0]}, {target.shape[1]}]")


def rejection_sample(
    target_probs: torch.Tensor,  # [D+1, V] or [B, D+1, V]
    draft_probs: torch.Tensor,  # [D, V] or [B, D, V]
    draft_tokens: torch.Tensor,  # [D] or [B, D]
    generator: torch.Generator | None,
) -> VerifyResult | list[VerifyResult]:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) over probability tensors.

    Example, V = 2 tokens (A, B), D = 1, draft proposes A with q = (0.8, 0.2), p = (0.5, 0.5):
    A is accepted with probability 0.5 / 0.8 = 0.625; otherwise the recovered token is drawn from
    norm(max(0, p - q)) = (0, 1), i.e. B. P(first = A) = 0.8 * 0.625 = 0.5 = p(A), as required.
    Random draws, in order: D uniforms, then one categorical draw.
    """
    if draft_tokens.dim() == 2:
        return [rejection_sample(t, d, x, generator) for t, d, x in zip(target_probs, draft_probs, draft_tokens)]
    _check(target_probs, draft_tokens, draft_probs)
    d = draft_tokens.shape[0]
    n = first_rejection(target_probs, draft_probs, draft_tokens, generator)
    if n < d:
        residual = (target_probs[n] - draft_probs[n]).clamp_min(0)  # [V]
        if residual.sum() <= 0:  # only reachable through rounding when p == q
            residual = target_probs[n]
        last = torch.multinomial(residual / residual.sum(), 1, generator=generator)
    else:
        last = torch.multinomial(target_probs[d], 1, generator=generator)  # bonus
    tokens = draft_tokens[:n].tolist() + [int(last)]
    return VerifyResult(tokens, n, d)


def first_rejection(
    target_probs: torch.Tensor,  # [D+1, V]
    draft_probs: torch.Tensor,  # [D, V]
    draft_tokens: torch.Tensor,  # [D]
    generator: torch.Generator | None,
) -> int:
    """Index of the first rejected draft token (D if all are accepted); draws D uniforms."""
    d = draft_tokens.shape[0]
    rows = torch.arange(d)
    p = target_probs[rows, draft_tokens]  # [D]
    q = draft_probs[rows, draft_tokens]  # [D]
    u = torch.rand(d, generator=generator, dtype=torch.float64, device=target_probs.device)
    # u < p/q, written without the division; q >= p: always accept.
    accepted = (u * q.double() < p.double()) | (p >= q)
    rejected = torch.nonzero(~accepted)
    return int(rejected[0]) if rejected.numel() else d


def greedy_verify(
    target_logits: torch.Tensor,  # [D+1, V] or [B, D+1, V]
    draft_tokens: torch.Tensor,  # [D] or [B, D]
) -> VerifyResult | list[VerifyResult]:
    """Temperature 0: accept while the draft equals the target argmax, then emit the argmax."""
    if draft_tokens.dim() == 2:
        return [greedy_verify(t, x) for t, x in zip(target_logits, draft_tokens)]
    _check(target_logits, draft_tokens, None)
    d = draft_tokens.shape[0]
    best = target_logits.argmax(dim=-1)  # [D+1]
    mismatch = torch.nonzero(best[:d] != draft_tokens)
    n = int(mismatch[0]) if mismatch.numel() else d
    return VerifyResult(draft_tokens[:n].tolist() + [int(best[n])], n, d)
