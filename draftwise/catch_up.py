"""Pricing a draft model's catch-up. A draft model is not fed while the planner chooses plain
steps, so its first round after them first forwards the tokens it has not seen (the prompt, at a
request's start). That forward is paid once for the rest of the request, so it is set against the
time speculation would save over the rest of the request, not against one round."""
from __future__ import annotations

from collections import deque

import numpy as np


class CatchUp:
    """What the run has seen of requests' lengths and of their first probes' payoff."""

    def __init__(self, lengths_kept: int):
        self.lengths: deque[tuple[int, bool]] = deque(maxlen=lengths_kept)  # (tokens, ended before its cap)
        self._paid = [0.0, 0.0]  # recent first probes: (discounted) paid off, all

    def remaining(self, req) -> float:
        """Tokens the request is expected to emit from here: the mean, over the recent requests
        that emitted more than it has so far, of what they emitted beyond that (up to its room),
        with one request that runs to its cap as the prior. A request cut at its own max_tokens
        counts as running to this one's cap."""
        n = req.cap - req.remaining
        left = [req.remaining] + [min(length - n, req.remaining) if ended else req.remaining
                                  for length, ended in self.lengths if length > n]
        return sum(left) / len(left)

    def pays(self, req, seconds: float, base_rate: float, spec_rate: float, chance: float = 1.0) -> bool:
        """Does going on at `spec_rate` instead of `base_rate` (plain decoding's, or the request's
        rate so far without a model) save more than the catch-up's `seconds` over the rest of the
        request, times the chance that the saving happens at all?"""
        if seconds <= 0:
            return True
        return chance * self.remaining(req) * (1.0 / base_rate - 1.0 / spec_rate) > seconds

    def probes_pay(self) -> float:
        """Optimistic bound (mean + one sd, Beta(1, 1) prior) on the share of recent requests whose
        first probe paid off (their speculative rounds from it on, catch-up included, took less
        time than plain steps for the same tokens): where first probes keep failing, new requests
        stop paying for them; requests that do not probe widen the bound again."""
        m = (self._paid[0] + 1) / (self._paid[1] + 2)
        return min(m + float(np.sqrt(m * (1 - m) / (self._paid[1] + 3))), 1.0)

    @staticmethod
    def looks(req, seconds: float, plain_rate: float) -> bool:
        """Rent or buy: before its draft model first drafts, a request goes on without it while the
        seconds the model would have saved so far (req.forgone_s), one more plain step's included,
        still fit in the catch-up's `seconds`. A request that ends before never pays it, and one
        that goes on loses at most about twice what the better choice in hindsight would have (the
        ski-rental bound), as far as the model's estimated rate (req.model_rate) holds."""
        step = max(0.0, 1.0 / plain_rate - 1.0 / req.model_rate) if req.model_rate > 0 else 0.0
        return req.forgone_s + step <= seconds

    def finish(self, req, length: int) -> None:
        """A request ended after `length` tokens (counted against its cap)."""
        if req.cap > 0:
            self.lengths.append((length, length < req.cap))
        if req.probed:
            self._paid = [0.9 * self._paid[0] + float(req.saved_s > 0), 0.9 * self._paid[1] + 1]
        else:
            self._paid = [0.9 * x for x in self._paid]
