"""Draft-model drafting: a separate small model with its own KV cache, one sequence per request."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from draftwise.backends.base import ModelRunner
from draftwise.drafters.base import DraftItem, Masker, Proposal, StopRule, common_prefix
from draftwise.sampling import SamplingParams, argmax, mask_logits, sample, warp


@dataclass(slots=True)
class _DraftSeq:
    seq: int
    fed: list[int] = field(default_factory=list)  # tokens in the draft KV, in order


class ModelDrafter:
    """Each propose() first rolls the draft KV back to the longest prefix it shares with the
    committed context (the accepted prefix), feeds the tokens it has not seen in one forward,
    then drafts autoregressively. The last proposed token is never fed: if it is accepted it is
    fed with the next round's catch-up."""

    name = "model"
    cheap = False
    tree = False
    features = None  # a head reads the target's (HeadDrafter)

    def __init__(self, runner: ModelRunner):
        self.runner, self.runners = runner, (runner,)
        self.max_context = runner.max_context
        self._seqs: dict[int, _DraftSeq] = {}

    def propose(self, seq_key: int, context: list[int], num_tokens: int,
                params: SamplingParams, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        return self.propose_many([DraftItem(seq_key, context, num_tokens, params, generator, stop)])[0]

    def propose_many(self, items: list[DraftItem]) -> list[Proposal]:
        """propose() for several sequences in lockstep: one draft forward per step carries every
        sequence still drafting (the catch-ups of all of them in the first), as the server's batch needs."""
        runs = [_Run(self._reconcile(it[0], it[1]), *it) for it in items]
        live = [r for r in runs if r.n > 0]
        while live:
            logits = self.runner.forward([r.st.seq for r in live], [r.feed for r in live], [1] * len(live))
            for r, row in zip(live, logits):  # row: [1, V]
                r.st.fed.extend(r.feed)
                r.step(row)
            live = [r for r in live if not r.done]
        return [r.proposal() for r in runs]

    def _reconcile(self, seq_key: int, context: list[int]) -> _DraftSeq:
        """Roll the draft KV back to the longest prefix it shares with the context."""
        st = self._seqs.get(seq_key)
        if st is None:
            st = self._seqs[seq_key] = _DraftSeq(self.runner.new_sequence())
        keep = common_prefix(st.fed, context)
        keep = min(keep, len(context) - 1)  # at least one token to forward for fresh logits
        if keep < len(st.fed):
            self.runner.truncate(st.seq, keep)
            del st.fed[keep:]
        return st

    def pending(self, seq_key: int, context: list[int]) -> int:
        st = self._seqs.get(seq_key)
        return len(context) if st is None else len(context) - common_prefix(st.fed, context)

    def ready(self, seq_key: int, context: list[int]) -> bool:
        """Can it draft after this context now? (A head also needs the target's features.)"""
        return True

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None:
        pass  # drafts from its own source only

    def isolate(self, seq_key: int) -> None:
        pass  # nothing shared across requests

    def memory_nodes(self) -> int:
        return 0

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        st = self._seqs.pop(seq_key, None)
        if st is not None:
            self.runner.free(st.seq)


class _Run:
    """One sequence's drafting within propose_many."""

    def __init__(self, st: _DraftSeq, key: int, context: list[int], n: int, params: SamplingParams,
                 generator: torch.Generator | None, stop: StopRule | None = None, masker: Masker | None = None):
        self.st, self.n, self.params, self.gen, self.stop, self.masker = st, n, params, generator, stop, masker
        self.feed = context[len(st.fed):]  # the tokens the draft has not seen
        self.tokens: list[int] = []
        self.probs: list[torch.Tensor] = []
        self.confs: list[float] = []
        self.forwards = 0
        self.stop_conf: float | None = None
        self.done = n <= 0

    def step(self, logits: torch.Tensor) -> None:  # logits: [1, V]
        i = len(self.tokens)
        self.forwards += 1
        if self.masker is not None:  # under a grammar: q' = norm(q * mask), the mask after the draft so far
            logits = _masked(logits, self.masker.extend(self.tokens[-1:] if i else []))
        if self.params.greedy:
            tok = int(argmax(logits[0]))
            conf = _top_prob(logits[0]) if self.stop else 1.0  # its own p of its token
        else:
            q = warp(logits, self.params)  # [1, V]
            tok = sample(q[0], self.gen)
            conf = float(q[0, tok])
        rule = self.stop
        stops = rule is not None and (i + 1 >= self.n or rule.ends_at(i, conf))  # StopRule: go-on bar first
        if stops and rule.drops(i, conf):
            self.done, self.stop_conf = True, conf  # not worth verifying: drop it and stop
            return
        if not self.params.greedy:
            self.probs.append(q)
        self.tokens.append(tok)
        self.confs.append(conf)
        self.feed = [tok]
        self.done = len(self.tokens) >= self.n
        if stops and not self.done:
            self.done, self.stop_conf = True, conf  # keep it, but drafting on would not pay

    def proposal(self) -> Proposal:
        return Proposal(self.tokens, torch.cat(self.probs) if self.probs else None,
                        self.confs if self.stop or self.probs else None, self.forwards, self.stop_conf)


def _masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:  # [1, V], allowed [V'] bool
    """The draft's logits under the grammar's mask (a mask of the target's width V', cut or padded
    with refusals to the draft's V)."""
    v = logits.shape[-1]
    allowed = allowed[:v] if allowed.shape[0] >= v else torch.cat([allowed, allowed.new_zeros(v - allowed.shape[0])])
    return mask_logits(logits, allowed[None])


def _top_prob(row: torch.Tensor) -> float:
    """softmax(row).max() in numpy: single-threaded, so it does not queue behind a llama.cpp
    thread pool that is still spinning (a torch op here took ~30 ms instead of ~0.5)."""
    x = row.numpy()
    return float(1.0 / np.exp(x - x.max()).sum())
