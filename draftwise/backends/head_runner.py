"""A draft head (draftwise.models.head) as a model runner: the one owner of the head's KV state.

It has the ModelRunner interface, so the head drafts, rolls back and is priced (its forward-cost
curve, draftwise.profile) like a draft model. What a model runner lacks is the second input of
each position, a feature: the caller hands the target's features of the tokens it will forward
next with `give_features(seq, feats)`; a token forwarded without them (a drafted token) reads the
head's own output at the position before it, as EAGLE drafts.
"""
from __future__ import annotations

import torch

from draftwise.backends.base import check_forward_args
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
    trees = False

    def __init__(self, head: DraftHead, model_path: str = "", max_context: int = 4096, vocab_size: int | None = None):
        self.head = head.eval()
        self.model_path = model_path  # names the head in its cached cost curve
        self.max_context = max_context
        self.vocab_size = vocab_size or head.config.vocab_size
        self._ids = head.draft_to_target.cpu()  # [dv]
        self.device = head.fc.weight.device
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
