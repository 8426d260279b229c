"""The generation engine: prefill, then propose -> verify -> commit until a stop.

Plain decoding is the same loop with no drafter (every step is a plain step), so the baseline and
speculation share every other line.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from draftwise.backends.base import ModelRunner
from draftwise.drafters.base import Drafter, Proposal
from draftwise.output import OutputTracker
from draftwise.planner import Plan, Planner
from draftwise.sampling import SamplingParams, sample, target_top, warp
from draftwise.stats import SpecStats
from draftwise.tokenizer import Tokenizer
from draftwise.verify import VerifyResult, greedy_verify, rejection_sample

_NO_DRAFT = Proposal([])


@dataclass(slots=True)
class Chunk:
    """Tokens committed by one step, delivered as soon as they are committed."""
    token_ids: list[int]
    text: str  # the text delta these tokens complete (may lag a token behind a split character)
    time_s: float  # since the request started
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    result: GenerationResult | None = None  # on the last chunk
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asked for them


@dataclass(slots=True)
class TokenLogprobs:
    """The target's log-probability of an emitted token and its top alternatives, from the raw
    logits (before temperature/top-k/top-p, as vLLM's default `raw_logprobs`)."""
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first

    @staticmethod
    def of(logits: torch.Tensor, tokens: list[int], k: int) -> list["TokenLogprobs"]:
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
    # per verification round: (output position of its first draft token, proposed, accepted)
    rounds: list[tuple[int, int, int]] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # the server's, when asked for
    # with `auto`, per step: (D planned, proposed, tokens the draft model caught up on, predicted
    # and measured ms of the step, the planner's ms of one draft step after it: its online state)
    plans: list[tuple[int, int, int, float, float, float]] | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_tokens": self.prompt_tokens,
                "finish_reason": self.finish_reason, "ttft_s": self.ttft_s, "stats": self.stats.to_dict()}


def check_request(target: ModelRunner, drafter: Drafter | None, prompt_ids: list[int], max_tokens: int,
                  d_max: int) -> None:
    """ValueError naming the problem for a request that cannot run (shared with the scheduler)."""
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


class Engine:
    """`num_draft_tokens` is a fixed D, or "auto": the planner picks D (0 included) every round.
    `sampler` is the acceptance rule at temperature > 0 (swappable only so that `draftwise
    verify` can show it catches a wrong one). With `reuse_prefix`, requests run one at a time keep
    the last prompt's KV state (target and drafter) for the next request with the same prompt."""

    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, drafter: Drafter | None = None,
                 num_draft_tokens: int | str = 4, sampler=rejection_sample, reuse_prefix: bool = False,
                 planner: Planner | None = None):
        self.target, self.tokenizer, self.drafter, self.planner = target, tokenizer, drafter, planner
        self.num_draft_tokens = self._check_d(num_draft_tokens)
        self.sampler, self.reuse_prefix = sampler, reuse_prefix
        self._keys = itertools.count()
        self._prefix: tuple[list[int], int, int, torch.Tensor] | None = None  # ids, seq, key, logits

    def generate(self, prompt: str | list[int], **kwargs) -> GenerationResult:
        """Run a request to its end; kwargs as for stream()."""
        for chunk in self.stream(prompt, **kwargs):
            if chunk.result is not None:
                return chunk.result
        raise RuntimeError("generation ended without a result")

    def stream(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               stop: list[str] | None = None, num_draft_tokens: int | str | None = None) -> Iterator[Chunk]:
        params = SamplingParams(temperature, top_p, top_k, seed)
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        d = self.num_draft_tokens if num_draft_tokens is None else self._check_d(num_draft_tokens)
        auto = d == "auto" and self.drafter is not None
        d_max = self.planner.max_draft if auto else (0 if d == "auto" else d)
        self._check_request(prompt_ids, max_tokens, d_max)
        if self.drafter is None:
            d_max = 0
        return self._run(prompt_ids, max_tokens, params, list(stop or []), d_max, auto)

    @property
    def max_draft(self) -> int:
        """The most draft tokens a round may propose (what the context must leave room for)."""
        if self.drafter is None:
            return 0
        return self.planner.max_draft if self.num_draft_tokens == "auto" else self.num_draft_tokens

    def _check_d(self, d: int | str) -> int | str:
        if d == "auto":
            if self.planner is None:
                raise ValueError("num_draft_tokens='auto' needs a planner (draftwise.build makes one)")
            return d
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"num_draft_tokens must be an integer >= 0 or 'auto', got {d!r}")
        return d

    def _check_request(self, prompt_ids: list[int], max_tokens: int, d_max: int) -> None:
        check_request(self.target, self.drafter, prompt_ids, max_tokens, d_max)

    def _run(self, prompt_ids: list[int], max_tokens: int, params: SamplingParams,
             stop: list[str], d_max: int, auto: bool = False) -> Iterator[Chunk]:
        stats = SpecStats()
        gen = None if params.greedy else params.generator()
        out = OutputTracker(self.tokenizer, max_tokens, stop)
        t0 = time.perf_counter()
        seq, key, logits = self._open(prompt_ids)  # logits: [1, V] at the prompt's last token
        prompt_logits = logits.clone() if self.reuse_prefix else None
        times: list[float] = []
        rounds: list[tuple[int, int, int]] = []
        plans: list[tuple] | None = [] if auto else None
        ttft, done = 0.0, False
        req = self.planner.new_request(max_tokens) if auto else None
        try:
            first = self._plain_token(logits, params, gen)
            stats.plain_steps += 1
            stats.prefill_s = time.perf_counter() - t0
            if req is not None:  # the prediction covers the whole request, prefill included
                stats.predicted_s = stats.predicted_plain_s = stats.prefill_s
            ctx = prompt_ids + [first]  # invariant: the target KV holds ctx[:-1]
            chunk = self._commit(out, [first], stats, t0, times, None)
            ttft = chunk.time_s
            while out.finish_reason is None:
                yield chunk
                # propose
                room = out.remaining - 1  # the round always emits one token besides the accepted
                t = time.perf_counter()
                if req is None:
                    d, plan, shadow = min(d_max, room), None, None
                    prop = self.drafter.propose(key, ctx, d, params, gen) if d > 0 else _NO_DRAFT
                else:
                    prop, plan, shadow = self._planned_proposal(req, key, ctx, room, params, gen)
                t_draft = time.perf_counter()
                stats.draft_s += t_draft - t
                # verify
                feed = [ctx[-1]] + prop.tokens
                logits = self.target.forward([seq], [feed], [len(feed)])[0]  # [d+1, V]
                t_fwd = time.perf_counter() - t_draft
                res = self._verify(logits, prop, params, gen)
                self.target.truncate(seq, len(ctx) + res.num_accepted)  # drop rejected draft KV
                stats.verify_s += time.perf_counter() - t_draft
                # commit
                if prop.tokens:
                    stats.record_round(len(prop.tokens), res.num_accepted)
                    rounds.append((len(out.token_ids), len(prop.tokens), res.num_accepted))
                else:
                    stats.plain_steps += 1
                ctx += res.tokens
                chunk = self._commit(out, res.tokens, stats, t0, times, bool(prop.tokens))
                if req is not None:
                    t_round = time.perf_counter() - t
                    self._learn(req, plan, prop, res, shadow, logits, params, stats,
                                (len(feed), t_fwd, t_draft - t, t_round))
                    plans.append((plan.d, len(prop.tokens), plan.behind if plan.d and not self.drafter.cheap else 0,
                                  round(1e3 * (plan.seconds or 1.0 / plan.plain_rate), 1),
                                  round(1e3 * t_round, 1), round(1e3 * self.planner.draft_cost(1), 1)))
            if req is not None:
                self.planner.finish(req)
            stats.wall_s = time.perf_counter() - t0
            stats.other_s = stats.wall_s - stats.prefill_s - stats.draft_s - stats.verify_s
            chunk.result = GenerationResult(out.text, out.token_ids, len(prompt_ids), out.finish_reason,
                                            stats, ttft, times, rounds, plans=plans)
            done = True
        finally:  # also runs when the consumer stops early (a client disconnects)
            self._close(seq, key, prompt_ids, prompt_logits if done else None)
        yield chunk

    def release(self) -> None:
        """Free the prompt state kept by `reuse_prefix` (target and drafter sequences)."""
        if self._prefix is not None:
            ids, seq, key, _ = self._prefix
            self._prefix = None
            self._close(seq, key, ids, None)

    def _open(self, prompt_ids: list[int]) -> tuple[int, int, torch.Tensor]:
        if self._prefix is not None:
            ids, seq, key, logits = self._prefix
            self._prefix = None
            if ids == prompt_ids:  # the drafter rolls itself back to the prompt on its next propose
                return seq, key, logits.clone()
            self._close(seq, key, ids, None)
        seq, key = self.target.new_sequence(), next(self._keys)
        try:
            return seq, key, self.target.forward([seq], [prompt_ids], [1])[0]  # [1, V]
        except BaseException:
            self.target.free(seq)
            raise

    def _close(self, seq: int, key: int, prompt_ids: list[int], keep_logits: torch.Tensor | None) -> None:
        """Free the request's KV state, or keep it for the next request with this prompt."""
        if keep_logits is not None:
            self.target.truncate(seq, len(prompt_ids))
            self._prefix = (list(prompt_ids), seq, key, keep_logits)
            return
        self.target.free(seq)
        if self.drafter is not None:
            self.drafter.release(key)

    def _commit(self, out: OutputTracker, tokens: list[int], stats: SpecStats, t0: float,
                times: list[float], from_round: bool | None) -> Chunk:
        kept, delta = out.add(tokens)
        stats.emitted_tokens += len(kept)
        stats.discarded_tokens += len(tokens) - len(kept)
        if from_round:
            stats.round_emitted_tokens += len(kept)
        now = time.perf_counter() - t0
        times.append(now)
        return Chunk(kept, delta, now, out.finish_reason)

    def _plain_token(self, logits: torch.Tensor, params: SamplingParams, gen) -> int:
        if params.greedy:
            return int(logits[-1].argmax())
        return sample(warp(logits[-1:], params)[0], gen)

    def _planned_proposal(self, req, key: int, ctx: list[int], room: int, params: SamplingParams, gen):
        """(proposal, plan, shadow): a cheap drafter proposes first and the planner picks how many
        of its tokens to verify (its unverified first token, the shadow, is scored after a plain
        step); a draft model is asked for the planner's D only, so at D = 0 it is not fed at all."""
        if self.drafter.cheap:
            cand = self.drafter.propose(key, ctx, min(self.planner.max_draft, room), params, gen)
            plan = self.planner.plan(req, 1, available=len(cand.tokens))
            prop = Proposal(cand.tokens[:plan.d], None if cand.probs is None else cand.probs[:plan.d])
            return prop, plan, (cand.tokens[0] if cand.tokens and plan.d == 0 else None)
        behind = self.drafter.pending(key, ctx)
        plan = self.planner.plan(req, 1, available=room, behind=behind)
        plan.behind = behind
        if plan.d == 0:
            return _NO_DRAFT, plan, None
        return self.drafter.propose(key, ctx, plan.d, params, gen, plan.stop), plan, None

    def _learn(self, req, plan: Plan, prop: Proposal, res: VerifyResult, shadow: int | None,
               logits: torch.Tensor, params: SamplingParams, stats: SpecStats,
               times: tuple[int, float, float, float]) -> None:
        """Feed the round's outcome and measured times back to the planner."""
        k, t_fwd, t_draft, t_round = times
        # the planner's predicted seconds for the tokens this round emitted, and for plain steps
        # emitting them (the round's planned E[N] would count tokens an early stop never drafted)
        stats.predicted_s += len(res.tokens) / plan.rate
        stats.predicted_plain_s += len(res.tokens) / plan.plain_rate
        top = None if self.drafter.cheap else target_top(logits, len(prop.tokens), res.num_accepted)
        self.planner.commit(req, plan, len(prop.tokens), res.num_accepted, len(res.tokens), prop.confidence,
                            prop.stop_confidence, t_round, top)
        if shadow is not None:  # P(accept) of the unverified token: p(x) at the plain step's position
            p = 1.0 if params.greedy and int(logits[0].argmax()) == shadow else 0.0
            if not params.greedy:
                p = float(warp(logits[:1], params)[0, shadow])
            self.planner.shadow(req, p)
        self.planner.observe_times(k, 1, t_fwd, prop.forwards or len(prop.tokens), plan.behind, t_draft,
                                   t_round - t_fwd - t_draft)

    def _verify(self, logits: torch.Tensor, prop: Proposal, params: SamplingParams, gen) -> VerifyResult:
        draft = torch.tensor(prop.tokens, dtype=torch.long)  # [d]
        if params.greedy:
            return greedy_verify(logits, draft)
        p = warp(logits, params)  # [d+1, V]
        return self.sampler(p, prop.draft_probs(p.shape[1]), draft, gen)
