"""The things a run measures, one per configuration: in-process engines sharing ONE loaded target
(so the baseline and speculation run the same weights), or servers."""
from __future__ import annotations

from draftwise.bench.config import BenchConfig
from draftwise.bench.endpoint import EndpointTarget
from draftwise.bench.measure import EngineTarget, SchemaGrammars
from draftwise.engine import Engine


def build_targets(cfg: BenchConfig, engines: dict[str, Engine] | None = None, tokenizer=None):
    """(config name -> target, tokenizer). `engines` (name -> Engine) skips loading, e.g. fakes.
    Servers need the target's tokenizer too: to build token-id prompts and to bucket them by length."""
    if cfg.endpoints:
        from draftwise.models.load import load_tokenizer
        from draftwise.models.registry import resolve

        tok = tokenizer or load_tokenizer(resolve(cfg.target))
        return {name: EndpointTarget(url, cfg.endpoint_model, cfg.endpoint_api, cfg.metrics,
                                     logprobs=cfg.margins and cfg.temperature == 0)
                for name, url in cfg.endpoints.items()}, tok
    if engines is None:
        engines = build_engines(cfg)
    names = [c.name for c in cfg.run_configs()]
    missing = [n for n in names if n not in engines]
    if missing:
        raise ValueError(f"no engine for configurations {missing}")
    by_backend: dict[str, set[int]] = {}
    for n in names:
        by_backend.setdefault(engines[n].target.backend, set()).add(id(engines[n].target))
    tokenizers = {engines[n].tokenizer.fingerprint() for n in names}  # one tokenizer, however often loaded
    if len(tokenizers) != 1 or any(len(ids) != 1 for ids in by_backend.values()):
        raise ValueError("every configuration of a run must share one target runner per backend and one tokenizer")
    grammars = {id(e.target): SchemaGrammars(e.tokenizer, e.target.vocab_size) for e in engines.values()}
    return ({n: EngineTarget(engines[n], grammars=grammars[id(engines[n].target)]) for n in names},
            engines[names[0]].tokenizer)


def build_engines(cfg: BenchConfig) -> dict[str, Engine]:
    """Load the target once per backend the configurations name (the run's by default), and the
    draft model once per backend if any configuration drafts with it, through the one loading path
    (draftwise.build), so backends, kernels and the vocabulary check are the CLI's."""
    from draftwise.build import load_drafter, load_shared, load_target, with_prediction
    from draftwise.policy_build import make_policy

    out = {}
    run_cfgs = cfg.run_configs()
    for backend in dict.fromkeys(c.backend for c in run_cfgs):
        cfgs = [c for c in run_cfgs if c.backend == backend]
        spec = cfg.engine_spec(backend=backend)
        runner, tok = load_target(spec)
        shared = load_shared(spec, tok, runner, {c.drafter for c in cfgs})  # the draft model / head, loaded once
        for c in cfgs:  # one drafter per engine (its own request state) over the one draft runner
            drafter = with_prediction(load_drafter(spec, tok, c.drafter, shared.get(c.drafter), target=runner,
                                                   shared=shared))
            policy = make_policy(c.num_draft_tokens, runner, drafter, batch_sizes=_batch_sizes(cfg))
            out[c.name] = Engine(runner, tok, drafter, c.num_draft_tokens, policy=policy,
                                 max_running=spec.max_running, prompt_cache_bytes=spec.prompt_cache_bytes(runner))
    return out


def _batch_sizes(cfg: BenchConfig) -> tuple[int, ...]:
    """The batch sizes `auto` prices: 1 and each concurrency level."""
    return tuple(sorted({1, *cfg.concurrency}))
