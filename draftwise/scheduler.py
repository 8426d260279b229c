"""The decoding loop: propose -> verify -> commit, for one request or many (continuous batching).
All requests in flight share one target forward per step; requests join and leave between steps.

    admit:   waiting -> running; each prompt is prefilled in its own forward, exactly as a lone
             request is (or its KV kept from the previous request with the same prompt), and its
             first token committed
    propose: per running request D from the draft-length policy (draftwise.policy: fixed, or
             `auto`), then the drafter (a draft model: every request's draft in lockstep)
    verify:  ONE target forward over all running sequences, each fed [last] + its draft;
             greedy_verify / rejection_sample per sequence; truncate each rejected tail
             (draftwise.verifier)
    commit:  stops, stats, a Chunk to the request; finished requests free their KV state

`step()` runs one such step in the caller's thread: `draftwise.engine.Engine` calls it for one
request at a time, the server's thread (draftwise.loop_thread) for all its clients. Callers hand in
`Request`s with `submit` (bounded: `QueueFull` when the waiting queue is full) and get events
through the request's `deliver` callback: a `Chunk` per step (the last one carries the
`GenerationResult`) or an exception. `Request.cancel()` frees the request's KV state at the start
of the next step. The requests' sequences, and prompts' KV kept for later requests, are
draftwise.prefix_reuse's; what the loop reports goes to an observer (draftwise.observer).

Failure boundaries: every per-request part of a step runs inside that request's boundary
(`_try`): an exception fails that request alone (its KV freed, the exception delivered). A batched
forward that fails is retried once per sequence alone, so it fails only the requests whose own
forward fails.
"""
from __future__ import annotations

import logging
import time
from typing import NamedTuple

import torch

from draftwise.backends.base import ModelRunner, padded_parts
from draftwise.constrained import check_constraint, constrain, first_row, forced_run
from draftwise.drafters.base import Drafter, Proposal
from draftwise.observer import NullObserver, Observer
from draftwise.output import OutputTracker
from draftwise.policy import DraftPolicy, FixedDraftLength, RoundOutcome, StepTimes
from draftwise.proposing import Drafting, Drafts
from draftwise.prefix_reuse import Sequences
from draftwise.request import (Request, RequestState, Round, TokenLogprobs, check_draft_len, check_prediction,
                               check_request)
from draftwise.sampling import argmax, sample, warp
from draftwise.verifier import Scored, Verifier
from draftwise.verify import rejection_sample, rejection_sample_tree
from draftwise.waiting import ShuttingDown, WaitingQueue

log = logging.getLogger(__name__)


class Counts(NamedTuple):
    waiting: int
    running: int


class Drafted(NamedTuple):
    """A request in the step's verification."""
    st: RequestState
    prop: Proposal
    shadow: Proposal | None  # the candidate a plain step was chosen over (policy.learn)
    forced: bool = False  # a grammar's forced run, not the policy's draft (draftwise.constrained)
    masks: torch.Tensor | None = None  # [d+1, V] bool: the grammar's mask per verified row


class Scheduler:
    """`policy` picks D (default: plain decoding); `sampler` and `tree_sampler` are the acceptance
    rules at temperature > 0 (swappable only so that `draftwise verify` can show it catches a wrong
    one). `reuse_prefix`, `prompt_cache_bytes`: prompts' KV kept for later requests
    (draftwise.prefix_reuse). `pad_ragged`: pad each step's feeds to equal length (llama.cpp splits
    a ragged batch into ubatches; draftwise.verifier). `max_queue`: waiting requests past which
    `submit` raises QueueFull. `reserve_draft`: the context check leaves room for a whole draft
    after max_tokens; False checks prompt + max_tokens only, all a request needs (a round never
    drafts past max_tokens and padding stops at the context)."""

    def __init__(self, target: ModelRunner, tokenizer, drafter: Drafter | None = None,
                 policy: DraftPolicy | None = None, max_running: int = 16, max_queue: int = 64,
                 observer: Observer | None = None, pad_ragged: bool = False, sampler=rejection_sample,
                 tree_sampler=rejection_sample_tree, reuse_prefix: bool = False, reserve_draft: bool = True,
                 prompt_cache_bytes: int = 0):
        if max_running < 1:
            raise ValueError(f"need max_running >= 1, got {max_running}")
        if drafter is not None and drafter.tree and not target.trees:
            raise ValueError(f"drafter {drafter.name} proposes candidate trees; the {target.backend} backend "
                             "verifies chains only (use the torch backend, or drafter suffix)")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.policy = policy if policy is not None and drafter is not None else FixedDraftLength(0)
        runners = [target, *(drafter.runners if drafter is not None else ())]
        self.max_running = min([max_running] + [r.n_seq_max for r in runners if r.n_seq_max is not None])
        self.observer = observer or NullObserver()
        self.waiting = WaitingQueue(max_queue)
        self.seqs = Sequences(target, drafter, self.observer, reuse_prefix, prompt_cache_bytes)
        self.reserve_draft = reserve_draft
        # how a step's forward runs, per-sequence token counts -> (k, b) forwards: what prices it
        self._split = padded_parts if pad_ragged else target.forward_parts
        self.drafting = Drafting(drafter, self._split, self._try, self.observer)
        self.verifier = Verifier(target, drafter and drafter.features, self.observer, pad_ragged, sampler,
                                 tree_sampler)
        self._running: list[RequestState] = []

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
        check_prediction(self.target, req.prompt_ids, req.prediction)
        OutputTracker(self.tokenizer, req.max_tokens, req.stop)  # bad stop strings fail here
        check_constraint(self.target, req.constraint)

    def submit(self, req: Request) -> None:
        self.validate(req)
        self.waiting.put(req)

    def counts(self) -> Counts:
        return Counts(len(self.waiting), len(self._running))

    @property
    def sequences_held(self) -> int:
        """Target sequences open now: the running requests' (and a kept prompt's); more is a leak."""
        return self.seqs.held

    @property
    def prompt_cache(self):
        """The PromptCache (prompt_cache_bytes > 0) or None."""
        return self.seqs.prompt_cache

    def release(self) -> None:
        """Free the prompt state kept by `reuse_prefix`."""
        self.seqs.release()

    def close(self) -> None:
        """Take no more requests; fail those in flight or waiting (ShuttingDown) and free the kept
        prompt state. From the thread that runs step(), or once it has ended (LoopThread.close)."""
        self.waiting.close()
        self.fail_all(ShuttingDown("the server is shutting down"))
        self.release()

    def fail_all(self, error: BaseException) -> None:
        """Fail every request in flight or waiting, each freed as far as its runner allows."""
        for st in list(self._running):
            try:
                self._drop(st, error)
            except Exception as e:  # noqa: BLE001 - its error was delivered; the runner could not free it
                log.error("could not free a failed request's sequence", exc_info=e)
        for req in self.waiting.take_all():
            self._send(req, error)

    # --- the loop (the thread that runs step) --------------------------------------------------

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
        self.waiting.remove(req)

    def _admit(self) -> None:
        while len(self._running) < self.max_running and (req := self.waiting.pop()) is not None:
            if req.cancelled:
                self.observer.cancelled(req)
            else:
                self._prefill(req)

    def _prefill(self, req: Request) -> None:
        try:
            opened = self.seqs.open(req.prompt_ids, req.private)
        except Exception as e:  # noqa: BLE001 - no sequence opened (or it is freed): nothing to free
            self._send(req, e)
            self.observer.failed(req, e)
            return
        st = RequestState(req, opened.seq, opened.key, list(req.prompt_ids))
        st.stats.cached_tokens = opened.cached
        self._running.append(st)
        self._try(st, self._first_token, st, opened.logits)

    def _first_token(self, st: RequestState, logits: torch.Tensor | None) -> None:
        """Set the request up, prefill its prompt (past what its KV holds already: a kept or
        cached prompt), commit its first token."""
        req, p = st.req, st.req.params
        if req.private and self.drafter is not None:
            self.drafter.isolate(st.key)
        if self.drafter is not None:  # none: a kept prompt's key forgets the last request's
            self.drafter.predict(st.key, req.prediction or [], len(req.prompt_ids))
        st.out = OutputTracker(self.tokenizer, req.max_tokens, req.stop)
        st.gen = None if p.greedy else p.generator()
        st.constraint = req.constraint.start() if req.constraint is not None else None
        t = time.perf_counter()
        if logits is None:
            # a head reads the prompt's features only where they come free (torch); on llama.cpp they
            # would cost prefill work per prompt row: the head starts from the first step's (`ready`)
            new = req.prompt_ids[st.stats.cached_tokens:]
            logits, feats = self.verifier.forward([st.seq], [new], [1])[0]
            logits = logits[-1:]  # [1, V]
            if feats is not None:
                self.drafter.observe(st.key, len(req.prompt_ids) - len(feats), feats)
            dt = time.perf_counter() - t
            self.observer.forward("prefill", 1, len(new), dt)
            self.observer.phase("prefill", dt)
        row = first_row(st.constraint, logits[-1:])  # [1, V]: under a grammar, masked
        first = int(argmax(row[-1])) if p.greedy else sample(warp(row, p)[0], st.gen)
        if st.constraint is not None:
            st.constraint.advance([first])
        if self.seqs.keeps_prompts:
            st.prompt_logits = logits.clone()
        st.stats.plain_steps += 1
        st.stats.prefill_s = time.perf_counter() - req.t0
        st.ctx.append(first)
        self.policy.begin(st)
        self._commit(st, [first], None, _logprobs(req, logits[-1:], [first]))

    def _decode(self, batch: list[RequestState]) -> None:
        t_step = time.perf_counter()
        for st in batch:
            st.wants_features = False  # until the step's choices ask for the features (draftwise.policy)
        # a grammar's forced run is a free draft; the policy drafts for the others
        free = {st: run for st in batch if (run := self._try(st, forced_run, st, self.max_draft)) is not None}
        ask = [st for st in batch if st not in free and st in self._running]
        drafts = self.policy.draft(ask, self.drafting) if ask else Drafts([])  # propose
        t_draft = time.perf_counter() - t_step
        live = [Drafted(st, run, None, True) for st, run in free.items()]
        live += [Drafted(st, d.proposal, d.unverified) for st, d in zip(ask, drafts.items) if d is not None]
        live = [c for d in live if (c := self._try(d.st, _constrained, d)) is not None]
        if not live:
            return
        fwd = self.verifier.step([d.st for d in live], [d.prop for d in live], self._try)  # verify: one forward
        t = time.perf_counter()
        t_tokens = 0.0  # of which work per emitted token (_commit_round's return): see StepTimes
        for d, scored in zip(live, fwd.scored):
            if scored is not None:
                t_tokens += self._try(d.st, self._commit_round, d, scored, fwd.seconds, t_step) or 0.0
        t_other = time.perf_counter() - t
        self.observer.phase("other", t_other)
        if fwd.batched:  # a step of retries is no measure of the batched forward's cost
            ks = [len(f) for f in fwd.feeds]
            self.policy.observe(StepTimes(max(ks), len(live), fwd.seconds, t_draft, t_other - t_tokens, drafts,
                                          self._split(ks)))

    def _commit_round(self, d: Drafted, scored: Scored, t_fwd: float, t_step: float) -> float:
        """Verify and commit one request's round; returns the seconds of its work per emitted token."""
        t_req = time.perf_counter()
        (st, prop, shadow), (logits, feats) = d[:3], scored
        res, rows, warped, depth = self.verifier.accept(st, prop, logits, d.masks)
        if feats is not None:  # the features of the positions the target KV now holds
            self.drafter.observe(st.key, len(st.ctx) - 1, feats[: res.num_accepted + 1])
        st.stats.verify_s += t_fwd + time.perf_counter() - t_req  # each request waited for all the forward
        if prop.tokens:
            st.stats.record_round(len(prop.tokens), res.num_accepted, depth)
            st.rounds.append(Round(len(st.out.token_ids), len(prop.tokens), res.num_accepted, not res.bonus,
                                   depth is not None))
            self.observer.round(len(prop.tokens), res.num_accepted, depth or len(prop.tokens))
        else:
            st.stats.plain_steps += 1
        st.ctx += res.tokens
        if not d.forced:  # the policy neither drafted nor learns from a grammar's forced run
            self.policy.accept(st, RoundOutcome(prop, res, rows, st.req.params, time.perf_counter() - t_step,
                                                shadow, None if warped is None else warped[0]))
        t_tok = time.perf_counter()  # work per emitted token (logprobs, text, delivery)
        self._commit(st, res.tokens, bool(prop.tokens), _logprobs(st.req, rows[: len(res.tokens)], res.tokens))
        return time.perf_counter() - t_tok

    def _commit(self, st: RequestState, tokens: list[int], from_round: bool | None,
                logprobs: list[TokenLogprobs] | None = None) -> None:
        chunk = st.commit(tokens, from_round, logprobs)
        if st.out.finish_reason is not None:
            self.policy.end(st)
            chunk.result = st.result()
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
        if not (keep_prompt and self.seqs.keep(st)):
            self.seqs.free(st.seq, st.key, st.delivered)

    @staticmethod
    def _send(req: Request, event) -> bool:
        try:
            return req.deliver(event) or True
        except Exception:  # noqa: BLE001 - e.g. the client's event loop is gone
            return False


def _constrained(d: Drafted) -> Drafted:
    """The draft cut to what the request's grammar allows, with its masks (draftwise.constrained)."""
    return d if d.st.constraint is None else d._replace(**constrain(d.st, d.prop)._asdict())


def _logprobs(req: Request, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprobs] | None:
    return None if req.logprobs is None else TokenLogprobs.of(logits, tokens, req.logprobs)
