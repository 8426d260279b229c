"""Output bookkeeping for one request: stop handling and incremental text."""
from __future__ import annotations

from draftwise.tokenizer import Tokenizer


class OutputTracker:
    """Appends committed tokens, cutting exactly at the first stop: an EOS token (kept in
    token_ids, not in text), a stop string (text cut before it; the token completing it is the
    last kept) or max_tokens. Tokens after the stop are the caller's discarded tokens."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, stop: list[str]):
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.tokenizer, self.max_tokens, self.stop = tokenizer, max_tokens, stop
        self.token_ids: list[int] = []
        self.text = ""  # text delivered so far
        self.finish_reason: str | None = None
        self._hold = max((len(s) for s in stop), default=1) - 1

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.token_ids)

    def add(self, tokens: list[int]) -> tuple[list[int], str]:
        """Returns (kept tokens, newly delivered text)."""
        kept: list[int] = []
        full = None
        for tok in tokens:
            kept.append(tok)
            self.token_ids.append(tok)
            if tok in self.tokenizer.eos_token_ids:
                self.finish_reason = "stop"
                break
            if self.stop:
                full = self.tokenizer.decode(self.token_ids)
                cut = self._find_stop(full)
                if cut is not None:
                    full = full[:cut]
                    self.finish_reason = "stop"
                    break
            if len(self.token_ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
        if full is None:
            full = self.tokenizer.decode(self.token_ids)
        return kept, self._deliver(full)

    def _find_stop(self, text: str) -> int | None:
        start = max(0, len(self.text) - self._hold - 8)
        hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _deliver(self, full: str) -> str:
        if self.finish_reason is None:
            # hold back a split multi-byte character and a possible stop-string prefix
            end = len(full)
            if full.endswith("\ufffd"):
                end = len(full.rstrip("\ufffd"))
            for s in self.stop:
                for k in range(min(len(s) - 1, end), 0, -1):
                    if full[:end].endswith(s[:k]):
                        end = min(end, len(full[:end]) - k)
                        break
            full = full[:end]
        if len(full) < len(self.text):  # decoding is not always prefix-stable; never un-send text
            return ""
        delta = full[len(self.text):]
        self.text = full
        return delta
