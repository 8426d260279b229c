"""Head drafting (EAGLE style): a small head reads the target's own features and drafts.

Position j of the head reads token x_j and the target's feature of position j-1 (the state the
target's forward ended in there, which its LM head turned into the distribution of x_j), and
predicts x_{j+1}. The scheduler hands the drafter the target's features of every position it
commits (`observe`): the target KV holds every committed token but the last, so after each step
the features of all context positions but the last are known, which is exactly what a catch-up
of the head up to the last committed token needs. Drafted tokens are fed with the head's own
output at the position before them; next round they are fed again with the target's features
(the head's KV keeps only positions fed with the target's).

The target's features cost nothing on torch (the hidden states come with the forward): every
forward returns them and the head reads the whole prompt. On llama.cpp they cost work: a prefill
with the per-token embeddings switched on is slower even when one row is asked for (docs/heads.md),
and a step's rows cost a copy. So the scheduler asks for them only where the head reads them:
never at prefill, and on a step only when the head drafts that round or wanted to and could not
(`ready`: it lacked the features of the context, which a plain step then collects). Where
features skipped some positions (`observe` sees a gap), the head starts over after the first one
it has; on llama.cpp it reads no prompt position.

Acceptance is the engine's usual rule: q is the head's softmax over its draft vocabulary (zero
elsewhere), so min(1, p/q) and the residual keep the target's distribution at any temperature.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftwise.backends.head_runner import HeadRunner
from draftwise.drafters.base import common_prefix
from draftwise.drafters.model import ModelDrafter


@dataclass(slots=True)
class _HeadSeq:
    seq: int | None = None  # head runner sequence (opened at the first propose)
    fed: list[int] = field(default_factory=list)  # context[:base] then the tokens in the head's KV
    real: int = 0  # fed[:real] were fed with the target's features
    base: int = 0  # context index of the head's first position
    fbase: int = 0  # context index of feats[0]
    feats: torch.Tensor | None = None  # [m, F] the target's features of positions fbase..fbase+m-1


class HeadDrafter(ModelDrafter):
    name = "head"
    cheap = False

    def __init__(self, runner: HeadRunner):
        super().__init__(runner)
        self.features = runner.head.config.feature_layers  # what the target returns: ModelRunner.forward_features
        self._seqs: dict[int, _HeadSeq] = {}

    def observe(self, seq_key: int, start: int, feats: torch.Tensor) -> None:
        """feats [n, F]: the target's features of context positions start..start+n-1."""
        st = self._seqs.setdefault(seq_key, _HeadSeq())
        if st.feats is None or start < st.fbase or start > st.fbase + len(st.feats):
            st.feats, st.fbase = feats, start  # first features, or a gap: start over from these
            return
        st.feats = torch.cat([st.feats[: start - st.fbase], feats])

    def _reconcile(self, seq_key: int, context: list[int]):
        """Roll the head back to the longest prefix of the context it was fed with the target's
        features, and hand the runner the features of the catch-up (context[len(fed):])."""
        st = self._seqs.get(seq_key)
        if st is None or st.feats is None:
            raise RuntimeError("the head drafter has no target features for this request "
                               "(the scheduler hands them over from forward_features)")
        L = len(context)
        known = min(st.fbase + len(st.feats), L - 1)  # positions < known have features
        if known < L - 1:
            raise RuntimeError(f"the head has target features up to position {known}, the context "
                               f"needs them up to {L - 2}")
        st.feats = st.feats[: known - st.fbase]
        keep = _keep(st, context)
        if keep is None:  # (re)start the head after the first known feature
            if st.seq is not None:
                self.runner.free(st.seq)
            st.seq, st.base = self.runner.new_sequence(), st.fbase + 1
            keep = st.base
            st.fed = list(context[: st.base])
        elif keep < len(st.fed):
            self.runner.truncate(st.seq, keep - st.base)
            del st.fed[keep:]
        st.real = L  # the catch-up forward feeds every context token with the target's features
        self.runner.give_features(st.seq, st.feats[keep - 1 - st.fbase: L - 1 - st.fbase])
        return st

    def ready(self, seq_key: int, context: list[int]) -> bool:
        """Has it the target's features up to the position before the last (what drafting after
        this context reads; features start after a gap, or past a reused prompt, are not there)?"""
        st = self._seqs.get(seq_key)
        return st is not None and st.feats is not None and st.fbase <= len(context) - 2 < st.fbase + len(st.feats)

    def pending(self, seq_key: int, context: list[int]) -> int:
        st, L = self._seqs.get(seq_key), len(context)
        if st is None or st.feats is None:
            return 1  # it cannot draft (`ready`): nothing to catch up on yet
        keep = _keep(st, context)
        return max(L - (st.fbase + 1 if keep is None else keep), 1)

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        st = self._seqs.pop(seq_key, None)
        if st is not None and st.seq is not None:
            self.runner.free(st.seq)


def _keep(st: _HeadSeq, context: list[int]) -> int | None:
    """How many context positions the head's KV keeps (fed with the target's features and still
    the context's), or None: it starts over (no sequence yet, nothing past its first position
    kept, or the features resume after a gap past what it keeps)."""
    keep = min(common_prefix(st.fed, context), st.real, len(context) - 1)
    return None if st.seq is None or keep <= st.base or keep - 1 < st.fbase else keep
