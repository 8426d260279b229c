"""One model spec and one loading path for every command: target runner, drafter, the vocabulary
check and the draft-length policy; then an Engine (one request at a time) or a Scheduler (many)."""
from __future__ import annotations

import gc
import re
import sys
from dataclasses import dataclass

from draftwise.backends.head_runner import HeadRunner, fastest_dtype
from draftwise.drafters.auto import AutoDrafter
from draftwise.drafters.head import HeadDrafter
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.models.load import default_backend, load_runner, load_tokenizer, torch_device
from draftwise.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, resolve
from draftwise.policy_build import make_policy
from draftwise.request import check_draft_len
from draftwise.scheduler import Scheduler

DRAFTERS = ("none", "model", "ngram", "suffix", "suffix-tree", "head", "auto")
# what --drafter auto chooses among by default, with none: the suffix tries (their trie over the
# request finds every match n-gram does) and the draft model, which the planner lets draft only
# where its cost curve and the target's confidence say it pays (docs/suffix.md)
# and the request's prediction, which proposes only for requests that send one
AUTO_MEMBERS = ("suffix", "model", "prediction")
AUTO_CHOICES = ("ngram", "suffix", "model", "head", "prediction")  # what it can choose among (--auto-members)
# the cheap chain drafters that serve requests' predictions composed with the prediction member
# (with_prediction): a request with one is drafted as by --drafter auto over the two, one without
# exactly as by the drafter alone
PREDICTED = ("ngram", "suffix")
# llama.cpp's CPU kernels. "repacked" (its extra buffer types, as llama_cpp.Llama loads) steps one
# token faster than "standard" and processes a long prompt slower; which verifies several tokens
# faster depends on the CPU. Neither is batch-invariant (a near-tie can flip between a one-token and
# a batched forward). "auto": repacked for plain decoding; when a drafter verifies, the kernels whose
# measured forward curve is cheaper (faster_kernels; docs/usage.md has the figures).
KERNELS = ("auto", "repacked", "standard")
KERNEL_KS = range(1, 9)  # forward widths auto compares kernels on: a plain step and rounds of D <= 7


def resolve_kernels(kernels: str, drafting: bool) -> str:
    """The kernels a spec asks for: "auto" stays "auto" when drafting (measured at load)."""
    if kernels != "auto" or drafting:
        return kernels
    return "repacked"


class VocabularyMismatch(ValueError):
    pass


@dataclass(slots=True, kw_only=True)
class ModelFields:
    """Which models, and how they run: shared by every command's configuration."""
    target: str = DEFAULT_TARGET
    draft_model: str = DEFAULT_DRAFT
    backend: str | None = None  # None: llama.cpp for GGUF on CPU if installed, else torch
    device: str | None = None  # torch only: "cpu", "cuda" or "cuda:N"; None: a GPU when there is one
    draft_backend: str | None = None  # None: the target's backend
    threads: int | None = None
    max_context: int | None = None  # tokens per sequence
    ngram_min: int = 2
    ngram_max: int = 4
    head: str | None = None  # the head drafter's checkpoint: a directory or a packaged head's name; None: the target's packaged head
    suffix_max_nodes: int = 200_000  # the suffix drafter's trie over recent outputs, ~270 bytes a node
    auto_members: tuple[str, ...] = AUTO_MEMBERS  # the drafters --drafter auto chooses among
    n_batch: int | None = None  # llama.cpp only: tokens per decode call
    kernels: str = "auto"  # llama.cpp only: "repacked" | "standard" | "auto" (resolve_kernels)

    def check_models(self) -> None:
        if self.n_batch is not None and self.n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {self.n_batch}")
        if self.suffix_max_nodes < 1:
            raise ValueError(f"suffix_max_nodes must be >= 1, got {self.suffix_max_nodes}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"n-gram sizes need 1 <= min <= max, got {self.ngram_min}, {self.ngram_max}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"unknown device {self.device!r}; expected cpu, cuda or cuda:N")
        if self.max_context is not None and self.max_context < 1:
            raise ValueError(f"max_context must be >= 1 token, got {self.max_context}")
        if self.kernels not in KERNELS:
            raise ValueError(f"unknown kernels {self.kernels!r}; choose one of {', '.join(KERNELS)}")
        self.auto_members = tuple(self.auto_members)
        bad = [m for m in self.auto_members if m not in AUTO_CHOICES]
        if bad or not self.auto_members or len(set(self.auto_members)) != len(self.auto_members):
            raise ValueError(f"drafter auto's members {', '.join(self.auto_members) or '(none)'}: expected "
                             f"distinct names among {', '.join(AUTO_CHOICES)}")

    def model_fields(self) -> dict:
        return {f: getattr(self, f) for f in ModelFields.__dataclass_fields__}


DEFAULT_PROMPT_CACHE_MB = 1024  # serve's prompt cache, where the backend can keep KV


@dataclass(slots=True, kw_only=True)
class EngineSpec(ModelFields):
    """The models, the drafter and D: every command builds from one of these."""
    drafter: str = "ngram"  # none | model | ngram | suffix | suffix-tree | head | auto (AUTO_MEMBERS, chosen per round)
    num_draft_tokens: int | str = "auto"  # a fixed D, or "auto": the planner picks D per round
    max_running: int = 4  # sequences held at once (llama.cpp streams): requests batched together
    trees: bool = False  # llama.cpp: load the target able to verify candidate trees (one unified KV); suffix-tree implies it
    # finished prompts' KV kept for later prompts sharing a prefix (0: off; None: DEFAULT_PROMPT_CACHE_MB
    # where the target can save a sequence's KV, ModelRunner.saves, else off)
    prompt_cache_mb: int | None = 0

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        check_draft_len(self.num_draft_tokens)
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.prompt_cache_mb is not None and self.prompt_cache_mb < 0:
            raise ValueError(f"prompt_cache_mb must be >= 0, got {self.prompt_cache_mb}")
        self.check_models()
        if self.backend is None or (self.backend == "auto" and not self.may_run_on_onnx()):
            self.backend = default_backend(self.target, self.device)
        if self.draft_backend is None:
            self.draft_backend = default_backend(self.draft_model, self.device) if self.backend == "auto" else self.backend
        if self.device not in (None, "cpu") and "torch" not in (self.backend, self.draft_backend):
            raise ValueError(f"device {self.device!r}: the {self.backend} backend runs on the CPU only (use --backend torch)")
        self.kernels = resolve_kernels(self.kernels, self.drafter != "none")

    def may_run_on_onnx(self) -> bool:
        """Could `--backend auto` take ONNX Runtime GenAI: a GGUF or packaged model on the CPU, one
        request at a time (onnx runs a batch's sequences one after another, llama.cpp together),
        drafted by what needs neither candidate trees nor the target's features, the runtime installed."""
        from importlib.util import find_spec

        needs = {"auto": set(self.auto_members)}.get(self.drafter, {self.drafter})
        return (default_backend(self.target, self.device) == "llama.cpp" and not self.trees and self.max_running == 1
                and needs <= {"ngram", "suffix", "model", "prediction"} and find_spec("onnxruntime_genai") is not None)

    def prompt_cache_bytes(self, target) -> int:
        """The prompt cache's size for this target runner."""
        mb = self.prompt_cache_mb
        return (DEFAULT_PROMPT_CACHE_MB if mb is None and target.saves else mb or 0) << 20


def check_vocabularies(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token list differs from the target's (by content, not size)."""
    if target_tok.fingerprint() != draft_tok.fingerprint():
        raise VocabularyMismatch(
            f"draft model {draft_name!r} ({len(draft_tok)} tokens) and target {target_name!r} "
            f"({len(target_tok)} tokens) have different token lists; a draft model must share the "
            "target's tokenizer (use --drafter ngram, or a draft from the same family)")


def load_target(spec: EngineSpec, log=None):
    """(runner, tokenizer) of the spec's target. Backend "auto", and kernels "auto" on llama.cpp
    with a drafter, are settled here (cheapest_target) and written back to the spec."""
    if spec.backend == "auto" or (spec.backend == "llama.cpp" and spec.kernels == "auto"):
        spec.backend, spec.kernels, loaded = cheapest_target(spec, log)
        return loaded
    return load_runner(spec.target, spec.backend, spec.threads, spec.max_context, **_backend_kw(spec.backend, spec))


def cheapest_target(spec: EngineSpec, log=None) -> tuple[str, str, tuple]:
    """(backend, kernels, the target's (runner, tokenizer) loaded so): of llama.cpp's standard and
    repacked kernels (those spec.kernels allows) and, for backend "auto", ONNX Runtime GenAI, the one
    whose one-sequence forwards of k = 1..8 tokens (KERNEL_KS: what decoding with a drafter runs)
    take less time in total, measured side by side once per machine (draftwise.profile.cheapest);
    a choice measured before loads its winner alone. Prompt processing is not compared (TTFT;
    docs/usage.md). With onnx chosen, kernels are "repacked" (for a llama.cpp draft model)."""
    from draftwise.backends.base import file_identity
    from draftwise.profile import cheapest, remembered_choice

    log = log or (lambda m: print(m, file=sys.stderr))
    kernels = ("standard", "repacked") if spec.kernels == "auto" else (spec.kernels,)
    cands = {f"llama.cpp {k}": ("llama.cpp", k) for k in kernels} | (
        {"onnx": ("onnx", "repacked")} if spec.backend == "auto" else {})

    kw = {n: _backend_kw(b, spec, kernels=k) for n, (b, k) in cands.items()}  # how each is loaded

    def load(name: str):
        return load_runner(spec.target, cands[name][0], spec.threads, spec.max_context, **kw[name])

    def said(ms: dict[str, float], chosen: str, before: str = "") -> None:
        if len(cands) > 1:
            log(f"forwards of 1..8 tokens{before}: " + ", ".join(f"{n} {t:.0f} ms" for n, t in ms.items()) + f": {chosen}")

    key = {"candidates": {n: {"backend": cands[n][0], **kw[n]} for n in cands},
           **file_identity(str(resolve(spec.target).path), threads=spec.threads, max_context=spec.max_context)}
    kept = remembered_choice(key, KERNEL_KS) if len(cands) > 1 else None
    if kept is not None and kept[0] in cands:
        said(kept[1], kept[0], ", measured before")
        return *cands[kept[0]], load(kept[0])
    loaded = {}
    for n, (b, _) in cands.items():
        try:
            loaded[n] = load(n)
        except (RuntimeError, OSError) as e:  # onnx's conversion failed: the run goes on without it
            if b != "onnx":
                raise
            log(f"backend auto: onnx left out ({str(e).splitlines()[0][:200]})")
    chosen, ms = cheapest({n: r for n, (r, _) in loaded.items()}, list(KERNEL_KS),
                          key if len(loaded) == len(cands) else None, log=log)
    said(ms, chosen)
    for n, (r, _) in loaded.items():
        if n != chosen:
            r.close()  # the costlier runners
    return *cands[chosen], loaded[chosen]


def load_drafter(spec: EngineSpec, tokenizer, kind: str | None = None, draft_runner=None, target=None,
                 shared: dict | None = None):
    """The drafter the spec names (or `kind`), None for plain decoding. A draft model's runner is
    loaded unless `draft_runner` is given (one loaded model serves several drafters; for auto,
    `shared`: the runner of each member with a model, by name); a head reads the `target`
    runner's embedding, LM head and sizes."""
    kind = kind or spec.drafter
    if kind == "head":
        import torch

        from draftwise.models.head import load_head
        from draftwise.models.heads import resolve_head

        if draft_runner is None:
            path = resolve_head(spec.head, spec.target)
            head = load_head(path, target)
            device = target.device if target.backend == "torch" else None  # on a GPU: the head beside it, in bf16
            if device is not None and device.type != "cpu":
                head = head.to(device, torch.bfloat16)
            else:
                head = head.to(fastest_dtype(head))
            draft_runner = HeadRunner(head, str(path / "model.safetensors"), target.max_context)
        return HeadDrafter(draft_runner)
    if kind == "auto":
        shared = shared or {}
        members = {}
        for m in spec.auto_members:
            try:
                members[m] = load_drafter(spec, tokenizer, m, shared.get(m), target)
            except VocabularyMismatch as e:
                if not (m == "model" and _default_model_member(spec)):
                    raise
                # neither the member nor the draft model was asked for: a target of another family
                # runs auto without it, as it ran before the model was a default member
                print(f"drafter auto: leaving out the default draft model: {e}", file=sys.stderr)
        return AutoDrafter(members)
    if kind == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max)
    if kind == "prediction":
        return PredictionDrafter()
    if kind in ("suffix", "suffix-tree"):
        return SuffixDrafter(max_nodes=spec.suffix_max_nodes, tree=kind == "suffix-tree")
    if kind != "model":
        return None
    if draft_runner is None:  # the vocabularies first: a mismatch loads no weights
        d_tok = load_tokenizer(resolve(spec.draft_model))
        check_vocabularies(tokenizer, d_tok, spec.target, spec.draft_model)
        draft_runner, _ = load_runner(spec.draft_model, spec.draft_backend, spec.threads, spec.max_context,
                                      tokenizer=d_tok, **_backend_kw(spec.draft_backend, spec, draft=True))
    return ModelDrafter(draft_runner)


def with_prediction(drafter):
    """The drafter a run serves: a cheap chain drafter (PREDICTED) composed with the prediction
    member, so requests that send a prediction are drafted from it too (draftwise.prediction_policy);
    any other drafter as it is (auto has the member already)."""
    if drafter is None or drafter.name not in PREDICTED:
        return drafter
    return AutoDrafter({drafter.name: drafter, "prediction": PredictionDrafter()}, base=drafter.name)


def load_shared(spec: EngineSpec, tokenizer, target, named: set[str]) -> dict:
    """The runner of each drafter with a model ("model", "head") that the drafters a run's
    configurations name (`named`, auto's members included) use, loaded once for all of them.
    auto's default draft model on a target of another family is left out, as load_drafter leaves
    it out of auto, unless a configuration names "model" itself."""
    uses = named | (set(spec.auto_members) if "auto" in named else set())
    out = {}
    for k in ("model", "head"):
        if k not in uses:
            continue
        try:
            out[k] = load_drafter(spec, tokenizer, k, target=target).runner
        except VocabularyMismatch:
            if k != "model" or "model" in named or not _default_model_member(spec):
                raise
    return out


def _default_model_member(spec: EngineSpec) -> bool:
    """Is auto's draft model there by default only (the default members and draft model)?"""
    return spec.auto_members == AUTO_MEMBERS and spec.draft_model == DEFAULT_DRAFT


def freeze_heap() -> None:
    """Once the models are loaded: take what loading allocated out of the cyclic garbage
    collector's view (gc.freeze). A loaded process holds ~200,000 tracked Python objects (modules,
    torch and transformers state) that never become garbage, and every full collection walks them
    all (building the suffix drafter's trie over a 3,000-token prompt: 19.7 ms with them walked,
    15.8 frozen; docs/data/trie_gc.txt). For a process whose models stay loaded until it exits
    (the server): frozen objects that later become cyclic garbage are never collected."""
    gc.collect()
    gc.freeze()


def build_engine(spec: EngineSpec, target=None, **engine_kw):
    """Engine for the spec; pass an already loaded (runner, tokenizer) as target to reuse it.
    Returns (engine, target_runner, tokenizer)."""
    runner, tok = target or load_target(spec)
    drafter = with_prediction(load_drafter(spec, tok, target=runner))
    policy = make_policy(spec.num_draft_tokens, runner, drafter)
    return Engine(runner, tok, drafter, spec.num_draft_tokens, policy=policy, max_running=spec.max_running,
                  **{"prompt_cache_bytes": spec.prompt_cache_bytes(runner), **engine_kw}), runner, tok


def build_scheduler(spec: EngineSpec, observer=None, max_queue: int = 64, spec_off_above: int | None = None,
                    **scheduler_kw):
    """A Scheduler for the spec (the server's loop), its `auto` planner priced at the batch sizes
    it can run; scheduler_kw go to Scheduler. Returns (scheduler, tokenizer)."""
    runner, tok = load_target(spec)
    drafter = with_prediction(load_drafter(spec, tok, target=runner))
    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b < spec.max_running) + (spec.max_running,)
    policy = make_policy(spec.num_draft_tokens, runner, drafter, batch_sizes=sizes, off_above=spec_off_above)
    return Scheduler(runner, tok, drafter, policy, spec.max_running, max_queue, observer=observer,
                     **{"prompt_cache_bytes": spec.prompt_cache_bytes(runner), **scheduler_kw}), tok


def _backend_kw(backend: str, spec: EngineSpec, draft: bool = False, kernels: str | None = None) -> dict:
    if backend == "torch":  # a draft model steps one token at a time: oneDNN where faster, else plain sgemm
        return {"device": torch_device(spec.device), **({"pack": "single"} if draft else {})}
    if backend != "llama.cpp":
        return {}
    return {"fast_kernels": (kernels or spec.kernels) == "repacked", "n_seq_max": spec.max_running,
            **({"trees": True} if not draft and (spec.trees or spec.drafter == "suffix-tree") else {}),
            **({"n_batch": spec.n_batch} if spec.n_batch else {})}
