"""A draft head (draftwise.models.head) as a model runner: the one owner of the head's KV state.

It has the ModelRunner interface, so the head drafts, rolls back and is priced (its forward-cost
curve, draftwise.profile) like a draft model. What a model runner lacks is the second input of
each position, a feature: the caller hands the target's features of the tokens it will forward
next with `give_features(seq, feats)`; a token forwarded without them (a drafted token) reads the
head's own output at the position before it, as EAGLE drafts.

On a CPU the head runs in the dtype that drafts a token faster there (`fastest_dtype`): bfloat16
where the CPU has bf16 matrix instructions (docs/heads.md has the AMD EPYC's figures), float32
where bf16 would be emulated.
"""
from __future__ import annotations

import os
import time

import torch
from torch import nn

from draftwise.backends.base import Weights, check_forward_args, file_identity, padded_parts, torch_weights
from draftwise.models.head import DraftHead


class _Seq:
    __slots__ = ("k", "v", "last", "feats")

    def __init__(self):
        self.k = self.v = None  # [1, nkv, P, hd]
        self.last: torch.Tensor | None = None  # [1, 1, H] output at the last position (the next one's input)
        self.feats: torch.Tensor | None = None  # [n, F] target features for the next forward's n tokens


class HeadRunner:
    backend = "torch"
    n_seq_max = None
    trees = saves = returns_features = features_free = False
    forward_parts = staticmethod(padded_parts)  # sequences run one after another, priced as padded

    def __init__(self, head: DraftHead, model_path: str = "", max_context: int = 4096, vocab_size: int | None = None):
        self.head = head.eval()
        self.model_path = model_path  # names the head in its cached cost curve
        self.max_context = max_context
        self.vocab_size = vocab_size or head.config.vocab_size
        self._ids = head.draft_to_target.cpu()  # [dv]
        self.device = head.fc.weight.device
        self.dtype = str(head.fc.weight.dtype).removeprefix("torch.")  # part of its cached cost curve's key
        self._seqs: dict[int, _Seq] = {}
        self._next = 0

    def new_sequence(self) -> int:
        self._next += 1
        self._seqs[self._next] = _Seq()
        return self._next

    def give_features(self, seq_id: int, feats: torch.Tensor) -> None:
        """feats [n, F]: the target's features of the positions before the next forward's n tokens."""
        self._seqs[seq_id].feats = feats

    @torch.inference_mode()
    def forward(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int]) -> list[torch.Tensor]:
        check_forward_args(seq_ids, tokens, num_logits)
        h = self.head
        out = []
        for seq, toks, k in zip(seq_ids, tokens, num_logits):
            s = self._seqs[seq]
            n, P = len(toks), self.length(seq)
            if P + n > self.max_context:
                raise ValueError(f"head sequence {seq} holds {P} tokens; {n} more exceed {self.max_context}")
            if s.feats is not None:
                if len(s.feats) != n:
                    raise ValueError(f"{len(s.feats)} features given for {n} tokens")
                hid = h.fc(s.feats.to(h.fc.weight))[None]  # [1, n, H]
            elif s.last is not None:
                hid = s.last.expand(1, n, -1)
            else:  # nothing to read (a cost measurement): zeros
                hid = torch.zeros(1, n, h.config.hidden_size, dtype=h.fc.weight.dtype, device=self.device)
            s.feats = None
            res, (s.k, s.v) = h.layer(torch.tensor([toks], device=self.device), hid,
                                      torch.arange(P, P + n, device=self.device),
                                      None if s.k is None else (s.k, s.v))
            s.last = res[:, -1:]
            rows = torch.full((k, self.vocab_size), float("-inf"))  # [k, V]: -inf outside the draft vocabulary
            if k:
                rows[:, self._ids] = h.logits(res[0, n - k:]).float().cpu()  # verification runs on the host
            out.append(rows)
        return out

    def truncate(self, seq_id: int, n: int) -> None:
        s, cur = self._seqs[seq_id], self.length(seq_id)
        if not 0 <= n <= cur:
            raise ValueError(f"cannot truncate head sequence {seq_id} of {cur} tokens to {n}")
        if n < cur:
            s.k, s.v = (s.k[:, :, :n], s.v[:, :, :n]) if n else (None, None)
            s.last = None  # the next forward brings the target's features

    def length(self, seq_id: int) -> int:
        s = self._seqs[seq_id]
        return 0 if s.k is None else s.k.shape[2]

    def free(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def kv_bytes(self) -> int:
        return sum(2 * s.k.numel() * s.k.element_size() for s in self._seqs.values() if s.k is not None)

    def weights(self) -> Weights:
        return torch_weights(self.head)

    def identity(self) -> dict | None:
        """Named by its weights file; None (its curve not cached) where that file is not there."""
        if not os.path.isfile(self.model_path):
            return None
        return file_identity(self.model_path, n_threads=None, n_batch=None, fast_kernels=None, dtype=self.dtype)


CLEARLY = 0.8  # bf16 is taken where its products take at most this share of float32's time
_CHOSEN: dict[tuple, torch.dtype] = {}  # per rows, head shape and process


def fastest_dtype(head: DraftHead, repeats: int = 5, rows: int = 1) -> torch.dtype:
    """float32 or bfloat16, for a head on the CPU: the matrix products of `rows` positions (every
    linear layer and the LM head rows; the rest of a position's work is small) timed in both, best
    of `repeats`; bfloat16 where it takes at most CLEARLY of float32's time. Drafting passes one
    row (a drafted token); training passes its batch's rows, where bf16 matrix instructions can
    gain far more than for one row (on the Intel Xeon type: level for one row, faster for many).
    DRAFTWISE_HEAD_DTYPE (float32 | bfloat16) overrides."""
    want = os.environ.get("DRAFTWISE_HEAD_DTYPE")
    if want:
        if want not in ("float32", "bfloat16"):
            raise ValueError(f"DRAFTWISE_HEAD_DTYPE must be float32 or bfloat16, got {want!r}")
        return getattr(torch, want)
    mats = [m.weight for m in head.modules() if isinstance(m, nn.Linear)]
    if not head.own_lm_head:
        mats.append(head.lm_head_rows)
    key = (rows, *(tuple(w.shape) for w in mats))
    if key not in _CHOSEN:
        fp32 = _token_s([w.float() for w in mats], repeats, rows)
        bf16 = _token_s([w.to(torch.bfloat16) for w in mats], repeats, rows)
        _CHOSEN[key] = torch.bfloat16 if bf16 <= CLEARLY * fp32 else torch.float32
    return _CHOSEN[key]


@torch.inference_mode()
def _token_s(mats: list[torch.Tensor], repeats: int, rows: int = 1) -> float:
    xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in mats]
    best = float("inf")
    for i in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        for x, w in zip(xs, mats):
            x @ w.T
        best = min(best, time.perf_counter() - t0) if i else best
    return best
