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

Failure boundaries: every per-request part of a step (set-up, prefill, drafting, acceptance,
commit) runs inside that request's boundary (`_try`): an exception fails that request alone (its
KV freed, the exception delivered) and the others go on as if it had never run. A batched
forward that fails (target or draft model) is retried once per sequence alone, so it fails only
the requests whose own forward fails.

Each sequence keeps its own context, accepted counts and KV state, so a request's greedy output
depends on the others only through the numerics of the shared forward (docs/design.md).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from draftwise.backends.base import ModelRunner, forward_parts, padded_parts, tree_layout
from draftwise.drafters.base import Drafter, Proposal
from draftwise.output import OutputTracker
from draftwise.planner import Batch
from draftwise.policy import DraftPolicy, FixedDraftLength, RoundOutcome, StepTimes
from draftwise.prompt_cache import PromptCache
from draftwise.request import (Chunk, GenerationResult, PlanStep, Round, TokenLogprobs, check_draft_len,
                               check_request)
from draftwise.sampling import SamplingParams, argmax, sample, warp
from draftwise.stats import SpecStats
from draftwise.verify import VerifyResult, greedy_verify, greedy_verify_tree, rejection_sample, rejection_sample_tree

NO_DRAFT = Proposal([])
MAX_LOOP_ERRORS = 3  # steps failing in a row outside any request's boundary before the running fail
SWEEPS = 2  # re-choosing rounds over a batch's drafts (_propose_cheap); they settle within one or two
log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: the caller should answer 429."""


class ShuttingDown(RuntimeError):
    """The scheduler takes no more requests (draining or closed): the caller should answer 503."""


@dataclass(slots=True, eq=False)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    deliver: Callable[[Chunk | BaseException], None]  # called from the thread that runs step()
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # None: the policy's; an integer fixes D (0: speculation off)
    logprobs: int | None = None  # None: none; k >= 0: each token's logprob and its top k alternatives
    private: bool = False  # its text is neither read from nor added to state shared across requests
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
    out: OutputTracker | None = None  # set up inside the request's failure boundary
    gen: torch.Generator | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    times: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    ttft: float = 0.0
    policy: object = None  # the draft-length policy's own per-request state
    plans: list[PlanStep] | None = None  # the planner's log, under `auto`
    logprobs: list[TokenLogprobs] | None = None
    prompt_logits: torch.Tensor | None = None  # [1, V] kept with the prompt's KV (reuse_prefix)
    collect: bool = False  # this step's forward returns the target's features for its head (_target_forward)


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
    def round(self, proposed: int, accepted: int, positions: int) -> None: ...  # positions: a tree's depth
    def cache(self, queried: int, hit: int) -> None: ...  # a prompt cache lookup: prompt tokens, reused
    def phase(self, name: str, seconds: float) -> None: ...
    def queue(self, waiting: int, running: int) -> None: ...
    def finished(self, req: Request, result: GenerationResult) -> None: ...
    def failed(self, req: Request, error: BaseException) -> None: ...
    def cancelled(self, req: Request) -> None: ...
    def fault(self, kind: str) -> None: ...  # "forward" | "draft": a batched forward failed; "loop"


class Scheduler:
    """`policy` picks D (default: plain decoding); `sampler` and `tree_sampler` are the acceptance
    rules for chains and candidate trees at temperature > 0 (swappable only so that `draftwise
    verify` can show it catches a wrong one). With
    `reuse_prefix`, a finished (or cancelled) request's prompt KV (target and drafter) is kept for
    the next request with the same prompt (draftwise verify's repeated samples of one prompt: no
    copy); `prompt_cache_bytes` > 0 keeps copies of many prompts' target KV (PromptCache) for
    later prompts that share a prefix with them. `pad_ragged` (llama.cpp with per-sequence KV streams, which
    splits a batch into ubatches of equally many tokens per sequence): pad each step's feeds to
    equal length, trading ragged ubatches for wasted rows. `reserve_draft`: the context check
    leaves room for a whole draft after max_tokens; False checks only prompt + max_tokens, which is
    all a request needs, since a round never drafts past max_tokens (D <= tokens left - 1) and
    padding stops at the context."""

    def __init__(self, target: ModelRunner, tokenizer, drafter: Drafter | None = None,
                 policy: DraftPolicy | None = None, max_running: int = 16, max_queue: int = 64,
                 observer=None, pad_ragged: bool = False, sampler=rejection_sample,
                 tree_sampler=rejection_sample_tree, reuse_prefix: bool = False, reserve_draft: bool = True,
                 prompt_cache_bytes: int = 0):
        if max_running < 1 or max_queue < 0:
            raise ValueError(f"need max_running >= 1 and max_queue >= 0, got {max_running}, {max_queue}")
        if getattr(drafter, "tree", False) and not getattr(target, "trees", False):
            raise ValueError(f"drafter {drafter.name} proposes candidate trees; the {target.backend} backend "
                             "verifies chains only (use the torch backend, or drafter suffix)")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.policy = policy if policy is not None and drafter is not None else FixedDraftLength(0)
        drafts = getattr(drafter, "runners", [drafter.runner]) if drafter is not None else []  # auto: several
        runners = [target] + [r for r in drafts if r is not None]
        self.max_running = min([max_running] + [r.n_seq_max for r in runners if r.n_seq_max is not None])
        self.max_queue, self.observer = max_queue, observer or NullObserver()
        self.pad_ragged, self.reuse_prefix = pad_ragged, reuse_prefix
        self.sampler, self.tree_sampler = sampler, tree_sampler
        # how a step's forward runs, per-sequence token counts -> (k, b) forwards: what prices it
        self._split = padded_parts if pad_ragged else partial(forward_parts, target)
        self.reserve_draft = reserve_draft
        # a drafter that reads the target's features (the head) gets them from every target forward
        self._features = getattr(drafter, "features", None) is not None
        self._waiting: deque[Request] = deque()
        self._running: list[RequestState] = []
        self._prefix: _Prefix | None = None
        if prompt_cache_bytes and not hasattr(target, "save"):
            raise ValueError(f"the {target.backend} backend cannot save a sequence's KV state: no prompt cache")
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes else None
        self._cond = threading.Condition()
        self._close_lock = threading.Lock()  # drain and the server's shutdown may both close
        self._closed = False
        self._accepting = True
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._held: set[int] = set()  # target sequences opened and not yet freed
        self.step_started: float | None = None  # time.monotonic() at the start of the step in progress
        self._loop_errors = 0

    # --- caller side (any thread) ------------------------------------------------------------

    @property
    def max_draft(self) -> int:
        """The most draft tokens a round may propose by default."""
        return self.policy.max_draft if self.drafter is not None else 0

    @property
    def reserve(self) -> int:
        """Context tokens the check keeps free after max_tokens, for a request on the policy's D."""
        return self.max_draft if self.reserve_draft else 0

    def check(self, prompt_ids: list[int], max_tokens: int, num_draft_tokens: int | None = None) -> None:
        """ValueError for a request that cannot run."""
        if num_draft_tokens is not None and check_draft_len(num_draft_tokens) == "auto":
            raise ValueError("a request's own num_draft_tokens is an integer >= 0 (auto is the policy's)")
        d = self.max_draft if num_draft_tokens is None else num_draft_tokens
        check_request(self.target, self.drafter, prompt_ids, max_tokens, d if self.reserve_draft else 0)

    def validate(self, req: Request) -> None:
        """ValueError naming what makes the request impossible to run."""
        self.check(req.prompt_ids, req.max_tokens, req.num_draft_tokens)
        OutputTracker(self.tokenizer, req.max_tokens, req.stop)  # bad stop strings fail here

    def submit(self, req: Request) -> None:
        self.validate(req)
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the bound); retry later")
            self._waiting.append(req)
            self._cond.notify()

    def counts(self) -> tuple[int, int]:
        """(waiting, running)"""
        return len(self._waiting), len(self._running)

    @property
    def sequences_held(self) -> int:
        """Target sequences open now: the running requests' (and a kept prompt's); more is a leak."""
        return len(self._held)

    def alive(self) -> bool:
        """The loop thread (`start`) is running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run the loop in a thread of its own (the server)."""
        self._thread = threading.Thread(target=self.run, name="draftwise-scheduler", daemon=True)
        self._thread.start()

    def drain(self, timeout: float) -> bool:
        """Take no more requests; let those in flight finish for up to `timeout` seconds, then close
        (the rest fail with ShuttingDown). True if every one finished."""
        with self._cond:
            self._accepting = False
        deadline = time.monotonic() + timeout
        while any(self.counts()) and self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        done = not any(self.counts())
        self.close()
        return done

    def close(self) -> None:
        with self._close_lock:
            with self._cond:
                self._closed, self._accepting = True, False
                self._cond.notify()
            if self._thread is not None:
                self._thread.join()
            self._fail_all(ShuttingDown("the server is shutting down"))
            self.release()

    def release(self) -> None:
        """Free the prompt state kept by `reuse_prefix`."""
        if self._prefix is not None:
            p, self._prefix = self._prefix, None
            self._free_seq(p.seq, p.key)

    # --- the loop (one thread) ----------------------------------------------------------------

    def run(self) -> None:
        """The loop thread. An exception that escapes a step is the loop's own (every request's
        part runs in its boundary): logged, counted, and the step run again; after
        MAX_LOOP_ERRORS in a row every request in flight fails, rather than wait forever."""
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    return
            self.step_started = time.monotonic()
            try:
                self.step()
                self._loop_errors = 0
            except Exception as e:  # noqa: BLE001
                self._loop_error(e)
            finally:
                self.step_started = None

    def _loop_error(self, e: Exception) -> None:
        self._loop_errors += 1
        log.error("scheduler step failed (%d in a row)", self._loop_errors, exc_info=e)
        try:
            self.observer.fault("loop")
        finally:
            if self._loop_errors >= MAX_LOOP_ERRORS:
                self._loop_errors = 0
                self._fail_all(e)

    def _fail_all(self, error: BaseException) -> None:
        """Fail every request in flight, each freed as far as its runner allows."""
        for st in list(self._running):
            try:
                self._drop(st, error)
            except Exception as e:  # noqa: BLE001 - its error was delivered; the runner could not free it
                log.error("could not free a failed request's sequence", exc_info=e)
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for req in waiting:
            self._send(req, error)

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

    def _open(self, prompt_ids: list[int], private: bool) -> tuple[int, int, int, torch.Tensor | None]:
        """(target seq, drafter key, prompt tokens its KV holds already, the prompt's logits if
        it holds the whole prompt, else None). A private request does not read the prompt cache."""
        p, self._prefix = self._prefix, None
        if p is not None:
            if p.ids == prompt_ids:  # the drafter rolls itself back to the prompt on its next propose
                return p.seq, p.key, len(p.ids), p.logits.clone()
            self._free_seq(p.seq, p.key)
        seq, key = self._new_seq(), next(self._keys)
        if self.prompt_cache is None or private:
            return seq, key, 0, None
        hit = self.prompt_cache.lookup(prompt_ids)
        self.observer.cache(len(prompt_ids), 0 if hit is None else hit.reuse)
        if hit is None:
            return seq, key, 0, None
        try:
            self.target.restore(seq, hit.state)
            self.target.truncate(seq, hit.reuse)
        except Exception as e:  # noqa: BLE001 - the entry goes, the request prefills its whole prompt
            log.warning("a cached prompt could not be restored, dropped: %r", e)
            self.prompt_cache.discard(hit.ids)
            self._held.discard(seq)
            self.target.free(seq)
            return self._new_seq(), key, 0, None
        return seq, key, hit.reuse, hit.logits

    def _new_seq(self) -> int:
        seq = self.target.new_sequence()
        self._held.add(seq)
        return seq

    def _prefill(self, req: Request) -> None:
        try:
            seq, key, cached, logits = self._open(req.prompt_ids, req.private)
        except Exception as e:  # noqa: BLE001 - no sequence opened (or it is freed): nothing to free
            self._send(req, e)
            self.observer.failed(req, e)
            return
        st = RequestState(req, seq, key, list(req.prompt_ids))
        st.stats.cached_tokens = cached
        self._running.append(st)
        self._try(st, self._first_token, st, logits)

    def _first_token(self, st: RequestState, logits: torch.Tensor | None) -> None:
        """Set the request up, prefill its prompt (past what its KV holds already: a kept or
        cached prompt), commit its first token."""
        req, p = st.req, st.req.params
        if req.private and self.drafter is not None:
            self.drafter.isolate(st.key)
        st.out = OutputTracker(self.tokenizer, req.max_tokens, req.stop)
        st.gen = None if p.greedy else p.generator()
        t = time.perf_counter()
        if logits is None:
            # a head reads the prompt's features only where they come free with the forward
            # (torch: all of them); on llama.cpp they would cost the prefill work per prompt row,
            # so the head starts from the first step's (DraftHead drafter's `ready`)
            new = req.prompt_ids[st.stats.cached_tokens:]
            logits, feats = self._target_forward([st.seq], [new], [1], collect=False)
            logits = logits[0][-1:]  # [1, V]
            if feats[0] is not None:
                self.drafter.observe(st.key, len(req.prompt_ids) - len(feats[0]), feats[0])
            dt = time.perf_counter() - t
            self.observer.forward("prefill", 1, len(new), dt)
            self.observer.phase("prefill", dt)
        first = int(argmax(logits[-1])) if p.greedy else sample(warp(logits[-1:], p)[0], st.gen)
        if self.reuse_prefix or self.prompt_cache is not None:
            st.prompt_logits = logits.clone()
        st.stats.plain_steps += 1
        st.stats.prefill_s = time.perf_counter() - req.t0
        st.ctx.append(first)
        self.policy.begin(st)
        self._commit(st, [first], None, _logprobs(req, logits[-1:], [first]))

    def _decode(self, batch: list[RequestState]) -> None:
        t_step = time.perf_counter()
        for st in batch:
            st.collect = False  # until the step's choices ask for the features (_plan_draft, DrafterChoice)
        props, shadows, forwards, behind, dear = self._propose(batch)
        t_draft = time.perf_counter() - t_step
        live = [(st, p, s) for st, p, s in zip(batch, props, shadows) if p is not None]
        if not live:
            return
        feeds = [[st.ctx[-1]] + p.tokens for st, p, _ in live]
        # a candidate tree: each fed token's parent among the feed (the last committed token's: -1)
        trees = [[-1] + [q + 1 for q in p.parents] if p.is_tree else None for _, p, _ in live]
        if self.pad_ragged:  # equal k per sequence: one llama.cpp ubatch; the padding's KV is truncated below
            k = max(map(len, feeds))
            room = [self.target.max_context - (len(st.ctx) - 1) for st, _, _ in live]
            feeds = [f + [f[-1]] * (min(k, r) - len(f)) for f, r in zip(feeds, room)]
        t = time.perf_counter()
        # verify: one forward, d+1 logits rows per sequence (first d+1 rows when padded); None: failed
        logits, batched = self._forward([st for st, _, _ in live], feeds, trees if any(trees) else None)
        t_fwd = time.perf_counter() - t
        self.observer.forward("step", len(live), sum(map(len, feeds)), t_fwd)
        self.observer.phase("verify", t_fwd)
        t = time.perf_counter()
        t_tokens = 0.0  # of which work per emitted token (_commit_round's return): see StepTimes
        for (st, prop, shadow), rows in zip(live, logits):
            if rows is not None:
                t_tokens += self._try(st, self._commit_round, st, prop, shadow, *rows, t_fwd, t_step) or 0.0
        t_other = time.perf_counter() - t
        self.observer.phase("other", t_other)
        if batched:  # a step of retries is no measure of the batched forward's cost
            ks = [len(f) for f in feeds]
            self.policy.observe_step(StepTimes(max(ks), len(live), t_fwd, t_draft, t_other - t_tokens,
                                               forwards, behind, self._split(ks), dear))

    def _commit_round(self, st: RequestState, prop: Proposal, shadow: Proposal | None, rows: torch.Tensor,
                      feats: torch.Tensor | None, t_fwd: float, t_step: float) -> float:
        """Verify and commit one request's round; returns the seconds of its work per emitted token."""
        t_req = time.perf_counter()
        rows = rows[: len(prop.tokens) + 1]  # [d+1, V]
        res, warped = self._verify(rows, prop, st.req.params, st.gen)
        if res.path is None:
            self.target.truncate(st.seq, len(st.ctx) + res.num_accepted)  # drop the rejected draft's KV
        else:  # keep the accepted path's KV (node i sits after the last committed token, at len(ctx) + i)
            self.target.keep(st.seq, len(st.ctx), [len(st.ctx) + i for i in res.path])
            rows = rows[[0] + [i + 1 for i in res.path]]  # row j scored emitted token j, as in a chain
        if feats is not None:  # the features of the positions the target KV now holds
            self.drafter.observe(st.key, len(st.ctx) - 1, feats[: res.num_accepted + 1])
        st.stats.verify_s += t_fwd + time.perf_counter() - t_req  # each request waited for all the forward
        if prop.tokens:
            depth = max(tree_layout(prop.parents)[0]) + 1 if res.path is not None else None
            st.stats.record_round(len(prop.tokens), res.num_accepted, depth)
            st.rounds.append(Round(len(st.out.token_ids), len(prop.tokens), res.num_accepted, not res.bonus,
                                   depth is not None))
            self.observer.round(len(prop.tokens), res.num_accepted, depth or len(prop.tokens))
        else:
            st.stats.plain_steps += 1
        st.ctx += res.tokens
        self.policy.learn(st, RoundOutcome(prop, res, rows, st.req.params, shadow and shadow.tokens[0],
                                           time.perf_counter() - t_step, shadow,
                                           None if warped is None else warped[0]))
        # row i of the verification scored emitted token i (accepted, then recovered or bonus)
        t_tok = time.perf_counter()  # work per emitted token (logprobs, text, delivery)
        self._commit(st, res.tokens, bool(prop.tokens), _logprobs(st.req, rows[: len(res.tokens)], res.tokens))
        return time.perf_counter() - t_tok

    def _forward(self, batch: list[RequestState], feeds: list[list[int]], trees: list | None = None) -> tuple[list, bool]:
        """((logits, features or None) per sequence, whether the batched forward went through).
        If it fails, each sequence is retried alone once: a fault fails only the requests whose
        own forward fails (theirs is None). `trees`: per sequence None or its feed's parents."""
        try:
            return list(zip(*self._target_forward([st.seq for st in batch], feeds, [len(f) for f in feeds],
                                                  trees, any(st.collect for st in batch)))), True
        except Exception as e:  # noqa: BLE001
            log.warning("a batched forward of %d sequences failed; retrying each alone", len(batch), exc_info=e)
            self.observer.fault("forward")
        return [self._try(st, self._forward_alone, st, f, t) for st, f, t in zip(batch, feeds, trees or [None] * len(batch))], False

    def _forward_alone(self, st: RequestState, feed: list[int], tree: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = len(st.ctx) - 1  # the KV invariant: every committed token but the last
        if self.target.length(st.seq) > n:
            self.target.truncate(st.seq, n)  # whatever the failed forward left behind
        if self.target.length(st.seq) != n:
            raise RuntimeError("the failed forward lost this sequence's KV state")
        logits, feats = self._target_forward([st.seq], [feed], [len(feed)], [tree] if tree else None, st.collect)
        return logits[0], feats[0]

    def _target_forward(self, seqs: list[int], feeds: list[list[int]], ks: list[int],
                        trees: list | None = None, collect: bool = True) -> tuple[list, list]:
        """(logits [k, V] per sequence, the target's features of the feed's last rows, at least k,
        when the drafter reads them, else None): the runner computes features only for a
        scheduler whose drafter does, and on a runner whose features cost work (llama.cpp: an
        LM-head row and a copy each) only when a request of the step asked (`collect`)."""
        on = self._features and (collect or getattr(self.target, "all_features", False))
        if self._features or getattr(self.target, "features", None) is not None:  # runners shared by engines
            self.target.features = self.drafter.features if on else None
        logits = self.target.forward(seqs, feeds, ks, trees) if trees else self.target.forward(seqs, feeds, ks)
        return logits, self.target.last_features if on else [None] * len(seqs)

    def _propose(self, batch: list[RequestState]):
        """(proposals, shadows, draft-model forwards, tokens caught up on, (member, seconds) of a
        deferred draft or None) for the batch: a proposal per request (None where drafting failed
        and the request was dropped). A cheap drafter proposes first and the policy picks how much
        of it to verify; a draft model is asked for the policy's D, every request's draft in
        lockstep, one forward a step: each request's draft time is then the whole call's, as its
        verify time is the step's."""
        n = len(batch)
        if self.drafter is None:
            return [NO_DRAFT] * n, [None] * n, 0, 1, None
        if not self.drafter.cheap:
            return self._propose_model(batch)
        return self._propose_cheap(batch)

    def _propose_cheap(self, batch: list[RequestState]):
        """A cheap drafter's candidates, then how much of each the step verifies. In a batch the
        requests share one forward, so each draft is priced by what it does to the whole step
        (Planner.plan): first every request chooses as if all sequences fed what it feeds (a
        batch whose requests all draft alike costs less per token than one ragged draft), then
        each in turn re-chooses against the step as the others left it (_settle). Each choice
        raises the step's expected rate given the others', so the choices end in a local
        optimum, which from that start can lie below the plain step: m drafts that each pay only
        their share of the extra forward they make the whole step run, where none would pay for
        it alone. Then (DraftPolicy.pays) the choices start again from the plain step, whose end
        cannot be worse than it."""
        n = len(batch)
        ask = Batch.of(n, self._split)
        cands = [self._try(st, self._candidate, st, ask) for st in batch]  # None: failed, dropped
        live = [i for i, c in enumerate(cands) if c is not None]
        step = Batch.of(len(live), self._split, alike=True)
        props = self._settle(batch, cands, live, step)
        if len(live) > 1 and not self.policy.pays(step):
            props = self._settle(batch, cands, live, Batch.of(len(live), self._split))
        forwards, behind, dear = self._deferred(batch, props)
        shadows = [c if c is not None and c.tokens and p is not None and not p.tokens else None
                   for c, p in zip(cands, props)]  # the candidate a plain step was chosen over
        return props, shadows, forwards, behind, dear

    def _deferred(self, batch: list[RequestState], props: list[Proposal | None]):
        """Drafter auto: the requests whose choice fell on a member with a model draft now, for
        the D their plan gave, each member's requests in lockstep (props updated in place).
        Returns (forwards, behind, (member, seconds)) of the step's draft when one request
        drafted, else (0, 1, None): a batched step's drafting does not price the curves."""
        todo: dict[str, list] = {}
        for i, st in enumerate(batch):
            d = self.policy.deferred(st) if props[i] is not None else None
            if d is not None:  # (member, D, stop, behind)
                todo.setdefault(d[0], []).append((i, (d[3], d[1], d[2])))
        out = (0, 1, None)
        for name, work in todo.items():
            t = time.perf_counter()
            drafts = self._draft_many([(batch[i], plan) for i, plan in work],
                                      lambda items, name=name: self.drafter.draft_many(name, items))
            dt = time.perf_counter() - t
            for (i, _), prop in zip(work, drafts):
                props[i] = prop
                batch[i].stats.draft_s += dt
            self.observer.phase("draft", dt)
            if len(batch) == 1 and drafts[0] is not None:
                out = (drafts[0].forwards or len(drafts[0].tokens), work[0][1][0], (name, dt))
        return out

    def _settle(self, batch: list[RequestState], cands: list[Proposal | None], live: list[int],
                step: Batch) -> list[Proposal | None]:
        """Each live request chooses its part of its candidate against `step` (which records the
        choices), in turn, until no choice changes: at most SWEEPS rounds after the first of
        this coordinate ascent on the step's expected rate. A request whose choice fails is
        dropped (its candidate set to None)."""
        props: list[Proposal | None] = [None] * len(batch)
        alike = step.alike
        for sweep in range(1 + (SWEEPS if len(live) > 1 else 0)):
            changed = False
            for j, i in enumerate(live):
                if cands[i] is None:  # its choice failed in an earlier sweep
                    continue
                step.me, before = j, step.feeds[j]
                props[i] = self._try(batch[i], self._select, batch[i], step, cands[i])
                if props[i] is None:
                    cands[i] = None
                changed |= step.feeds[j] != before
            step.alike = False
            if (sweep or not alike) and not changed:
                break
        return props

    def _candidate(self, st: RequestState, step: Batch) -> Proposal:
        """The drafter's proposal, as long as the policy may verify."""
        t = time.perf_counter()
        want = self.policy.ask(st, step, st.out.remaining - 1)  # the round always emits one token besides the accepted
        cand = self.drafter.propose(st.key, st.ctx, want, st.req.params, st.gen) if want > 0 else NO_DRAFT
        dt = time.perf_counter() - t
        st.stats.draft_s += dt
        self.observer.phase("draft", dt)
        return cand

    def _select(self, st: RequestState, step: Batch, cand: Proposal) -> Proposal:
        t = time.perf_counter()
        prop = self.policy.select(st, step, cand)
        dt = time.perf_counter() - t
        st.stats.draft_s += dt
        self.observer.phase("draft", dt)
        return prop

    def _propose_model(self, batch: list[RequestState]):
        n = len(batch)
        t = time.perf_counter()
        step = Batch.of(n, self._split)
        plans = [self._try(st, self._plan_draft, st, step, i) for i, st in enumerate(batch)]  # (behind, D, stop); None: failed
        todo = [(st, p) for st, p in zip(batch, plans) if p is not None and p[1] > 0]
        drafts = iter(self._draft_many(todo) if todo else [])  # in batch order, one per D > 0
        props = [None if p is None else next(drafts) if p[1] > 0 else NO_DRAFT for p in plans]
        if todo:
            dt = time.perf_counter() - t
            for st, _ in todo:
                st.stats.draft_s += dt
            self.observer.phase("draft", dt)
        one = props[0] if n == 1 and props[0] is not None else NO_DRAFT
        return props, [None] * n, one.forwards or len(one.tokens), plans[0][0] if n == 1 and plans[0] else 1, None

    def _plan_draft(self, st: RequestState, step: Batch, i: int) -> tuple[int, int, object]:
        behind = self.drafter.pending(st.key, st.ctx)
        step.me = i
        d = self.policy.choose(st, step, st.out.remaining - 1, behind)
        st.collect = d > 0  # a head reads this round's features when it catches up next round
        if d and not self.drafter.ready(st.key, st.ctx):  # a head lacking the context's features:
            d = self.policy.choose(st, step, 0, behind)  # a plain step collects them
        return behind, d, self.policy.stop(st)

    def _draft_many(self, todo: list, propose_many=None) -> list[Proposal | None]:
        """Lockstep drafts of (request, (behind, D, stop)) by the draft model (or `propose_many`,
        drafter auto's chosen member); if that fails, each request's draft alone once."""
        propose_many = propose_many or self.drafter.propose_many
        items = [(st.key, st.ctx, d, st.req.params, st.gen, stop) for st, (_, d, stop) in todo]
        try:
            return propose_many(items)
        except Exception as e:  # noqa: BLE001
            log.warning("a batched draft of %d sequences failed; retrying each alone", len(items), exc_info=e)
            self.observer.fault("draft")
        return [self._try(st, lambda it=it: propose_many([it])[0]) for (st, _), it in zip(todo, items)]

    def _verify(self, logits: torch.Tensor, prop: Proposal, params: SamplingParams,
                gen) -> tuple[VerifyResult, torch.Tensor | None]:
        """The round's result, and at temperature > 0 the warped rows it was sampled from ([d+1, V])."""
        if params.greedy:
            if prop.is_tree:
                return greedy_verify_tree(logits, prop.tokens, prop.parents), None
            return greedy_verify(logits, torch.tensor(prop.tokens, dtype=torch.long)), None
        p = warp(logits, params)  # [d+1, V]
        if prop.is_tree:
            return self.tree_sampler(p, prop.draft_probs(p.shape[1]), prop.tokens, prop.parents, gen), p
        return self.sampler(p, prop.draft_probs(p.shape[1]), torch.tensor(prop.tokens, dtype=torch.long), gen), p

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
        chunk = Chunk(kept, delta, now, st.out.finish_reason, round=st.rounds[-1] if from_round else None)
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

    def _try(self, st: RequestState, fn, *args):
        """fn(*args) inside the request's failure boundary: if it raises, this request alone fails
        (KV freed, the exception delivered) and None is returned."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the request fails, the others go on
            log.warning("a request failed: %r", e, exc_info=e)
            self._drop(st, e)
            return None

    def _drop(self, st: RequestState, error: BaseException | None) -> None:
        """Free a request that did not finish: cancelled (error None; its prompt's KV is kept as a
        finished one's, once prefilled) or failed."""
        try:
            self._free(st, keep_prompt=error is None and st.prompt_logits is not None)
        finally:
            if error is None:
                self.observer.cancelled(st.req)
            else:
                self._send(st.req, error)
                self.observer.failed(st.req, error)

    def _free(self, st: RequestState, keep_prompt: bool = False) -> None:
        if st not in self._running:
            return  # freed already
        self._running.remove(st)
        if keep_prompt and self.reuse_prefix and self._prefix is None:
            self.target.truncate(st.seq, len(st.req.prompt_ids))
            self._prefix = _Prefix(list(st.req.prompt_ids), st.seq, st.key, st.prompt_logits)
            return
        if keep_prompt and self.prompt_cache is not None and not st.req.private \
                and st.req.prompt_ids not in self.prompt_cache:  # a private one nor stores it
            try:
                self.target.truncate(st.seq, len(st.req.prompt_ids))
                self.prompt_cache.store(st.req.prompt_ids, self.target.save(st.seq), st.prompt_logits)
            except Exception as e:  # noqa: BLE001 - a cache that cannot keep this prompt loses nothing else
                log.warning("the prompt cache could not keep a prompt: %r", e)
        # what the request delivered: ctx also holds a round's verified tokens past an EOS or a stop
        # string, which no drafter may learn as the answer's continuation
        delivered = None if st.out is None else st.ctx[: len(st.req.prompt_ids) + len(st.out.token_ids)]
        self._free_seq(st.seq, st.key, delivered)

    def _free_seq(self, seq: int, key: int, context: list[int] | None = None) -> None:
        self._held.discard(seq)
        self.target.free(seq)
        if self.drafter is not None:
            self.drafter.release(key, context)

    @staticmethod
    def _send(req: Request, event) -> bool:
        try:
            req.deliver(event)
            return True
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is gone
            return False


def _logprobs(req: Request, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprobs] | None:
    return None if req.logprobs is None else TokenLogprobs.of(logits, tokens, req.logprobs)
