"""The measuring and serving commands: `draftwise bench`, `plan` and `serve`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftwise.cli_args import _model_args, _port, _prompt_cache_arg, _spec, _writable


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
    from draftwise.build import DEFAULT_PROMPT_CACHE_MB

    _model_args(s)
    _prompt_cache_arg(s, None, f"{DEFAULT_PROMPT_CACHE_MB} where the backend can keep KV, "
                               "off on onnx, which cannot save a sequence's KV")
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
