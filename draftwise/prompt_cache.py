"""Prompt KV kept across requests, as vLLM's automatic prefix caching or llama-server's prompt cache.

When a request finishes, its prompt's KV state is saved (a copy: `runner.save`, in host memory on
llama.cpp, on the KV's own device under torch) with the prompt's token ids and the logits at its last
token. A new request restores its own prompt's entry, else the one sharing the longest prefix
with its prompt, truncated to what they share, and prefills only the rest: the same prompt asked again (an agent's retry, a
second pass) costs no prefill, and prompts that start alike (a system prompt, a chat template, a
file sent again with a new question) prefill only where they differ. At least one prompt token is
always forwarded unless the whole prompt matches, since its logits give the first output token.

Entries are evicted least recently used first, so that their states fit in `max_bytes`. Restoring
copies the whole entry before truncating it: on a CPU a copy of a token's KV costs far less than
its prefill (~28 KB for Qwen2.5-1.5B against ~10 ms of compute), so any shared prefix pays.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from draftwise.backends.base import KVState


@dataclass(slots=True)
class CacheHit:
    ids: tuple[int, ...]  # the entry's prompt
    state: KVState
    reuse: int  # prompt tokens the restored state supplies (truncate to this)
    logits: torch.Tensor | None  # [1, V] at the prompt's last token when the whole prompt matched


@dataclass(slots=True)
class _Entry:
    ids: tuple[int, ...]
    state: KVState
    logits: torch.Tensor  # [1, V] at ids[-1]

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + self.logits.numel() * self.logits.element_size()


class PromptCache:
    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"a prompt cache's size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # oldest use first
        self.bytes = 0
        self.hits = self.lookups = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: list[int]) -> CacheHit | None:
        """The entry of this very prompt, else the one sharing the longest prefix with it (None:
        no entry shares a token that need not be forwarded)."""
        self.lookups += 1
        best = self._entries.get(tuple(ids))
        shared = len(ids) if best is not None else 0
        if best is None:
            for e in self._entries.values():
                n = _shared(e.ids, ids)
                if n > shared:
                    best, shared = e, n
        if best is None:
            return None
        whole = shared == len(ids) == len(best.ids)
        reuse = shared if whole else min(shared, len(ids) - 1)
        if reuse < 1:
            return None
        self._entries.move_to_end(best.ids)
        self.hits += 1
        self.reused_tokens += reuse
        return CacheHit(best.ids, best.state, reuse, best.logits.clone() if whole else None)

    def __contains__(self, ids: list[int]) -> bool:
        return tuple(ids) in self._entries

    def store(self, ids: list[int], state: KVState, logits: torch.Tensor) -> None:
        """Keep a prompt's state (replacing one for the same ids), evicting the least recently
        used entries to stay within max_bytes (the KV and the logits row); an entry larger than
        the whole cache is not kept."""
        key = tuple(ids)
        self.discard(key)
        entry = _Entry(key, state, logits)
        if entry.nbytes > self.max_bytes:
            return
        while self.bytes + entry.nbytes > self.max_bytes:
            _, e = self._entries.popitem(last=False)
            self.bytes -= e.nbytes
        self._entries[key] = entry
        self.bytes += entry.nbytes

    def discard(self, ids) -> None:
        old = self._entries.pop(tuple(ids), None)
        if old is not None:
            self.bytes -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def _shared(a: tuple[int, ...], b: list[int]) -> int:
    """Length of the common prefix of a and b."""
    n = min(len(a), len(b))
    if tuple(b[:n]) == a[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]: bisect on slices (C-speed comparisons)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(b[:mid]) == a[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
