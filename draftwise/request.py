"""What a request gets back: chunks as tokens are committed, and the result with its stats; and
the check that a request can run at all. Shared by the decoding loop and everything that calls it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from draftwise.stats import SpecStats


class Round(NamedTuple):
    """One verification round: the output position of its first draft token, tokens proposed,
    draft tokens accepted, and whether it ended at a rejection (its last token a recovered one)
    rather than with a bonus token (a chain accepted whole, a tree's path to a leaf), and whether
    its draft was a candidate tree."""
    position: int
    proposed: int
    accepted: int
    rejected: bool
    tree: bool = False


class PlanStep(NamedTuple):
    """One step under `auto` (draftwise.policy.PlannedDraftLength): the D planned, tokens proposed,
    tokens the draft model caught up on, the planner's predicted and the measured ms of the step,
    and the planner's ms of one draft step after it (its online state); under `--drafter auto`
    the drafter verified ("none": a plain step)."""
    planned: int
    proposed: int
    behind: int
    predicted_ms: float
    measured_ms: float
    draft_step_ms: float
    drafter: str | None = None


@dataclass(slots=True)
class TokenLogprobs:
    """The target's log-probability of an emitted token and its top alternatives, from the raw
    logits (before temperature/top-k/top-p, as vLLM's default `raw_logprobs`)."""
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first

    @staticmethod
    def of(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
        """logits [n, V] (row i: the distribution token i was drawn from), tokens [n]."""
        lp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
        chosen = lp.gather(1, torch.tensor(tokens).view(-1, 1))[:, 0].tolist()  # [n]
        vals, ids = lp.topk(k, dim=-1)  # [n, k]; k = 0: no alternatives
        return [TokenLogprobs(c, list(zip(i, v))) for c, i, v in zip(chosen, ids.tolist(), vals.tolist())]


@dataclass(slots=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    stats: SpecStats
    ttft_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # when the request asked for them
    plans: list[PlanStep] | None = None  # under `auto`, one per step after the prefill's token

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_tokens": self.prompt_tokens,
                "finish_reason": self.finish_reason, "ttft_s": self.ttft_s, "stats": self.stats.to_dict()}


@dataclass(slots=True)
class Chunk:
    """Tokens committed by one step, delivered as soon as they are committed."""
    token_ids: list[int]
    text: str  # the text delta these tokens complete (may lag a token behind a split character)
    time_s: float  # since the request started
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    result: GenerationResult | None = None  # on the last chunk
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asked for them
    round: Round | None = None  # the verification round that committed them (None: the prefill's token, a plain step)


def check_request(target, drafter, prompt_ids: list[int], max_tokens: int, d_max: int) -> None:
    """ValueError naming the problem for a request that cannot run. `d_max`: the most draft
    tokens a round may propose, which the context must leave room for."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    d = d_max if drafter is not None else 0
    limit = target.max_context
    if drafter is not None and drafter.max_context is not None:
        limit = min(limit, drafter.max_context)
    need = len(prompt_ids) + max_tokens + d
    if need > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) + draft "
                         f"({d}) = {need} exceeds the context of {limit} tokens")
    bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids out of range [0, {target.vocab_size}): {bad[:5]}")


def check_draft_len(d) -> int | str:
    """The one check of a draft length: an integer >= 0, or "auto"."""
    if d == "auto":
        return d
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ValueError(f"num_draft_tokens must be an integer >= 0 or 'auto', got {d!r}")
    return d
