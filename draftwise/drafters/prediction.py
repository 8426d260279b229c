"""Predicted Outputs (OpenAI's `prediction`): the request's expected output, as a draft source.

The drafter follows the output through the prediction with a cursor: while the output writes the
prediction's next token the cursor moves on, and a round drafts the tokens after it. Where the
output departs (an insertion, a deletion, a rewritten line) the cursor is lost; the drafter finds
its place again by matching the output's last tokens in the prediction (suffix_matches, the
n-gram drafter's lookup), taking of the longest match's occurrences the first one at or after the
place it was lost (else the last one before it), and follows on from there.

    prediction  a b c d e f g h              output  a b X d e ...
    cursor      after "a b": c d e ...        X departs at c: lost (at 2)
                after "X d e": matches "d e" at 3-4 (>= 2), drafts f g h

Cheap (a one-hot chain, q = 1): acceptance is unchanged and exact. A request's prediction
arrives with `predict`; a request without one gets no drafts from it.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np
import torch

from draftwise.drafters.base import Proposal, StopRule
from draftwise.drafters.ngram import suffix_matches
from draftwise.sampling import SamplingParams

_GAP = -1  # between the prediction and the output's last tokens: no match spans it


@dataclass(slots=True)
class Cursor:
    """Where one request's output stands in its prediction."""
    tokens: np.ndarray  # [P] the prediction
    seen: int  # context tokens walked so far
    at: int | None  # index of the prediction token the output is expected to write next; None: lost
    lost: int = 0  # where it was last lost (re-alignment looks from here first)


class PredictionDrafter:
    name = "prediction"
    max_context = None
    cheap = True
    runner, runners = None, ()
    tree = False
    features = None

    # min_n 2: one-token matches in new text draft mostly wrong tokens (docs/agents.md; replayed by
    # docs/data/agents_prediction/alignment_command.txt)
    def __init__(self, min_n: int = 2, max_n: int = 8):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"match sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._cursors: dict[int, Cursor] = {}

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None:
        """The request's prediction (empty: none); its output begins at context index `start`."""
        if tokens:
            self._cursors[seq_key] = Cursor(np.asarray(tokens, dtype=np.int64), start, 0)
        else:
            self._cursors.pop(seq_key, None)

    def propose(self, seq_key: int, context: list[int], num_tokens: int,
                params: SamplingParams, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        c = self._cursors.get(seq_key)
        if c is None:
            return Proposal([])
        self._walk(c, context)
        if c.at is None:
            c.at = self._realign(c, context)
        if c.at is None or num_tokens <= 0:
            return Proposal([])
        return Proposal(c.tokens[c.at: c.at + num_tokens].tolist())  # q one-hot

    def _walk(self, c: Cursor, context: list[int]) -> None:
        """Move the cursor over the tokens committed since the last call."""
        if len(context) < c.seen:  # a shorter context than walked: find the place again
            c.at, c.seen = None, len(context)
        for t in context[c.seen:]:
            if c.at is not None and c.at < len(c.tokens) and c.tokens[c.at] == t:
                c.at += 1
            elif c.at is not None:
                c.at, c.lost = None, c.at
        c.seen = len(context)

    def _realign(self, c: Cursor, context: list[int]) -> int | None:
        """The prediction index after the output's last tokens' best match, None if none."""
        tail = np.asarray(context[-self.max_n:], dtype=np.int64)
        joined = np.concatenate([c.tokens, [_GAP], tail])
        ends = suffix_matches(joined, self.min_n, self.max_n, limit=len(c.tokens))  # ascending
        if ends.size == 0:
            return None
        ahead = ends[ends + 1 >= c.lost]
        return int(ahead[0] if ahead.size else ends[-1]) + 1

    def pending(self, seq_key: int, context: list[int]) -> int:
        return 0

    def isolate(self, seq_key: int) -> None:
        pass  # nothing shared across requests

    def memory_nodes(self) -> int:
        return 0

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        self._cursors.pop(seq_key, None)


@dataclass(frozen=True, slots=True)
class PredictionCounts:
    """OpenAI's usage.completion_tokens_details for a prediction: its tokens that appeared in the
    completion (accepted) and those that did not (rejected); accepted + rejected = its length."""
    accepted: int
    rejected: int


def prediction_counts(prediction: list[int], output: list[int]) -> PredictionCounts:
    """Which prediction tokens appeared in the output: those in the matching blocks of difflib's
    alignment of the two token lists (in order, each output token used once).

    Example: prediction [1 2 3 4], output [1 2 9 4 5] -> blocks [1 2], [4]: accepted 3, rejected 1."""
    sm = difflib.SequenceMatcher(None, prediction, output, autojunk=False)
    accepted = sum(b.size for b in sm.get_matching_blocks())
    return PredictionCounts(accepted, len(prediction) - accepted)
