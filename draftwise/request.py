"""A request (what a caller submits), its state while it runs, and what it gets back: chunks as
tokens are committed, and the result with its stats; and the check that a request can run at
all. Shared by the decoding loop and everything that calls it."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from draftwise.output import OutputTracker
from draftwise.sampling import SamplingParams
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


class DecisionLog(NamedTuple):
    """One step under `auto` (draftwise.policy.PlannedDraftLength): the D planned, tokens proposed,
    tokens the draft model caught up on, the planner's predicted and the measured ms of the step,
    and the planner's ms of one draft step after it (its online state); under `--drafter auto`
    the drafter verified ("none": a plain step)."""
    d: int
    proposed: int
    unseen: int
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
    decisions: list[DecisionLog] | None = None  # under `auto`, one per step after the prefill's token

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


@dataclass(slots=True, eq=False)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    deliver: Callable[[Chunk | BaseException], None]  # called from the thread that runs the loop's steps
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # None: the policy's; an integer fixes D (0: speculation off)
    logprobs: int | None = None  # None: none; k >= 0: each token's logprob and its top k alternatives
    private: bool = False  # its text is neither read from nor added to state shared across requests
    prediction: list[int] | None = None  # the expected output (OpenAI's Predicted Outputs), a draft source
    constraint: object = None  # a draftwise.grammar.Grammar the output follows (JSON schema, tools); None: free text
    t0: float = field(default_factory=time.perf_counter)  # arrival; chunk times count from here
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True  # read at the loop's next step


@dataclass(slots=True, eq=False)
class RequestState:
    """A running request, as the loop and the draft-length policy see it."""
    req: Request
    seq: int  # target sequence id
    key: int  # drafter sequence key
    ctx: list[int]  # prompt + committed output; the target KV holds ctx[:-1]
    out: OutputTracker | None = None  # set up inside the request's failure boundary
    gen: torch.Generator | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    times: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    ttft: float = 0.0
    policy: object = None  # the draft-length policy's own per-request state
    decisions: list[DecisionLog] | None = None  # the planner's log, under `auto`
    logprobs: list[TokenLogprobs] | None = None
    prompt_logits: torch.Tensor | None = None  # [1, V] kept with the prompt's KV (draftwise.prefix_reuse)
    wants_features: bool = False  # this step's target forward returns the features its drafter reads
    constraint: object = None  # the grammar's state after the committed output (draftwise.grammar.Constraint)

    def commit(self, tokens: list[int], from_round: bool | None, logprobs: list[TokenLogprobs] | None) -> Chunk:
        """Add tokens to the output (the emitted ones; those past a stop are discarded) and
        record them: the chunk that delivers them. `from_round`: a verification round's."""
        kept, delta = self.out.add(tokens)
        s = self.stats
        s.emitted_tokens += len(kept)
        s.discarded_tokens += len(tokens) - len(kept)
        if from_round:
            s.round_emitted_tokens += len(kept)
        now = time.perf_counter() - self.req.t0
        if not self.times:
            self.ttft = now
        self.times.append(now)
        chunk = Chunk(kept, delta, now, self.out.finish_reason, round=self.rounds[-1] if from_round else None)
        if logprobs is not None:
            chunk.logprobs = logprobs[: len(kept)]
            self.logprobs = self.logprobs or []
            self.logprobs.extend(chunk.logprobs)
        return chunk

    def result(self) -> GenerationResult:
        """A finished request's result; its last chunk's time is its wall time."""
        s = self.stats
        s.wall_s = self.times[-1]
        s.other_s = s.wall_s - s.prefill_s - s.draft_s - s.verify_s
        s.grammar_s = self.constraint.seconds if self.constraint is not None else 0.0
        return GenerationResult(self.out.text, self.out.token_ids, len(self.req.prompt_ids), self.out.finish_reason,
                                s, self.ttft, self.times, self.rounds, self.logprobs, self.decisions)

    @property
    def delivered(self) -> list[int] | None:
        """The prompt and the output delivered (None before set-up): ctx also holds a round's
        verified tokens past an EOS or a stop string, which no drafter may learn as the answer's
        continuation."""
        return None if self.out is None else self.ctx[: len(self.req.prompt_ids) + len(self.out.token_ids)]


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


def check_prediction(target, prompt_ids: list[int], prediction: list[int] | None) -> None:
    """ValueError naming the problem for a prediction the context cannot hold beside the prompt
    (its rejected tokens count against the context, as OpenAI's do) or with unknown token ids."""
    if not prediction:
        return
    need = len(prompt_ids) + len(prediction)
    if need > target.max_context:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + prediction ({len(prediction)} tokens) = {need} "
                         f"exceeds the context of {target.max_context} tokens; send a shorter prediction")
    bad = [t for t in prediction if not 0 <= t < target.vocab_size]
    if bad:
        raise ValueError(f"prediction token ids out of range [0, {target.vocab_size}): {bad[:5]}")


def check_draft_len(d) -> int | str:
    """The one check of a draft length: an integer >= 0, or "auto"."""
    if d == "auto":
        return d
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ValueError(f"num_draft_tokens must be an integer >= 0 or 'auto', got {d!r}")
    return d
