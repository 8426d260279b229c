"""Continuous batching for speculative decoding: all requests in flight share one target forward
per step; requests join and leave between steps.

One thread (`Scheduler.run`) owns the target runner and the drafter. Other threads hand in
`Request`s with `submit` (bounded: `QueueFull` when the waiting queue is full) and get events
back through the request's `deliver` callback: a `Chunk` per step (the last one carries the
`GenerationResult`) or an exception. `Request.cancel()` frees the request's KV state at the
start of the next step.

    admit:   waiting -> running; each prompt is prefilled in its own forward, exactly as a lone
             request is, and its first token committed
    propose: per running request D = choose_draft_len(state, n_running), then drafter.propose
             (a draft model: propose_many, every request's draft in lockstep, one forward a step)
    verify:  ONE target forward over all running sequences, each fed [last] + its draft;
             greedy_verify / rejection_sample per sequence; truncate each rejected tail
    commit:  stops, stats, a Chunk to the request; finished requests free their KV state

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
from draftwise.drafters.base import Drafter, Proposal, StopRule
from draftwise.engine import Chunk, GenerationResult, TokenLogprobs, check_request
from draftwise.output import OutputTracker
from draftwise.sampling import SamplingParams, sample, target_top, warp
from draftwise.stats import SpecStats
from draftwise.verify import VerifyResult, greedy_verify, rejection_sample

_NO_DRAFT = Proposal([])


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: the caller should answer 429."""


@dataclass(slots=True, eq=False)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    deliver: Callable[[Chunk | BaseException], None]  # called from the scheduler thread
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # None: the scheduler's default; 0: speculation off
    logprobs: int | None = None  # None: none; k >= 0: each token's logprob and its top k alternatives
    t0: float = field(default_factory=time.perf_counter)  # arrival; chunk times count from here
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True  # read by the scheduler thread at its next step


@dataclass(slots=True, eq=False)
class RequestState:
    """A running request, as `choose_draft_len` sees it."""
    req: Request
    seq: int  # target sequence id
    key: int  # drafter sequence key
    ctx: list[int]  # prompt + committed output; the target KV holds ctx[:-1]
    out: OutputTracker
    d_max: int
    gen: torch.Generator | None
    stats: SpecStats = field(default_factory=SpecStats)
    times: list[float] = field(default_factory=list)
    rounds: list[tuple[int, int, int]] = field(default_factory=list)
    ttft: float = 0.0
    policy: object = None  # the draft-length policy's own per-request state
    logprobs: list[TokenLogprobs] | None = None


class NullObserver:
    """What the scheduler reports; the server's metrics implement the same methods."""
    def forward(self, kind: str, n_seqs: int, n_tokens: int, seconds: float) -> None: ...
    def round(self, proposed: int, accepted: int) -> None: ...
    def phase(self, name: str, seconds: float) -> None: ...
    def queue(self, waiting: int, running: int) -> None: ...
    def finished(self, req: Request, result: GenerationResult) -> None: ...
    def failed(self, req: Request, error: BaseException) -> None: ...
    def cancelled(self, req: Request) -> None: ...


class Scheduler:
    def __init__(self, target: ModelRunner, tokenizer, drafter: Drafter | None = None,
                 num_draft_tokens: int = 4, max_running: int = 16, max_queue: int = 64,
                 spec_off_above: int | None = None,
                 choose_draft_len: Callable[[RequestState, int], int] | None = None, observer=None,
                 pad_ragged: bool = False,
                 after_round: Callable[..., None] | None = None,
                 draft_stop: Callable[[RequestState], StopRule | None] | None = None):
        if num_draft_tokens < 0 or max_running < 1 or max_queue < 0:
            raise ValueError("need num_draft_tokens >= 0, max_running >= 1, max_queue >= 0")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.num_draft_tokens, self.spec_off_above = num_draft_tokens, spec_off_above
        runners = [target] + ([drafter.runner] if hasattr(drafter, "runner") else [])
        self.max_running = min([max_running] + [r.n_seq_max for r in runners if hasattr(r, "n_seq_max")])
        self.max_queue = max_queue
        self.choose_draft_len = choose_draft_len or self.default_draft_len
        # (state, proposed, accepted, emitted, confidence, stop_confidence, target_top): what the policy
        # learns from; target_top is a callable (the target's top probabilities cost a softmax per row)
        self.after_round = after_round
        self.draft_stop = draft_stop  # the request's early-stop rule for a draft model this step
        self.observer = observer or NullObserver()
        # llama.cpp with per-sequence KV streams splits a batch into ubatches of equally many tokens
        # per sequence: ragged k costs extra weight passes; padding trades them for wasted rows
        self.pad_ragged = pad_ragged
        self._waiting: deque[Request] = deque()
        self._running: list[RequestState] = []
        self._cond = threading.Condition()
        self._closed = False
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    # --- caller side (any thread) ------------------------------------------------------------

    def check(self, prompt_ids: list[int], max_tokens: int, num_draft_tokens: int | None) -> None:
        """ValueError for a request that cannot run (as Engine checks one)."""
        d = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        if d < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {d}")
        check_request(self.target, self.drafter, prompt_ids, max_tokens, d)

    def submit(self, req: Request) -> None:
        self.check(req.prompt_ids, req.max_tokens, req.num_draft_tokens)
        OutputTracker(self.tokenizer, req.max_tokens, req.stop)  # bad stop strings fail here
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

    # --- scheduler thread ---------------------------------------------------------------------

    def default_draft_len(self, state: RequestState, n_running: int) -> int:
        """The request's D, or 0 above the load level `spec_off_above` (the planner's hook)."""
        if self.spec_off_above is not None and n_running > self.spec_off_above:
            return 0
        return state.d_max

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
        for st in [s for s in self._running if s.req.cancelled]:
            self._drop(st, None)
        self._admit()
        self.observer.queue(*self.counts())
        if self._running:
            self._decode(list(self._running))

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

    def _prefill(self, req: Request) -> None:
        p = req.params
        d_max = (self.num_draft_tokens if req.num_draft_tokens is None else req.num_draft_tokens) \
            if self.drafter is not None else 0
        st = RequestState(req, self.target.new_sequence(), next(self._keys), list(req.prompt_ids),
                          OutputTracker(self.tokenizer, req.max_tokens, req.stop), d_max,
                          None if p.greedy else p.generator())
        self._running.append(st)
        t = time.perf_counter()
        try:
            logits = self.target.forward([st.seq], [req.prompt_ids], [1])[0]  # [1, V]
            dt = time.perf_counter() - t
            self.observer.forward("prefill", 1, len(req.prompt_ids), dt)
            self.observer.phase("prefill", dt)
            first = int(logits[-1].argmax()) if p.greedy else sample(warp(logits[-1:], p)[0], st.gen)
        except Exception as e:  # noqa: BLE001 - the request fails, the server goes on
            self._drop(st, e)
            return
        st.stats.plain_steps += 1
        st.stats.prefill_s = time.perf_counter() - req.t0
        st.ctx.append(first)
        self._commit(st, [first], None, _logprobs(req, logits[-1:], [first]))

    def _decode(self, batch: list[RequestState]) -> None:
        n = len(batch)
        ds = [min(self.choose_draft_len(st, n), st.out.remaining - 1) if self.drafter is not None else 0
              for st in batch]
        props = self._propose(batch, ds)
        live = [(st, p) for st, p in zip(batch, props) if p is not None]
        if not live:
            return
        feeds = [[st.ctx[-1]] + p.tokens for st, p in live]
        if self.pad_ragged:  # equal k per sequence: one llama.cpp ubatch; the padding's KV is truncated below
            k = max(map(len, feeds))
            room = [self.target.max_context - (len(st.ctx) - 1) for st, _ in live]
            feeds = [f + [f[-1]] * (min(k, r) - len(f)) for f, r in zip(feeds, room)]
        t = time.perf_counter()
        try:  # verify: one forward, d+1 logits rows per sequence (first d+1 rows when padded)
            logits = self.target.forward([st.seq for st, _ in live], feeds, [len(f) for f in feeds])
        except Exception as e:  # noqa: BLE001
            for st, _ in live:
                self._drop(st, e)
            return
        dt = time.perf_counter() - t
        self.observer.forward("step", len(live), sum(map(len, feeds)), dt)
        self.observer.phase("verify", dt)
        t = time.perf_counter()
        for (st, prop), rows in zip(live, logits):
            res = _verify(rows[: len(prop.tokens) + 1], prop, st.req.params, st.gen)
            self.target.truncate(st.seq, len(st.ctx) + res.num_accepted)  # drop the rejected draft's KV
            st.stats.verify_s += dt  # the shared forward's wall time: each request waited for all of it
            if prop.tokens:
                st.stats.record_round(len(prop.tokens), res.num_accepted)
                st.rounds.append((len(st.out.token_ids), len(prop.tokens), res.num_accepted))
                self.observer.round(len(prop.tokens), res.num_accepted)
            else:
                st.stats.plain_steps += 1
            st.ctx += res.tokens
            if self.after_round is not None:
                self.after_round(st, len(prop.tokens), res.num_accepted, len(res.tokens), prop.confidence,
                                 prop.stop_confidence, lambda: target_top(rows, len(prop.tokens), res.num_accepted))
            # row i of the verification scored emitted token i (accepted, then recovered or bonus)
            self._commit(st, res.tokens, bool(prop.tokens), _logprobs(st.req, rows[: len(res.tokens)], res.tokens))
        self.observer.phase("other", time.perf_counter() - t)

    def _propose(self, batch: list[RequestState], ds: list[int]) -> list[Proposal | None]:
        """Each request's draft (None where drafting failed and the request was dropped). A drafter
        with `propose_many` (a draft model) drafts all of them in lockstep, one forward per step;
        each request's draft time is then the whole call's, as its verify time is the step's."""
        todo = [(st, d) for st, d in zip(batch, ds) if d > 0]
        t = time.perf_counter()
        if todo and hasattr(self.drafter, "propose_many"):
            try:
                got = self.drafter.propose_many([(st.key, st.ctx, d, st.req.params, st.gen,
                                                  self.draft_stop(st) if self.draft_stop else None)
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
            return [next(drafts) if d > 0 else _NO_DRAFT for d in ds]
        props = []
        for st, d in zip(batch, ds):
            t = time.perf_counter()
            try:
                props.append(self.drafter.propose(st.key, st.ctx, d, st.req.params, st.gen) if d > 0 else _NO_DRAFT)
            except Exception as e:  # noqa: BLE001
                props.append(None)
                self._drop(st, e)
            st.stats.draft_s += time.perf_counter() - t
            self.observer.phase("draft", time.perf_counter() - t)
        return props

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
            s.wall_s = now
            s.other_s = s.wall_s - s.prefill_s - s.draft_s - s.verify_s
            chunk.result = GenerationResult(st.out.text, st.out.token_ids, len(st.req.prompt_ids),
                                            st.out.finish_reason, s, st.ttft,
                                            st.times, st.rounds, st.logprobs)
            self._free(st)
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

    def _free(self, st: RequestState) -> None:
        if st in self._running:
            self._running.remove(st)
        self.target.free(st.seq)
        if self.drafter is not None:
            self.drafter.release(st.key)

    @staticmethod
    def _send(req: Request, event) -> bool:
        try:
            req.deliver(event)
            return True
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is gone
            return False


def _verify(logits: torch.Tensor, prop: Proposal, params: SamplingParams, gen) -> VerifyResult:
    # logits: [d+1, V]
    draft = torch.tensor(prop.tokens, dtype=torch.long)  # [d]
    if params.greedy:
        return greedy_verify(logits, draft)
    p = warp(logits, params)  # [d+1, V]
    return rejection_sample(p, prop.draft_probs(p.shape[1]), draft, gen)


def _logprobs(req: Request, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprobs] | None:
    return None if req.logprobs is None else TokenLogprobs.of(logits, tokens, req.logprobs)
