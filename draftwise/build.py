"""Assemble an Engine from model specs: target runner, drafter, and the vocabulary check."""
from __future__ import annotations

from dataclasses import dataclass

from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.load import default_backend, load_runner
from draftwise.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from draftwise.planner import Planner

DRAFTERS = ("none", "model", "ngram")


class VocabularyMismatch(ValueError):
    pass


@dataclass(slots=True)
class EngineSpec:
    target: str = DEFAULT_TARGET
    drafter: str = "model"  # none | model | ngram
    draft_model: str = DEFAULT_DRAFT
    num_draft_tokens: int | str = "auto"  # a fixed D, or "auto": the planner picks D per round
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
        if self.num_draft_tokens != "auto" and (not isinstance(self.num_draft_tokens, int)
                                                 or self.num_draft_tokens < 0):
            raise ValueError(f"num_draft_tokens must be an integer >= 0 or 'auto', got {self.num_draft_tokens!r}")
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
                                      **_backend_kw(spec.draft_backend, spec, draft=True))
        check_vocabularies(tok, d_tok, spec.target, spec.draft_model)
        drafter = ModelDrafter(d_runner)
    planner = make_planner(runner, drafter) if spec.num_draft_tokens == "auto" and drafter else None
    return Engine(runner, tok, drafter, spec.num_draft_tokens, planner=planner), runner, tok


# where acceptance starts before a request has been seen: n-gram proposals are often wrong at
# their first token and right after it; a same-family draft model is right more often than not
PRIORS = {"ngram": [0.4] + [0.75] * 15, "model": [0.65] * 16}
# how much a round's predicted rate must beat a plain step's (Planner.margin). A request's acceptance
# estimate is a short-memory average and a round is chosen exactly when it is high, so rounds
# realise less than predicted; a wrong round of a draft model also costs its draft forwards, so
# its margin grows with a draft step's cost relative to a target step: 1/3 of that ratio (0.15 on
# llama.cpp, 0.45; 0.11 on torch, 0.34). Chosen by replaying the planner on teacher-forced traces
# (benchmarks/replay_planner.py; docs/planner.md); a flat 0.15 forwent torch's 15-18% on prose
MARGIN = 0.03
MARGIN_PER_DRAFT_STEP = 1 / 3
# and, for a cheap drafter, 0.03 more per plain step a round would waste if its whole draft were
# rejected (Planner.risk): where verifying k = 2 costs 2.2 plain steps and k = 17 costs 9.9 (llama.cpp
# on an AMD EPYC, 2 cores) only long drafts can pay, and a long draft taken on a few tokens' evidence
# cost 8 plain steps when it failed (QA 0.91x plain, planner_llama_v13). A draft model's margin
# already grows with its draft's cost; there the same term lost 3-8% on code in replays
RISK = 0.03


def prior_for(drafter: str, max_draft: int) -> list[float]:
    """PRIORS for positions 1..max_draft (the last value repeated past the table)."""
    prior = PRIORS.get(drafter, [0.6] * max_draft)[:max_draft]
    return prior + [prior[-1]] * (max_draft - len(prior))


def risk_for(draft) -> float:
    """Planner.risk for a draft model's curve (None: a cheap drafter)."""
    return RISK if draft is None else 0.0


def margin_for(verify, draft) -> float:
    """Planner.margin for a target curve and a draft model's curve (None: a cheap drafter)."""
    if draft is None:
        return MARGIN
    return max(MARGIN, MARGIN_PER_DRAFT_STEP * draft.raw(1) / verify.raw(1))


def make_planner(runner, drafter, max_draft: int = 16, batch_sizes=(1,), log=print, **kw) -> Planner:
    """A planner over the measured forward-cost curves of the target (and of the draft model)."""
    import sys

    from draftwise.planner import CostCurve
    from draftwise.profile import cached_profile

    log = log if log is not print else (lambda m: print(m, file=sys.stderr))
    ks = range(1, max(max_draft, 16) + 2)  # k = 1..17 at least: one cached profile serves every D
    verify = CostCurve.from_profile(cached_profile(runner, batch_sizes, ks, log=log))
    draft = None
    if not drafter.cheap:
        draft = CostCurve.from_profile(cached_profile(drafter.runner, (1,), range(1, 18), log=log))
    kw.setdefault("margin", margin_for(verify, draft))
    kw.setdefault("risk", risk_for(draft))
    return Planner(verify, draft, prior=prior_for(drafter.name, max_draft), max_draft=max_draft, **kw)


def _backend_kw(backend: str, spec: EngineSpec, draft: bool = False) -> dict:
    if backend == "torch":  # a draft model steps one token at a time: oneDNN where faster, else plain sgemm
        return {"pack": "single"} if draft else {}
    if backend != "llama.cpp":
        return {}
    return {"fast_kernels": spec.fast_kernels, **({"n_batch": spec.n_batch} if spec.n_batch else {})}
