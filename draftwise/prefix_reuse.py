"""A request's sequences, opened and freed for the loop (draftwise.scheduler), and its prompt's KV
reused by later requests:

    reuse_prefix   a finished (or cancelled) request's prompt KV, target and drafter, stays for the
                   next request with the same prompt (draftwise verify's repeated samples of one
                   prompt): no copy, one prompt at a time
    prompt cache   copies of many finished prompts' target KV (draftwise.prompt_cache), restored
                   for later prompts that share a prefix with them

Either way the prompt's logits at its last token are kept with it (`RequestState.prompt_logits`),
so a prompt whose KV is held whole costs no forward before its first token.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch

from draftwise.backends.base import ModelRunner
from draftwise.observer import Observer
from draftwise.prompt_cache import PromptCache
from draftwise.request import RequestState

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Opened:
    """A request's sequences, as `Sequences.open` hands them out."""
    seq: int  # target sequence id
    key: int  # drafter sequence key
    cached: int  # prompt tokens the target KV holds already
    logits: torch.Tensor | None  # [1, V] at the prompt's last token if the KV holds the whole prompt


@dataclass(slots=True)
class _Kept:
    """A finished request's prompt KV (reuse_prefix), kept for the next request with that prompt."""
    ids: list[int]
    seq: int
    key: int
    logits: torch.Tensor  # [1, V] at the prompt's last token


class Sequences:
    """The target sequences and drafter keys the loop holds (`held` counts the target's: the
    running requests' and a kept prompt's; more is a leak). `drafter`: what `release`s a key
    (None: no drafter)."""

    def __init__(self, target: ModelRunner, drafter, observer: Observer, reuse_prefix: bool = False,
                 prompt_cache_bytes: int = 0):
        if prompt_cache_bytes and not target.saves:
            raise ValueError(f"the {target.backend} backend cannot save a sequence's KV state: no prompt cache "
                             "(run with --prompt-cache-mb 0)")
        self.target, self.drafter, self.observer = target, drafter, observer
        self.reuse_prefix = reuse_prefix
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes else None
        self._kept: _Kept | None = None
        self._held: set[int] = set()
        self._keys = itertools.count()

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def keeps_prompts(self) -> bool:
        """A finished prompt's KV may be kept: requests keep their prompt's logits for it."""
        return self.reuse_prefix or self.prompt_cache is not None

    def open(self, prompt_ids: list[int], private: bool) -> Opened:
        """A new request's sequences, its prompt's KV restored as far as a kept or cached prompt
        supplies it. A private request does not read the prompt cache."""
        p, self._kept = self._kept, None
        if p is not None:
            if p.ids == prompt_ids:  # the drafter rolls itself back to the prompt on its next propose
                return Opened(p.seq, p.key, len(p.ids), p.logits.clone())
            self.free(p.seq, p.key)
        seq, key = self._new_seq(), next(self._keys)
        if self.prompt_cache is None or private:
            return Opened(seq, key, 0, None)
        hit = self.prompt_cache.lookup(prompt_ids)
        self.observer.cache(len(prompt_ids), 0 if hit is None else hit.reuse)
        if hit is None:
            return Opened(seq, key, 0, None)
        try:
            self.target.restore(seq, hit.state)
            self.target.truncate(seq, hit.reuse)
        except Exception as e:  # noqa: BLE001 - the entry goes, the request prefills its whole prompt
            log.warning("a cached prompt could not be restored, dropped: %r", e)
            self.prompt_cache.discard(hit.ids)
            self._held.discard(seq)
            self.target.free(seq)
            return Opened(self._new_seq(), key, 0, None)
        return Opened(seq, key, hit.reuse, hit.logits)

    def keep(self, st: RequestState) -> bool:
        """Keep a request's prompt KV as it ends (prefilled: `st.prompt_logits` set). True: its
        sequences stay held (reuse_prefix); False: the caller frees them (a prompt cache keeps a
        copy, unless the request is private)."""
        ids = st.req.prompt_ids
        if self.reuse_prefix and self._kept is None:
            self.target.truncate(st.seq, len(ids))
            self._kept = _Kept(list(ids), st.seq, st.key, st.prompt_logits)
            return True
        if self.prompt_cache is not None and not st.req.private and ids not in self.prompt_cache:
            try:
                self.target.truncate(st.seq, len(ids))
                self.prompt_cache.store(ids, self.target.save(st.seq), st.prompt_logits)
            except Exception as e:  # noqa: BLE001 - a cache that cannot keep this prompt loses nothing else
                log.warning("the prompt cache could not keep a prompt: %r", e)
        return False

    def free(self, seq: int, key: int, context: list[int] | None = None) -> None:
        """Free a target sequence and its drafter key; `context`: what the request delivered
        (Drafter.release)."""
        self._held.discard(seq)
        self.target.free(seq)
        if self.drafter is not None:
            self.drafter.release(key, context)

    def release(self) -> None:
        """Free the prompt kept by `reuse_prefix`."""
        if self._kept is not None:
            p, self._kept = self._kept, None
            self.free(p.seq, p.key)

    def _new_seq(self) -> int:
        seq = self.target.new_sequence()
        self._held.add(seq)
        return seq
