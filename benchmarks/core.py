"""draftwise side by side with a library's own decoding, in one run (docs/results.md §1, §2).

  torch   Qwen2.5-Coder-1.5B on torch (fp32, CPU). Per prompt, in this order: transformers
          generate() plain, draftwise plain, draftwise speculative, transformers speculative
          (prompt lookup on EditEval, the 0.5B as assistant model on HumanEval).
  llama   Qwen2.5-Coder-1.5B Q4_K_M on llama.cpp, EditEval and Spec-Bench prose; per prompt each of
          --configs: llama_plain (llama_cpp.Llama.generate), llama_pld:N (LlamaPromptLookupDecoding),
          dw_plain, dw_ngram:D, dw_model:D (the 0.5B draft model).
  report  markdown of a rows file: speed, speedups over both plain decodings with bootstrap 95%
          intervals, stats, and every output divergence from draftwise plain decoding.

Rows are appended to --out as each request finishes (a rerun resumes); then the first divergence
of each output from draftwise plain decoding is appended, with the target's top-2 logit margins.

    .venv/bin/python benchmarks/core.py torch --ngram-d 10,auto --out results/core_torch.jsonl
    .venv/bin/python benchmarks/core.py llama --configs llama_plain,dw_plain,dw_ngram:15 --out results/core_llama.jsonl
    .venv/bin/python benchmarks/core.py report results/core_torch.jsonl > core_torch.md
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from draftwise.compare import divergence_report
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.stats import SpecStats, aggregate

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


# --- measuring --------------------------------------------------------------------------------

def measure(out: Path, plan: list, max_tokens: int, meta: dict, tok) -> None:
    """plan: [(Prompt, [(config name, Engine or fn(ids, max_new) -> (tokens, seconds))])]. Rows
    already in `out` are skipped, so an interrupted run resumes."""
    done = {(r["prompt_id"], r["config"]) for r in map(json.loads, out.open())} if out.exists() else set()
    for prompt, configs in plan:
        ids = prompt.token_ids(tok)
        for name, how in configs:
            if (prompt.id, name) in done:
                continue
            row = {"prompt_id": prompt.id, "category": prompt.category, "config": name,
                   "prompt_tokens": len(ids), **meta}
            if isinstance(how, Engine):
                r = how.generate(ids, max_tokens=max_tokens)
                row.update(tokens=r.token_ids, seconds=r.stats.wall_s, stats=r.stats.to_dict())
            else:
                toks, secs = how(ids, max_tokens)
                row.update(tokens=toks, seconds=secs)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{prompt.id:16} {name:22} {len(row['tokens']):4d} tok "
                  f"{len(row['tokens']) / row['seconds']:6.2f} tok/s", flush=True)


def append_divergences(out: Path, target, tok, prompts: dict) -> None:
    """Once per (prompt, configuration): the first divergence from dw_plain, or None."""
    rows = [json.loads(line) for line in out.open()]
    base = {r["prompt_id"]: r["tokens"] for r in rows if r["config"] == "dw_plain"}
    seen = {(r["prompt_id"], r["config"]) for r in rows}
    with out.open("a") as f:
        for r in rows:
            pid, name = r["prompt_id"], r["config"]
            if name.startswith("divergence:") or name == "dw_plain" or pid not in base or pid not in prompts:
                continue
            if (pid, f"divergence:{name}") in seen:
                continue
            div = divergence_report(target, prompts[pid].token_ids(tok), base[pid], r["tokens"])
            f.write(json.dumps({"prompt_id": pid, "config": f"divergence:{name}",
                                "divergence": div.to_dict() if div else None}) + "\n")
            f.flush()  # an interrupted check keeps what it found


def warm_up(plan: list, tok) -> None:
    """One short request through every path, so first-call costs are not measured."""
    ids = plan[0][0].token_ids(tok)
    hows = {id(h): h for _, cfgs in plan for _, h in cfgs}.values()
    for how in hows:
        how.generate(ids, max_tokens=4) if isinstance(how, Engine) else how(ids, 4)


def _engine(spec_kw: dict, target) -> Engine:
    from draftwise.build import EngineSpec, build_engine

    return build_engine(EngineSpec(**spec_kw), target=target)[0]


def _load_target(**spec_kw):
    from draftwise.build import EngineSpec, build_engine

    _, runner, tok = build_engine(EngineSpec(target=TARGET, drafter="none", num_draft_tokens=0, **spec_kw))
    return runner, tok


def torch_plan(a) -> tuple[list, object, object, dict]:
    import torch

    from draftwise.prompts import edit_eval, humaneval

    target, tok = _load_target(backend="torch", threads=a.threads)
    eos = sorted(tok.eos_token_ids)

    def hf(model, **kw):
        def generate(ids, max_new):
            x = torch.tensor([ids])
            t = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                                     do_sample=False, eos_token_id=eos, pad_token_id=eos[0], **kw)
            return out[0, len(ids):].tolist(), time.perf_counter() - t
        return generate

    hf_plain, plain = hf(target.model), Engine(target, tok)
    ngrams = []
    for d in a.ngram_d.split(","):
        eng = (_engine(dict(target=TARGET, drafter="ngram", num_draft_tokens="auto", backend="torch",
                            threads=a.threads), (target, tok)) if d == "auto"
               else Engine(target, tok, NgramDrafter(2, 4), int(d)))
        ngrams.append((f"dw_ngram_d{d}", eng))
    plan = []
    if "editeval" in a.workloads:
        lookup = hf(target.model, prompt_lookup_num_tokens=10)
        plan += [(p, [("hf_plain", hf_plain), ("dw_plain", plain), *ngrams, ("hf_prompt_lookup_10", lookup)])
                 for p in edit_eval(a.n)]
    if "humaneval" in a.workloads:
        model = _engine(dict(target=TARGET, drafter="model", draft_model=DRAFT, num_draft_tokens=a.model_d,
                             backend="torch", threads=a.threads), (target, tok))
        hf_draft = model.drafter.runner.model
        hf_draft.generation_config.num_assistant_tokens = a.model_d
        plan += [(p, [("hf_plain", hf_plain), ("dw_plain", plain), (f"dw_model_d{a.model_d}", model),
                      ("hf_assistant", hf(target.model, assistant_model=hf_draft))]) for p in humaneval(a.n)]
    if a.no_hf:
        plan = [(p, [c for c in cfgs if not c[0].startswith("hf_")]) for p, cfgs in plan]
    meta = {"torch": torch.__version__, "threads": a.threads, "machine": platform.machine(),
            "max_tokens": a.max_tokens, "packed_linear": getattr(target, "packed", None)}
    return plan, target, tok, meta


def llama_plan(a) -> tuple[list, object, object, dict]:
    import llama_cpp

    from draftwise.models.registry import resolve
    from draftwise.prompts import edit_eval, spec_bench

    kernels = "repacked" if a.fast_kernels else "standard"
    target, tok = _load_target(backend="llama.cpp", threads=a.threads, kernels=kernels)

    def llama(**kw):
        llm = llama_cpp.Llama(resolve(TARGET).path, n_ctx=4096, n_threads=a.threads, verbose=False, **kw)

        def generate(ids, max_new):
            t, out = time.perf_counter(), []
            for tok_id in llm.generate(ids, temp=0.0, top_k=1, reset=True):
                out.append(int(tok_id))
                if tok_id in tok.eos_token_ids or len(out) >= max_new:
                    break
            return out, time.perf_counter() - t
        return generate

    min_n, max_n = map(int, a.ngram.split(","))
    configs = {}
    for c in a.configs.split(","):
        kind, _, d = c.partition(":")
        if kind == "dw_plain":
            configs[c] = Engine(target, tok)
        elif kind == "dw_ngram":
            configs[c] = Engine(target, tok, NgramDrafter(min_n, max_n), int(d))
        elif kind == "dw_model":
            configs[c] = _engine(dict(target=TARGET, drafter="model", draft_model=DRAFT, num_draft_tokens=int(d),
                                      backend="llama.cpp", threads=a.threads, kernels=kernels),
                                 (target, tok))
        elif kind == "llama_plain":
            configs[c] = llama()
        elif kind == "llama_pld":
            configs[c] = llama(draft_model=llama_cpp.llama_speculative.LlamaPromptLookupDecoding(
                num_pred_tokens=int(d)))
        else:
            raise SystemExit(f"unknown configuration {c}")
    prompts = edit_eval(a.n) if "editeval" in a.workloads else []
    if "prose" in a.workloads:  # reported as one category
        prose = spec_bench(("writing",), 4) + spec_bench(("roleplay",), 3) + spec_bench(("humanities",), 3)
        prompts += [replace(p, category="prose") for p in prose[: a.n]]
    plan = [(p, list(configs.items())) for p in prompts]
    meta = {"backend": "llama.cpp", "fast_kernels": a.fast_kernels, "llama_cpp_python": llama_cpp.__version__,
            "threads": a.threads, "machine": platform.machine(), "max_tokens": a.max_tokens, "torch": "-"}
    return plan, target, tok, meta


# --- reporting --------------------------------------------------------------------------------

def ms_per_token(rows) -> float:
    return 1000 * sum(r["seconds"] for r in rows) / sum(len(r["tokens"]) for r in rows)


def speedup_ci(base: dict, cfg: dict, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Ratio of ms per emitted token (base / cfg) over prompts, with a bootstrap 95% interval."""
    ids = sorted(set(base) & set(cfg))
    point = ms_per_token([base[i] for i in ids]) / ms_per_token([cfg[i] for i in ids])
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        s = [rng.choice(ids) for _ in ids]
        boots.append(ms_per_token([base[i] for i in s]) / ms_per_token([cfg[i] for i in s]))
    boots.sort()
    return point, boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]


def _stats(cfg: dict) -> SpecStats:
    return aggregate([SpecStats(**{k: v for k, v in r["stats"].items() if k in SpecStats.__slots__})
                      for r in cfg.values()])


def report(path: str | Path) -> str:
    rows = [json.loads(line) for line in open(path)]
    runs = [r for r in rows if not r["config"].startswith("divergence:")]
    divs = {(r["prompt_id"], r["config"].split(":", 1)[1]): r["divergence"] for r in rows
            if r["config"].startswith("divergence:")}
    by = defaultdict(lambda: defaultdict(dict))  # category -> config -> prompt -> row
    for r in runs:
        by[r["category"]][r["config"]][r["prompt_id"]] = r
    meta = runs[0]
    detail = ("dequantised to fp32, torch " + meta["torch"]) if meta.get("backend", "torch") == "torch" else \
        f"on llama.cpp (llama-cpp-python {meta.get('llama_cpp_python')})"
    out = [f"Machine: {meta['machine']}, {meta['threads']} threads, greedy, max {meta['max_tokens']} new tokens, "
           f"Qwen2.5-Coder-1.5B Q4_K_M {detail}.\n"]
    fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
    for cat, cfgs in by.items():
        base = cfgs["dw_plain"]
        ext = next(n for n in cfgs if n.endswith("_plain") and n != "dw_plain")
        out += [f"### {cat} ({len(base)} prompts)\n",
                f"| configuration | tokens/s | ms/token | vs draftwise plain (95% CI) | vs {ext} (95% CI) | "
                "acceptance rate | AL | outputs = draftwise plain |", "|---|---|---|---|---|---|---|---|"]
        for name, cfg in cfgs.items():
            ms = ms_per_token(list(cfg.values()))
            sp, lo, hi = speedup_ci(base, cfg)
            hf, hlo, hhi = speedup_ci(cfgs[ext], cfg)
            st = _stats(cfg) if "stats" in next(iter(cfg.values())) else None
            checked = [p for p in cfg if (p, name) in divs or name == "dw_plain"]
            same = sum(1 for p in checked if divs.get((p, name)) is None)
            out.append(f"| {name} | {1000 / ms:.2f} | {ms:.0f} | {sp:.2f}× [{lo:.2f}, {hi:.2f}] | "
                       f"{hf:.2f}× [{hlo:.2f}, {hhi:.2f}] | {fmt(st and st.acceptance_rate, '{:.3f}')} | "
                       f"{fmt(st and st.acceptance_length, '{:.2f}')} | {same}/{len(checked)}"
                       + ("" if len(checked) == len(cfg) else f" ({len(cfg) - len(checked)} unchecked)") + " |")
        out.append("")
        for name, cfg in cfgs.items():
            if "stats" not in next(iter(cfg.values())) or name == "dw_plain":
                continue
            st = _stats(cfg)
            out.append(f"`{name}` stats: proposed {st.proposed_tokens}, accepted {st.accepted_draft_tokens}, "
                       f"emitted {st.emitted_tokens}, rounds {st.verification_rounds}, plain steps {st.plain_steps}, "
                       f"discarded {st.discarded_tokens}; time: prefill {st.prefill_s:.1f} s, draft {st.draft_s:.1f} s, "
                       f"verify {st.verify_s:.1f} s, other {st.other_s:.2f} s; per-position acceptance "
                       + ", ".join(f"{x:.2f}" for x in st.per_position_acceptance) + "\n")
    bad = [(k, v) for k, v in divs.items() if v is not None]
    out.append("### Output divergences from draftwise plain decoding\n")
    if not bad:
        out.append("None: every output is token-for-token identical to draftwise plain decoding.\n")
    for (pid, name), d in bad:
        out.append(f"- {pid} `{name}`: position {d['position']}, plain token {d['plain_token']}, other "
                   f"{d['spec_token']}; target top-2 logit margin {d['margin_single']:.4f} (single-token) / "
                   f"{d['margin_batched']:.4f} (batched)")
    return "\n".join(out)


# --- command line -----------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, out in (("torch", "results/core_torch.jsonl"), ("llama", "results/core_llama.jsonl")):
        p = sub.add_parser(name)
        p.add_argument("--out", default=out)
        p.add_argument("--n", type=int, default=10, help="prompts per workload")
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--threads", type=int, default=2)
    t = sub.choices["torch"]
    t.add_argument("--ngram-d", default="10", help="D of the n-gram drafter, or auto; comma-separated "
                   "for several configurations side by side (10,auto)")
    t.add_argument("--model-d", type=int, default=4)
    t.add_argument("--workloads", default="editeval,humaneval")
    t.add_argument("--no-hf", action="store_true", help="skip the transformers generate() rows")
    ll = sub.choices["llama"]
    ll.add_argument("--configs", default="llama_plain,dw_plain,dw_ngram:8,llama_pld:10,dw_model:4")
    ll.add_argument("--workloads", default="editeval,prose")
    ll.add_argument("--ngram", default="2,4", help="min_n,max_n")
    ll.add_argument("--fast-kernels", action="store_true",
                    help="draftwise runners with repacked kernels (what llama_cpp.Llama uses by default)")
    r = sub.add_parser("report")
    r.add_argument("rows", help="a rows file written by `core.py torch` or `core.py llama`")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.cmd == "report":
        print(report(a.rows))
        return
    plan, target, tok, meta = (torch_plan if a.cmd == "torch" else llama_plan)(a)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    warm_up(plan, tok)
    measure(out, plan, a.max_tokens, meta, tok)
    append_divergences(out, target, tok, {p.id: p for p, _ in plan})


if __name__ == "__main__":
    main()
