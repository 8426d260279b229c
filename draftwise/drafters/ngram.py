"""Prompt lookup (n-gram) drafting: reuse what followed an earlier copy of the context's suffix."""
from __future__ import annotations

import numpy as np
import torch

from draftwise.drafters.base import Proposal, StopRule
from draftwise.sampling import SamplingParams


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Find the longest suffix of `tokens` (min_n <= n <= max_n) that occurred earlier, and return
    up to k tokens that followed its most recent earlier occurrence (empty if none).

    Example: tokens = [1 2 3 4 1 2], min_n=1, max_n=3, k=2. The suffix [4 1 2] never occurred
    before; [1 2] did, at index 0, followed by [3 4] -> returns [3 4].
    """
    if k <= 0:
        return tokens[:0]
    ends = suffix_matches(tokens, min_n, max_n)
    if ends.size == 0:
        return tokens[:0]
    return tokens[ends[-1] + 1: ends[-1] + 1 + k]


def suffix_matches(tokens: np.ndarray, min_n: int, max_n: int, limit: int | None = None) -> np.ndarray:
    """Where the longest suffix of `tokens` (min_n <= n <= max_n) occurred earlier: the index of
    each earlier occurrence's last token, ascending ([m]; empty if none). Occurrences end before
    `limit` (default len(tokens) - 1, so a token follows each).

    Example: tokens = [1 2 3 4 1 2], min_n=1, max_n=3 -> [1]: [1 2] ends at index 1."""
    L = len(tokens)
    limit = L - 1 if limit is None else min(limit, L - 1)
    if L < min_n + 1:
        return tokens[:0]
    # candidate ends: earlier positions j < limit holding the last token
    ends = np.flatnonzero(tokens[:limit] == tokens[L - 1])
    best = tokens[:0]
    for i in range(1, max_n + 1):  # i = match length so far
        if ends.size == 0:
            break
        if i >= min_n:
            best = ends  # the matches of length i
        if i == max_n or L - 1 - i < 0:
            break
        ends = ends[ends - i >= 0]
        ends = ends[tokens[ends - i] == tokens[L - 1 - i]]
    return best


class NgramDrafter:
    name = "ngram"
    max_context = None
    cheap = True
    runner, runners = None, ()
    tree = False
    features = None

    def __init__(self, min_n: int = 2, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq_key: int, context: list[int], num_tokens: int,
                params: SamplingParams, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal:
        arr = np.asarray(context, dtype=np.int64)
        return Proposal(ngram_propose(arr, self.min_n, self.max_n, num_tokens).tolist())  # q one-hot

    def pending(self, seq_key: int, context: list[int]) -> int:
        return 0

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None:
        pass  # drafts from its own source only

    def isolate(self, seq_key: int) -> None:
        pass  # nothing shared across requests

    def memory_nodes(self) -> int:
        return 0

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        pass
