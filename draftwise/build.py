"""Assemble an Engine from model specs: target runner, drafter, and the vocabulary check."""
from __future__ import annotations

from dataclasses import dataclass

from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.load import default_backend, load_runner
from draftwise.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET

DRAFTERS = ("none", "model", "ngram")


class VocabularyMismatch(ValueError):
    pass


@dataclass(slots=True)
class EngineSpec:
    target: str = DEFAULT_TARGET
    drafter: str = "model"  # none | model | ngram
    draft_model: str = DEFAULT_DRAFT
    num_draft_tokens: int = 4
    backend: str | None = None  # None: llama.cpp for GGUF on CPU if installed, else torch
    draft_backend: str | None = None  # None: the target's backend
    threads: int | None = None
    max_context: int | None = None
    ngram_min: int = 2
    ngram_max: int = 4
    n_batch: int | None = None  # llama.cpp only
    fast_kernels: bool = False  # llama.cpp only: faster, not batch-invariant

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if self.backend is None:
            self.backend = default_backend(self.target)
        if self.draft_backend is None:
            self.draft_backend = self.backend


def check_vocabularies(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token list differs from the target's (by content, not size)."""
    if target_tok.fingerprint() != draft_tok.fingerprint():
        raise VocabularyMismatch(
            f"draft model {draft_name!r} ({len(draft_tok)} tokens) and target {target_name!r} "
            f"({len(target_tok)} tokens) have different token lists; a draft model must share the "
            "target's tokenizer (use --drafter ngram, or a draft from the same family)")


def build_engine(spec: EngineSpec, target=None):
    """Engine for the spec; pass an already loaded (runner, tokenizer) as target to reuse it.
    Returns (engine, target_runner, tokenizer)."""
    runner, tok = target or load_runner(spec.target, spec.backend, spec.threads, spec.max_context,
                                        **_backend_kw(spec.backend, spec))
    drafter = None
    if spec.drafter == "ngram":
        drafter = NgramDrafter(spec.ngram_min, spec.ngram_max)
    elif spec.drafter == "model":
        d_runner, d_tok = load_runner(spec.draft_model, spec.draft_backend, spec.threads, spec.max_context,
                                      **_backend_kw(spec.draft_backend, spec))
        check_vocabularies(tok, d_tok, spec.target, spec.draft_model)
        drafter = ModelDrafter(d_runner)
    return Engine(runner, tok, drafter, spec.num_draft_tokens), runner, tok


def _backend_kw(backend: str, spec: EngineSpec) -> dict:
    if backend != "llama.cpp":
        return {}
    return {"fast_kernels": spec.fast_kernels, **({"n_batch": spec.n_batch} if spec.n_batch else {})}
