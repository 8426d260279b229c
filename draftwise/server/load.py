"""ServeConfig -> a Scheduler over the spec's models (draftwise.build, as every command loads them)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from draftwise.build import EngineSpec
from draftwise.build import build_scheduler as _build
from draftwise.scheduler import Scheduler


@dataclass(slots=True)
class ServeConfig:
    """The models (one EngineSpec, as every command) and the server's own settings."""
    spec: EngineSpec = field(default_factory=EngineSpec)
    max_queue: int = 64  # waiting requests beyond which the server answers 429
    spec_off_above: int | None = None  # running requests above which speculation is off
    model_name: str | None = None  # served name; default: the target spec
    pad_ragged: bool = False  # llama.cpp: pad each step's feeds to equal length (one ubatch)

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.model_name is None:
            self.model_name = self.spec.target


class LockedTokenizer:
    """The tokenizer shared by the HTTP handlers (encode) and the scheduler thread (decode): a
    Rust tokenizer object must not be used by two threads at once."""

    def __init__(self, tok):
        self._tok, self._lock = tok, threading.Lock()
        self.eos_token_ids = tok.eos_token_ids

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return self._tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self._tok.decode(ids)

    def apply_chat(self, messages: list[dict], assistant_prefix: str = "") -> list[int]:
        with self._lock:
            return self._tok.apply_chat(messages, assistant_prefix)

    def fingerprint(self) -> str:
        return self._tok.fingerprint()


def build_scheduler(cfg: ServeConfig, observer=None) -> tuple[Scheduler, LockedTokenizer]:
    return _build(cfg.spec, observer=observer, max_queue=cfg.max_queue, spec_off_above=cfg.spec_off_above,
                  pad_ragged=cfg.pad_ragged, tokenizer_wrap=LockedTokenizer)
