"""Draft-model drafting: a separate small model with its own KV cache, one sequence per request."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from draftwise.backends.base import ModelRunner
from draftwise.drafters.base import Proposal
from draftwise.sampling import SamplingParams, sample, warp


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

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.max_context = runner.max_context
        self._seqs: dict[int, _DraftSeq] = {}

    def propose(self, seq_key: int, context: list[int], num_tokens: int,
                params: SamplingParams, generator: torch.Generator | None,
                min_confidence: Sequence[float] = ()) -> Proposal:
        st = self._seqs.get(seq_key)
        if st is None:
            st = self._seqs[seq_key] = _DraftSeq(self.runner.new_sequence())
        keep = _common_prefix(st.fed, context)
        keep = min(keep, len(context) - 1)  # at least one token to forward for fresh logits
        if keep < len(st.fed):
            self.runner.truncate(st.seq, keep)
            del st.fed[keep:]
        feed = context[keep:]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        confs: list[float] = []
        for i in range(num_tokens):
            logits = self.runner.forward([st.seq], [feed], [1])[0]  # [1, V]
            st.fed.extend(feed)
            if params.greedy:
                tok = int(logits[0].argmax())
                conf = _top_prob(logits[0]) if min_confidence else 1.0  # its own p of its token
            else:
                q = warp(logits, params)  # [1, V]
                tok = sample(q[0], generator)
                conf = float(q[0, tok])
            if i >= 1 and i - 1 < len(min_confidence) and conf < min_confidence[i - 1]:
                break  # early stop: this token's expected gain does not pay for verifying it
            if not params.greedy:
                probs.append(q)
            tokens.append(tok)
            confs.append(conf)
            feed = [tok]
        return Proposal(tokens, torch.cat(probs) if probs else None, confs if min_confidence or probs else None)

    def pending(self, seq_key: int, context: list[int]) -> int:
        st = self._seqs.get(seq_key)
        return len(context) if st is None else len(context) - _common_prefix(st.fed, context)

    def release(self, seq_key: int) -> None:
        st = self._seqs.pop(seq_key, None)
        if st is not None:
            self.runner.free(st.seq)


def _top_prob(row: torch.Tensor) -> float:
    """softmax(row).max() in numpy: single-threaded, so it does not queue behind a llama.cpp
    thread pool that is still spinning (a torch op here took ~30 ms instead of ~0.5)."""
    x = row.numpy()
    return float(1.0 / np.exp(x - x.max()).sum())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C
        return n
    lo, hi = 0, n  # binary search on prefix equality
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
