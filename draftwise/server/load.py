"""ServeConfig -> a Scheduler over the spec's models (draftwise.build, as every command loads them),
and the HTTP side's own tokenizers."""
from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from draftwise.build import EngineSpec, freeze_heap
from draftwise.build import build_scheduler as _build
from draftwise.scheduler import Scheduler

GRAMMARS_KEPT = 64  # compiled grammars kept by their source: agents resend the same schemas and tools


@dataclass(slots=True, kw_only=True)
class ServeConfig:
    """The models (one EngineSpec, as every command) and the server's own settings."""
    spec: EngineSpec = field(default_factory=EngineSpec)
    max_queue: int = 64  # waiting requests beyond which the server answers 429
    spec_off_above: int | None = None  # running requests above which speculation is off (fixed D)
    model_name: str | None = None  # served name; default: the target spec
    pad_ragged: bool = False  # llama.cpp: pad each step's feeds to equal length (one ubatch)
    # limits on one request
    max_body_bytes: int = 1 << 20  # larger bodies: 413 (1 MiB: ~250k tokens of text, ~130k as ids)
    max_prompt_tokens: int | None = None  # None: what fits the context with max_tokens
    max_stop: int = 16  # stop strings per request
    max_stop_chars: int = 256  # characters per stop string
    # access
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # none: no authentication
    protect_metrics: bool = False  # also require a key on /metrics and /health
    # lifecycle
    drain_timeout: float = 20.0  # seconds in-flight requests get to finish on SIGTERM
    stall_timeout: float = 120.0  # a step running longer makes /health unhealthy

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_body_bytes", "max_stop", "max_stop_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.drain_timeout < 0 or self.stall_timeout <= 0:
            raise ValueError(f"need drain_timeout >= 0 and stall_timeout > 0, got {self.drain_timeout}, "
                             f"{self.stall_timeout}")
        if self.model_name is None:
            self.model_name = self.spec.target


class Tokenizers:
    """The HTTP side's tokenizers. A Rust tokenizer must not be used by two threads at once, and
    encoding a long prompt takes a while (~1 s a MiB), so: encoding and chat templates run on one
    worker thread with a copy of their own, never on the event loop; the event loop decodes
    logprob pieces with another copy; the scheduler thread keeps the original for its output."""

    def __init__(self, tok, vocab_size: int | None = None):
        self._worker_tok, self._loop_tok = copy.deepcopy(tok), copy.deepcopy(tok)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="draftwise-tokenize")
        self.vocab_size = vocab_size or len(tok)  # the target's logits width, which grammars' masks span
        self._grammars = None  # draftwise.grammar.Grammars, made on the first structured request
        self._compiled: OrderedDict[tuple[str, str], object] = OrderedDict()

    async def encode(self, text: str) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._worker_tok.encode, text)

    async def apply_chat(self, messages: list[dict], assistant_prefix: str = "", generation_prompt: bool = True,
                         tools: list[dict] | None = None) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._worker_tok.apply_chat,
                                                                messages, assistant_prefix, generation_prompt, tools)

    async def grammar(self, kind: str, source: str):
        """A compiled draftwise.grammar.Grammar ("json_schema": a schema's JSON text; "lark"), on
        the worker thread, the last GRAMMARS_KEPT kept; ValueError naming a bad one."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._grammar, kind, source)

    def _grammar(self, kind: str, source: str):
        if (kind, source) in self._compiled:
            self._compiled.move_to_end((kind, source))
            return self._compiled[(kind, source)]
        if self._grammars is None:
            from draftwise.grammar import Grammars

            self._grammars = Grammars(self._worker_tok, self.vocab_size)
        g = self._grammars.json_schema(source) if kind == "json_schema" else self._grammars.lark(source)
        self._compiled[(kind, source)] = g
        if len(self._compiled) > GRAMMARS_KEPT:
            self._compiled.popitem(last=False)
        return g

    def tool_tokens(self) -> tuple[int, int]:
        from draftwise.server.tools import call_tokens

        return call_tokens(self._loop_tok)  # event loop only, as `piece`

    def piece(self, token: int) -> str:
        """One token's text (event loop only)."""
        return self._loop_tok.decode([token])

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def build_scheduler(cfg: ServeConfig, observer=None) -> tuple[Scheduler, Tokenizers]:
    """The scheduler (the context check reserves no draft: see Scheduler) and the HTTP tokenizers."""
    sched, tok = _build(cfg.spec, observer=observer, max_queue=cfg.max_queue, spec_off_above=cfg.spec_off_above,
                        pad_ragged=cfg.pad_ragged, reserve_draft=False)
    freeze_heap()  # the server's models stay loaded for its lifetime
    return sched, Tokenizers(tok, sched.target.vocab_size)
