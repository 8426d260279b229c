"""The measuring loop: warm-up, then repeats x concurrency x prompt groups x configurations, in
interleaved order (A B, B A, A B, ...: each group starts one configuration later), so drift
(thermals, other load) hits every configuration alike, slow or within a group. Each request's
record is appended as soon as it is measured; a rerun skips what is there.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tqdm import tqdm

from draftwise.bench.check import find_mismatches
from draftwise.bench.config import BenchConfig, load_prompts
from draftwise.bench.engines import build_targets
from draftwise.bench.measure import EngineTarget, environment
from draftwise.bench.results import Results, ResultsWriter, check_conditions, request_key
from draftwise.engine import Engine
from draftwise.prompts import Prompt

WARMUP_TOKENS = 32  # enough to pass first-call costs (allocation, thread pools, graph set-up)


@dataclass(frozen=True, slots=True)
class Work:
    """One configuration serving one group of `concurrency` prompts (indices into the prompt list)."""
    repeat: int
    concurrency: int
    group: int
    config: str
    prompts: tuple[int, ...]


def plan(n_prompts: int, configs: list[str], repeats: int, concurrency: tuple[int, ...]) -> list[Work]:
    """Every configuration runs a group before the next group starts, starting one configuration
    later each group: A B C, B C A, C A B, ... A fixed order would put a drift within each group
    (the machine slowing over a group's minute) on the same configuration every time."""
    out = []
    for r in range(repeats):
        for c in concurrency:
            for g, start in enumerate(range(0, n_prompts, c)):
                idx = tuple(range(start, min(start + c, n_prompts)))
                k = g % len(configs) if configs else 0
                out += [Work(r, c, g, name, idx) for name in configs[k:] + configs[:k]]
    return out


def request_kwargs(cfg: BenchConfig, repeat: int, prompt_index: int, prompt: Prompt | None = None,
                   prediction: bool = False) -> dict:
    """One request's settings: the run's, the prompt's response_format (every configuration
    answers under it alike) and, with `prediction`, the prompt's prediction."""
    seed = None if cfg.sample_seed is None else cfg.sample_seed + 1000 * repeat + prompt_index
    kw = {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
          "top_k": cfg.top_k, "seed": seed}
    if prompt is not None and prompt.response_format:
        kw["response_format"] = prompt.response_format
    if prompt is not None and prompt.tools:
        kw["tools"] = list(prompt.tools)
        if prompt.tool_choice is not None:
            kw["tool_choice"] = prompt.tool_choice
    if prediction and prompt is not None and prompt.prediction:
        kw["prediction"] = prompt.prediction
    return kw


def _fits(targets: dict, ids: list[int], max_tokens: int) -> bool:
    """Whether a prompt fits every in-process configuration's context."""
    for t in targets.values():
        if isinstance(t, EngineTarget):
            try:
                t.engine.scheduler.check(ids, max_tokens)
            except ValueError:
                return False
    return True


def run_bench(cfg: BenchConfig, engines: dict[str, Engine] | None = None, tokenizer=None,
              prompts: list[Prompt] | None = None, progress: bool = True) -> Path:
    """Measure every configuration on the workload; returns the results file (JSON lines).
    `engines` (configuration name -> Engine sharing one target) skips loading models."""
    prompts = load_prompts(cfg) if prompts is None else prompts
    tooled = [p.id for p in prompts if p.tools]
    if tooled and not (cfg.endpoints and cfg.endpoint_api == "chat"):  # before anything is measured
        raise ValueError(f"prompts {', '.join(tooled[:3])} have tools, which a server answers: measure them with "
                         "--endpoint URL --endpoint-api chat (draftwise serve reads the calls back)")
    targets, tok = build_targets(cfg, engines, tokenizer)
    all_ids = [p.token_ids(tok) for p in prompts]
    fits = [_fits(targets, x, cfg.max_tokens) for x in all_ids]
    skipped = [p.id for p, ok in zip(prompts, fits) if not ok]  # left out for every configuration alike
    prompts, ids = [p for p, ok in zip(prompts, fits) if ok], [x for x, ok in zip(all_ids, fits) if ok]
    if not prompts:
        raise ValueError(f"no prompt fits the context with max_tokens={cfg.max_tokens}")

    describe = {n: t.describe() for n, t in targets.items()}
    base = describe[cfg.baseline]
    resolved = {"tokenizer": tok.fingerprint(),
                "backend": base.get("backend"), "precision": base.get("precision"),
                **({"kernels": base["kernels"]} if base.get("kernels") else {})}  # a resume must not mix kernels
    old = Results.load(cfg.out_dir)
    if old.meta is not None:
        check_conditions(old.meta["conditions"], cfg.conditions())
        if "resolved" in old.meta:
            check_conditions(old.meta["resolved"], resolved)
    work = plan(len(prompts), [c.name for c in cfg.run_configs()], cfg.repeats, cfg.concurrency)
    by_name = {c.name: c for c in cfg.run_configs()}
    key = lambda w, i: request_key(w.repeat, prompts[i].id, w.config, w.concurrency)  # noqa: E731
    todo = [w for w in work if any(key(w, i) not in old.requests for i in w.prompts)]
    order = max((r.get("order", 0) for r in old.requests.values()), default=-1) + 1

    with ResultsWriter(cfg.out_dir) as out:
        if old.meta is None:
            out.write({"kind": "meta", "conditions": cfg.conditions(), "resolved": resolved})
        out.write({"kind": "session", "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "plan": cfg.plan(), "environment": environment(), "prompts": len(prompts),
                   "skipped_prompts": skipped, "targets": describe})
        if todo:
            _warm_up(cfg, targets, prompts[0], ids[0])
        bar = tqdm(total=len(work), initial=len(work) - len(todo), disable=not progress, unit="group")
        for w in todo:
            sends = by_name[w.config].prediction
            reqs = [(prompts[i], ids[i], request_kwargs(cfg, w.repeat, i, prompts[i], sends))
                    for i in w.prompts]
            t_wall = time.time()
            recs, server = targets[w.config].run_group(reqs)
            for i, rec in zip(w.prompts, recs):
                if key(w, i) in old.requests:  # measured in an earlier session; rerun only as load
                    continue
                p = prompts[i]
                rec = {"kind": "request", "key": key(w, i), "repeat": w.repeat, "prompt_id": p.id,
                       "category": p.category, "bucket": cfg.bucket(len(ids[i])), "config": w.config,
                       "concurrency": w.concurrency, "group": w.group, "group_size": len(w.prompts),
                       "sequential": targets[w.config].sequential and w.concurrency > 1,
                       "order": order, "started_unix": t_wall, **rec}
                order += 1
                out.write(rec)
                old.add(rec)
            if server is not None:
                rec = {"kind": "server", "key": json.dumps([w.repeat, w.config, w.concurrency, w.group]),
                       "config": w.config, "concurrency": w.concurrency,
                       "prompt_ids": [prompts[i].id for i in w.prompts], "stats": server}
                if rec["key"] not in old.servers:
                    out.write(rec)
                    old.add(rec)
            bar.update(1)
        bar.close()
        if cfg.margins and cfg.temperature == 0 and not cfg.endpoints:
            _margins(cfg, targets, old, {p.id: (p, i) for p, i in zip(prompts, ids)}, out)
    return out.path


def _warm_up(cfg: BenchConfig, targets: dict, prompt: Prompt, ids: list[int]) -> None:
    kw = {**request_kwargs(cfg, 0, 0, prompt), "max_tokens": min(cfg.max_tokens, WARMUP_TOKENS)}
    for _ in range(cfg.warmup):
        for t in targets.values():
            t.run_group([(prompt, ids, kw)])
    for t in targets.values():  # the warm-up prompt is a measured one: measure it uncached
        t.forget_prompts()


def _margins(cfg: BenchConfig, targets: dict, res: Results, prompts: dict[str, tuple[Prompt, list[int]]],
             out) -> None:
    """For each new divergence from its reference (the baseline, or plain decoding on the row's
    backend: check.reference_config), the reference target's top-2 margin there: near zero means
    a rounding difference between batched and single-token forwards can flip the token (for a
    constrained row, among the tokens its grammar allows there). A row on another backend than its
    reference's (plain@onnx against llama.cpp plain) gets none: it diverges where the conversion
    moved the model, not by rounding, and replaying it token by token would be slow for nothing."""
    from draftwise.compare import divergence_report

    mismatches, _ = find_mismatches(list(res.requests.values()), cfg.baseline, res.divergences)
    for m in mismatches:
        if m.key in res.divergences or m.prompt_id not in prompts or m.unit != "token":
            continue
        r, ref = res.requests[m.key], res.requests[m.reference_key]
        base = targets[ref["config"]]
        if targets[r["config"]].engine.target.backend != base.engine.target.backend:
            continue
        prompt, ids = prompts[m.prompt_id]
        grammar = base.grammars(prompt.response_format) if prompt.response_format else None
        d = divergence_report(base.engine.target, ids, ref["token_ids"], r["token_ids"], grammar)
        if d is not None:
            rec = {"kind": "divergence", "key": m.key, **d.to_dict()}
            out.write(rec)
            res.add(rec)
