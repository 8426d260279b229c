"""ServeConfig -> a Scheduler over loaded runners (each with n_seq_max = the batch bound)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from draftwise.models.load import default_backend, load_runner
from draftwise.scheduler import Scheduler


@dataclass(slots=True)
class ServeConfig:
    target: str = "smollm2-135m"
    drafter: str = "ngram"  # none | ngram | model
    draft_model: str | None = None
    num_draft_tokens: int | str = 4  # a fixed default D, or "auto": the planner's D per step
    backend: str | None = None
    threads: int | None = None
    max_context: int | None = 2048  # tokens per sequence
    max_running: int = 16  # sequences in one batched step (llama.cpp n_seq_max)
    max_queue: int = 64  # waiting requests beyond which the server answers 429
    spec_off_above: int | None = None  # running requests above which speculation is off
    ngram_min: int = 2
    ngram_max: int = 4
    n_batch: int | None = None
    fast_kernels: bool = False
    model_name: str | None = None  # served name; default: the target spec
    pad_ragged: bool = False  # llama.cpp: pad each step's feeds to equal length (one ubatch)

    def __post_init__(self) -> None:
        if self.drafter not in ("none", "ngram", "model"):
            raise ValueError(f"unknown drafter {self.drafter!r}; choose none, ngram or model")
        if self.drafter == "model" and not self.draft_model:
            raise ValueError("--drafter model needs --draft-model")
        if self.max_running < 1 or self.max_queue < 0:
            raise ValueError("need max_running >= 1, max_queue >= 0")
        if self.num_draft_tokens != "auto" and not (isinstance(self.num_draft_tokens, int)
                                                     and self.num_draft_tokens >= 0):
            raise ValueError(f"num_draft_tokens must be an integer >= 0 or 'auto', got {self.num_draft_tokens!r}")
        if self.backend is None:
            self.backend = default_backend(self.target)
        if self.model_name is None:
            self.model_name = self.target


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


def _load(spec: str, cfg: ServeConfig):
    kw = {}
    if cfg.backend == "llama.cpp":
        kw = {"n_seq_max": cfg.max_running, "fast_kernels": cfg.fast_kernels,
              **({"n_batch": cfg.n_batch} if cfg.n_batch else {})}
    return load_runner(spec, cfg.backend, cfg.threads, cfg.max_context, **kw)


def build_scheduler(cfg: ServeConfig, observer=None) -> tuple[Scheduler, LockedTokenizer]:
    from draftwise.build import check_vocabularies
    from draftwise.drafters.model import ModelDrafter
    from draftwise.drafters.ngram import NgramDrafter

    runner, tok = _load(cfg.target, cfg)
    drafter = None
    if cfg.drafter == "ngram":
        drafter = NgramDrafter(cfg.ngram_min, cfg.ngram_max)
    elif cfg.drafter == "model":
        d_runner, d_tok = _load(cfg.draft_model, cfg)
        check_vocabularies(tok, d_tok, cfg.target, cfg.draft_model)
        drafter = ModelDrafter(d_runner)
    locked = LockedTokenizer(tok)
    d, hooks = cfg.num_draft_tokens, {}
    if d == "auto":
        if drafter is None:
            d = 0
        else:
            from draftwise.server.planned import planned_policy

            policy = planned_policy(runner, drafter, cfg.max_running)
            d, hooks = policy.planner.max_draft, policy.hooks()
    return Scheduler(runner, locked, drafter, d, cfg.max_running, cfg.max_queue, cfg.spec_off_above,
                     observer=observer, pad_ragged=cfg.pad_ragged, **hooks), locked
