"""The decoding loop: propose -> verify -> commit, for one request or many (continuous batching).
All requests in flight share one target forward per step; requests join and leave between steps.

    admit:   waiting -> running; each prompt is prefilled in its own forward, exactly as a lone
             request is (or its KV kept from the previous request with the same prompt), and its
             first token committed
    propose: per running request D from the draft-length policy (draftwise.policy: fixed, or
             `auto`), then the drafter (a draft model: every request's draft in lockstep)
    verify:  ONE target forward over all running sequences, each fed [last] + its draft;
             greedy_verify / rejection_sample per sequence; truncate each rejected tail
    commit:  stops, stats, a Chunk to the request; finished requests free their KV state

`step()` runs one such step in the caller's thread: `draftwise.engine.Engine` calls it for one
request at a time, the server's thread (`run`) for all its clients. Callers hand in `Request`s
with `submit` (bounded: `QueueFull` when the waiting queue is full) and get events through the
request's `deliver` callback: a `Chunk` per step (the last one carries the `GenerationResult`)
or an exception. `Request.cancel()` frees the request's KV state at the start of the next step.

Each sequence keeps its own context, accepted counts and KV state, so a request's greedy output
depends on the others only through the numerics of the shared forward (docs/design.md).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftwise.backends.base import ModelRunner
from draftwise.drafters.base import Drafter, Proposal
from draftwise.output import OutputTracker
from draftwise.policy import DraftPolicy, FixedDraftLength, RoundOutcome, StepTimes
from draftwise.request import (Chunk, GenerationResult, PlanStep, Round, TokenLogprobs, check_draft_len,
                               check_request)
from draftwise.sampling import SamplingParams, sample, warp
from draftwise.stats import SpecStats
from draftwise.verify import VerifyResult, greedy_verify, rejection_sample

NO_DRAFT = Proposal([])


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: the caller should answer 429."""


@dataclass(slots=True, eq=False)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    deliver: Callable[[Chunk | BaseException], None]  # called from the thread that runs step()
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # None: the policy's; an integer fixes D (0: speculation off)
    logprobs: int | None = None  # None: none; k >= 0: each token's logprob and its top k alternatives
    t0: float = field(default_factory=time.perf_counter)  # arrival; chunk times count from here
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True  # read at the next step


@dataclass(slots=True, eq=False)
class RequestState:
    """A running request, as the draft-length policy sees it."""
    req: Request
    seq: int  # target sequence id
    key: int  # drafter sequence key
    ctx: list[int]  # prompt + committed output; the target KV holds ctx[:-1]
    out: OutputTracker
    gen: torch.Generator | None
    stats: SpecStats = field(default_factory=SpecStats)
    times: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    ttft: float = 0.0
    policy: object = None  # the draft-length policy's own per-request state
    plans: list[PlanStep] | None = None  # the planner's log, under `auto`
    logprobs: list[TokenLogprobs] | None = None
    prompt_logits: torch.Tensor | None = None  # [1, V] kept with the prompt's KV (reuse_prefix)


@dataclass(slots=True)
class _Prefix:
    """A finished request's prompt KV, kept for the next request with the same prompt."""
    ids: list[int]
    seq: int
    key: int
    logits: torch.Tensor  # [1, V] at the prompt's last token


class NullObserver:
    """What the loop reports; the server's metrics implement the same methods."""
    def forward(self, kind: str, n_seqs: int, n_tokens: int, seconds: float) -> None: ...
    def round(self, proposed: int, accepted: int) -> None: ...
    def phase(self, name: str, seconds: float) -> None: ...
    def queue(self, waiting: int, running: int) -> None: ...
    def finished(self, req: Request, result: GenerationResult) -> None: ...
    def failed(self, req: Request, error: BaseException) -> None: ...
    def cancelled(self, req: Request) -> None: ...


class Scheduler:
    """`policy` picks D (default: plain decoding); `sampler` is the acceptance rule at temperature
    > 0 (swappable only so that `draftwise verify` can show it catches a wrong one). With
    `reuse_prefix`, a finished request's prompt KV (target and drafter) is kept for the next
    request with the same prompt. `pad_ragged` (llama.cpp with per-sequence KV streams, which
    splits a batch into ubatches of equally many tokens per sequence): pad each step's feeds to
    equal length, trading ragged ubatches for wasted rows."""

    def __init__(self, target: ModelRunner, tokenizer, drafter: Drafter | None = None,
                 policy: DraftPolicy | None = None, max_running: int = 16, max_queue: int = 64,
                 observer=None, pad_ragged: bool = False, sampler=rejection_sample, reuse_prefix: bool = False):
        if max_running < 1 or max_queue < 0:
            raise ValueError(f"need max_running >= 1 and max_queue >= 0, got {max_running}, {max_queue}")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.policy = policy if policy is not None and drafter is not None else FixedDraftLength(0)
        runners = [target] + ([drafter.runner] if drafter is not None and drafter.runner is not None else [])
        self.max_running = min([max_running] + [r.n_seq_max for r in runners if r.n_seq_max is not None])
        self.max_queue, self.observer = max_queue, observer or NullObserver()
        self.pad_ragged, self.sampler, self.reuse_prefix = pad_ragged, sampler, reuse_prefix
        self._waiting: deque[Request] = deque()
        self._running: list[RequestState] = []
        self._prefix: _Prefix | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    # --- caller side (any thread) ------------------------------------------------------------

    @property
    def max_draft(self) -> int:
        """The most draft tokens a round may propose by default (what the context must leave room for)."""
        return self.policy.max_draft if self.drafter is not None else 0

    def check(self, prompt_ids: list[int], max_tokens: int, num_draft_tokens: int | None = None) -> None:
        """ValueError for a request that cannot run."""
        if num_draft_tokens is not None and check_draft_len(num_draft_tokens) == "auto":
            raise ValueError("a request's own num_draft_tokens is an integer >= 0 (auto is the policy's)")
        d = self.max_draft if num_draft_tokens is None else num_draft_tokens
        check_request(self.target, self.drafter, prompt_ids, max_tokens, d)

    def validate(self, req: Request) -> None:
        """ValueError naming what makes the request impossible to run."""
        self.check(req.prompt_ids, req.max_tokens, req.num_draft_tokens)
        OutputTracker(self.tokenizer, req.max_tokens, req.stop)  # bad stop strings fail here

    def submit(self, req: Request) -> None:
        self.validate(req)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the bound); retry later")
            self._waiting.append(req)
            self._cond.notify()

    def counts(self) -> tuple[int, int]:
        """(waiting, running)"""
        return len(self._waiting), len(self._running)

    def start(self) -> None:
        """Run the loop in a thread of its own (the server)."""
        self._thread = threading.Thread(target=self.run, name="draftwise-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        err = RuntimeError("the server is shutting down")
        for st in list(self._running):
            self._drop(st, err)
        while self._waiting:
            self._send(self._waiting.popleft(), err)
        self.release()

    def release(self) -> None:
        """Free the prompt state kept by `reuse_prefix`."""
        if self._prefix is not None:
            p, self._prefix = self._prefix, None
            self._free_seq(p.seq, p.key)

    # --- the loop (one thread) ----------------------------------------------------------------

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a bug must not leave every client waiting forever
                for st in list(self._running):
                    self._drop(st, e)

    def step(self) -> None:
        """Drop cancelled requests, admit waiting ones, then one batched propose -> verify -> commit."""
        self.admit()
        self.decode()

    def admit(self) -> None:
        """Drop cancelled requests; prefill waiting ones (each commits its first token)."""
        for st in [s for s in self._running if s.req.cancelled]:
            self._drop(st, None)
        self._admit()
        self.observer.queue(*self.counts())

    def decode(self) -> None:
        """One batched propose -> verify -> commit over the running requests."""
        if self._running:
            self._decode(list(self._running))

    def abort(self, req: Request) -> None:
        """Drop a request now (from the thread that runs step()): a consumer that stopped reading."""
        req.cancel()
        for st in [s for s in self._running if s.req is req]:
            self._drop(st, None)
        with self._cond:
            if req in self._waiting:
                self._waiting.remove(req)

    def _admit(self) -> None:
        while len(self._running) < self.max_running:
            with self._cond:
                if not self._waiting:
                    return
                req = self._waiting.popleft()
            if req.cancelled:
                self.observer.cancelled(req)
                continue
            self._prefill(req)

    def _open(self, prompt_ids: list[int]) -> tuple[int, int, torch.Tensor | None]:
        """(target seq, drafter key, the prompt's logits if its KV was kept, else None)."""
        p, self._prefix = self._prefix, None
        if p is not None:
            if p.ids == prompt_ids:  # the drafter rolls itself back to the prompt on its next propose
                return p.seq, p.key, p.logits.clone()
            self._free_seq(p.seq, p.key)
        return self.target.new_sequence(), next(self._keys), None

    def _prefill(self, req: Request) -> None:
        p = req.params
        seq, key, logits = self._open(req.prompt_ids)
        st = RequestState(req, seq, key, list(req.prompt_ids),
                          OutputTracker(self.tokenizer, req.max_tokens, req.stop),
                          None if p.greedy else p.generator())
        self._running.append(st)
        t = time.perf_counter()
        try:
            if logits is None:
                logits = self.target.forward([st.seq], [req.prompt_ids], [1])[0]  # [1, V]
                dt = time.perf_counter() - t
                self.observer.forward("prefill", 1, len(req.prompt_ids), dt)
                self.observer.phase("prefill", dt)
            first = int(logits[-1].argmax()) if p.greedy else sample(warp(logits[-1:], p)[0], st.gen)
        except Exception as e:  # noqa: BLE001 - the request fails, the others go on
            self._drop(st, e)
            return
        if self.reuse_prefix:
            st.prompt_logits = logits.clone()
        st.stats.plain_steps += 1
        st.stats.prefill_s = time.perf_counter() - req.t0
        st.ctx.append(first)
        self.policy.begin(st)
        self._commit(st, [first], None, _logprobs(req, logits[-1:], [first]))

    def _decode(self, batch: list[RequestState]) -> None:
        t_step = time.perf_counter()
        props, shadows, forwards, behind = self._propose(batch)
        t_draft = time.perf_counter() - t_step
        live = [(st, p, s) for st, p, s in zip(batch, props, shadows) if p is not None]
        if not live:
            return
        feeds = [[st.ctx[-1]] + p.tokens for st, p, _ in live]
        if self.pad_ragged:  # equal k per sequence: one llama.cpp ubatch; the padding's KV is truncated below
            k = max(map(len, feeds))
            room = [self.target.max_context - (len(st.ctx) - 1) for st, _, _ in live]
            feeds = [f + [f[-1]] * (min(k, r) - len(f)) for f, r in zip(feeds, room)]
        t = time.perf_counter()
        try:  # verify: one forward, d+1 logits rows per sequence (first d+1 rows when padded)
            logits = self.target.forward([st.seq for st, _, _ in live], feeds, [len(f) for f in feeds])
        except Exception as e:  # noqa: BLE001
            for st, _, _ in live:
                self._drop(st, e)
            return
        t_fwd = time.perf_counter() - t
        self.observer.forward("step", len(live), sum(map(len, feeds)), t_fwd)
        self.observer.phase("verify", t_fwd)
        t = time.perf_counter()
        for (st, prop, shadow), rows in zip(live, logits):
            t_req = time.perf_counter()
            rows = rows[: len(prop.tokens) + 1]  # [d+1, V]
            res = self._verify(rows, prop, st.req.params, st.gen)
            self.target.truncate(st.seq, len(st.ctx) + res.num_accepted)  # drop the rejected draft's KV
            st.stats.verify_s += t_fwd + time.perf_counter() - t_req  # each request waited for all the forward
            if prop.tokens:
                st.stats.record_round(len(prop.tokens), res.num_accepted)
                st.rounds.append(Round(len(st.out.token_ids), len(prop.tokens), res.num_accepted))
                self.observer.round(len(prop.tokens), res.num_accepted)
            else:
                st.stats.plain_steps += 1
            st.ctx += res.tokens
            self.policy.learn(st, RoundOutcome(prop, res, rows, st.req.params, shadow, time.perf_counter() - t_step))
            # row i of the verification scored emitted token i (accepted, then recovered or bonus)
            self._commit(st, res.tokens, bool(prop.tokens), _logprobs(st.req, rows[: len(res.tokens)], res.tokens))
        t_other = time.perf_counter() - t
        self.observer.phase("other", t_other)
        self.policy.observe_step(StepTimes(max(map(len, feeds)), len(live), t_fwd, t_draft, t_other,
                                           forwards, behind))

    def _propose(self, batch: list[RequestState]):
        """(proposals, shadows, draft-model forwards, tokens caught up on) for the batch: a
        proposal per request (None where drafting failed and the request was dropped). A cheap
        drafter proposes first and the policy picks how much of it to verify; a draft model is
        asked for the policy's D, every request's draft in lockstep, one forward a step: each
        request's draft time is then the whole call's, as its verify time is the step's."""
        n = len(batch)
        none = [NO_DRAFT] * n, [None] * n, 0, 1
        if self.drafter is None:
            return none
        props, shadows = [], []
        if self.drafter.cheap:
            for st in batch:
                t = time.perf_counter()
                room = st.out.remaining - 1  # the round always emits one token besides the accepted
                try:
                    want = self.policy.ask(st, n, room)
                    cand = self.drafter.propose(st.key, st.ctx, want, st.req.params, st.gen) if want > 0 else NO_DRAFT
                    d = self.policy.choose(st, n, len(cand.tokens), 1)
                except Exception as e:  # noqa: BLE001
                    props.append(None)
                    shadows.append(None)
                    self._drop(st, e)
                    continue
                props.append(cand if d == len(cand.tokens) else
                             Proposal(cand.tokens[:d], None if cand.probs is None else cand.probs[:d]))
                shadows.append(cand.tokens[0] if cand.tokens and d == 0 else None)
                dt = time.perf_counter() - t
                st.stats.draft_s += dt
                self.observer.phase("draft", dt)
            return props, shadows, 0, 1
        t = time.perf_counter()
        behind = [self.drafter.pending(st.key, st.ctx) for st in batch]
        ds = [self.policy.choose(st, n, st.out.remaining - 1, b) for st, b in zip(batch, behind)]
        todo = [(st, d) for st, d in zip(batch, ds) if d > 0]
        got: list[Proposal | None] = []
        if todo:
            try:
                got = self.drafter.propose_many([(st.key, st.ctx, d, st.req.params, st.gen, self.policy.stop(st))
                                                 for st, d in todo])
            except Exception as e:  # noqa: BLE001
                for st, _ in todo:
                    self._drop(st, e)
                got = [None] * len(todo)
            dt = time.perf_counter() - t
            for st, _ in todo:
                st.stats.draft_s += dt
            self.observer.phase("draft", dt)
        drafts = iter(got)  # in batch order, one per d > 0
        props = [next(drafts) if d > 0 else NO_DRAFT for d in ds]
        one = props[0] if n == 1 and props[0] is not None else NO_DRAFT
        return props, [None] * n, one.forwards or len(one.tokens), behind[0] if n == 1 else 1

    def _verify(self, logits: torch.Tensor, prop: Proposal, params: SamplingParams, gen) -> VerifyResult:
        draft = torch.tensor(prop.tokens, dtype=torch.long)  # [d]
        if params.greedy:
            return greedy_verify(logits, draft)
        p = warp(logits, params)  # [d+1, V]
        return self.sampler(p, prop.draft_probs(p.shape[1]), draft, gen)

    def _commit(self, st: RequestState, tokens: list[int], from_round: bool | None,
                logprobs: list[TokenLogprobs] | None = None) -> None:
        kept, delta = st.out.add(tokens)
        s = st.stats
        s.emitted_tokens += len(kept)
        s.discarded_tokens += len(tokens) - len(kept)
        if from_round:
            s.round_emitted_tokens += len(kept)
        now = time.perf_counter() - st.req.t0
        if not st.times:
            st.ttft = now
        st.times.append(now)
        chunk = Chunk(kept, delta, now, st.out.finish_reason)
        if logprobs is not None:
            chunk.logprobs = logprobs[: len(kept)]
            st.logprobs = (st.logprobs or [])
            st.logprobs.extend(chunk.logprobs)
        if st.out.finish_reason is not None:
            self.policy.finish(st)
            s.wall_s = now
            s.other_s = s.wall_s - s.prefill_s - s.draft_s - s.verify_s
            chunk.result = GenerationResult(st.out.text, st.out.token_ids, len(st.req.prompt_ids),
                                            st.out.finish_reason, s, st.ttft, st.times, st.rounds,
                                            st.logprobs, st.plans)
            self._free(st, keep_prompt=True)
            self.observer.finished(st.req, chunk.result)
        if not self._send(st.req, chunk) and st.out.finish_reason is None:
            st.req.cancel()  # nobody listens any more: freed at the next step

    def _drop(self, st: RequestState, error: BaseException | None) -> None:
        """Free a request that did not finish: cancelled (error None) or failed."""
        self._free(st)
        if error is None:
            self.observer.cancelled(st.req)
        else:
            self.observer.failed(st.req, error)
            self._send(st.req, error)

    def _free(self, st: RequestState, keep_prompt: bool = False) -> None:
        if st in self._running:
            self._running.remove(st)
        if keep_prompt and self.reuse_prefix and self._prefix is None:
            self.target.truncate(st.seq, len(st.req.prompt_ids))
            self._prefix = _Prefix(list(st.req.prompt_ids), st.seq, st.key, st.prompt_logits)
            return
        self._free_seq(st.seq, st.key)

    def _free_seq(self, seq: int, key: int) -> None:
        self.target.free(seq)
        if self.drafter is not None:
            self.drafter.release(key)

    @staticmethod
    def _send(req: Request, event) -> bool:
        try:
            req.deliver(event)
            return True
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is gone
            return False


def _logprobs(req: Request, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprobs] | None:
    return None if req.logprobs is None else TokenLogprobs.of(logits, tokens, req.logprobs)
