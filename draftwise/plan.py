"""`draftwise plan`: measured curves -> predicted speedup per D -> chosen policy -> measured speedup.

Prediction is a replay: a pilot run at the largest D records, per verification round, how many
tokens the drafter proposed (L_r) and how many the target accepted (a_r). A draft at a smaller D
proposes a prefix of the same tokens (n-gram lookup and greedy drafting are prefix-consistent),
so at D the round would emit min(a_r, D) + 1 tokens and cost draft(min(L_r, D)) + verify(min(L_r,
D) + 1) on the measured curves. Steps without a proposal stay plain steps. Later rounds would start
at other positions; the replay ignores that, which is why the measured run follows.
"""
from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from draftwise.bench.results import Results
from draftwise.engine import Engine
from draftwise.request import GenerationResult
from draftwise.planner import Planner


@dataclass(slots=True)
class Pilot:
    rounds: list[tuple[int, int]]  # (proposed, accepted) per verification round
    plain_steps: int  # steps after the first token without a proposal
    max_draft: int
    draft_s_per_step: float = 0.0  # measured drafting time per decode step
    other_s_per_step: float = 0.0  # measured bookkeeping per decode step
    prefill_s: float = 0.0  # mean measured prefill per prompt


def pilot(engine: Engine, prompts: list[list[int]], max_tokens: int) -> Pilot:
    """Greedy runs at the engine's fixed D, keeping each round's (proposed, accepted)."""
    rounds, plain, draft_s, other_s, prefill_s = [], 0, 0.0, 0.0, 0.0
    for ids in prompts:
        r: GenerationResult = engine.generate(ids, max_tokens=max_tokens)
        rounds += [(x.proposed, x.accepted) for x in r.rounds]
        plain += r.stats.plain_steps - 1  # the prefill step is not a decode step
        draft_s, other_s = draft_s + r.stats.draft_s, other_s + r.stats.other_s
        prefill_s += r.stats.prefill_s
    steps = max(len(rounds) + plain, 1)
    return Pilot(rounds, plain, engine.num_draft_tokens, draft_s / steps, other_s / steps,
                 prefill_s / max(len(prompts), 1))


def calibrate(planner: Planner, p: Pilot) -> None:
    """A cheap drafter's call time and the per-step bookkeeping, as measured in the pilot."""
    if planner.draft is None:
        planner.draft_call_s = p.draft_s_per_step
    planner.overhead_s = p.other_s_per_step


def predict(planner: Planner, p: Pilot, max_tokens: int | None = None) -> dict[int, float]:
    """Predicted speedup over plain decoding for each fixed D in 0..pilot D (replay, above); with
    max_tokens, end to end for requests of that many tokens (the pilot's mean prefill included)."""
    t1 = planner.target(1) + planner.overhead_s
    out = {}
    for d in range(0, p.max_draft + 1):
        tokens, time = float(p.plain_steps), p.plain_steps * t1
        for proposed, accepted in p.rounds:
            k = min(proposed, d)
            tokens += min(accepted, d) + 1
            time += planner.draft_cost(k) + planner.target(k + 1) + planner.overhead_s if k else t1
        out[d] = (tokens / time) * t1 if time > 0 else 1.0
        if max_tokens is not None:  # prefill + max_tokens decode steps, plain vs at this rate
            out[d] = (p.prefill_s + max_tokens * t1) / (p.prefill_s + max_tokens * t1 / out[d])
    return out


@dataclass(slots=True)
class EndpointRun:
    """One configuration of a deployed engine measured from outside (a bench of its endpoint): the
    decoding after each request's first token, and its speculative counters."""
    decode_s: float  # sum over requests of e2e - ttft
    decode_tokens: int  # tokens after each request's first
    prefill_s: float = 0.0  # sum over requests of the time to the first token
    requests: int = 1
    rounds: int = 0  # steps that verified a draft
    proposed: int = 0  # draft tokens verified (0: unknown, k a round)
    accepted_per_position: list[int] = field(default_factory=list)  # [K] rounds whose draft token i was accepted

    @property
    def plain_steps(self) -> int:
        """Steps without a draft: every round emits its accepted tokens and one more (an engine
        that drafts at every step can count a round or two more than the requests' tokens show:
        vLLM's counters here; then none)."""
        return max(0, self.decode_tokens - self.rounds - sum(self.accepted_per_position))

    @classmethod
    def of(cls, res: Results, config: str, concurrency: int = 1, category: str | None = None) -> EndpointRun:
        """From a bench's results (draftwise.bench.results): the configuration's requests at that
        concurrency (of one prompt category) and the engine counters read around them (around
        each request group: a group with a request of another category is left out)."""
        reqs = [r for r in res.requests.values() if r["config"] == config and r["concurrency"] == concurrency
                and r.get("ttft_s") is not None and category in (None, r.get("category"))]
        if not reqs:
            raise ValueError(f"no requests of {config!r} at concurrency {concurrency}"
                             + (f" in category {category!r}" if category else ""))
        ids = {r["prompt_id"] for r in reqs}
        run = cls(sum(r["e2e_s"] - r["ttft_s"] for r in reqs), sum(r["emitted_tokens"] - 1 for r in reqs),
                  sum(r["ttft_s"] for r in reqs), len(reqs))
        for srv in res.servers.values():
            if srv["config"] != config or srv["concurrency"] != concurrency or not srv.get("stats") \
                    or not set(srv.get("prompt_ids") or []) <= ids:
                continue
            run.rounds += srv["stats"].get("verification_rounds", 0)
            run.proposed += srv["stats"].get("proposed_tokens", 0)
            acc = srv["stats"].get("accepted_per_position") or []
            run.accepted_per_position += [0] * (len(acc) - len(run.accepted_per_position))
            for i, a in enumerate(acc):
                run.accepted_per_position[i] += a
        return run


def predict_fixed_k(plain: EndpointRun, pilot: EndpointRun, k: int) -> dict[int, float]:
    """Speedup over plain requests of an engine that drafts K' = 1..k tokens a round, from its run
    at k (`pilot`) and its plain run on the same requests: the pilot's rounds would accept the
    first K' of the same tokens (prefix-consistent drafts, as the replay above), its steps without
    a draft stay plain steps (the plain run's seconds per token), and a round's seconds beyond a
    plain step grow linearly in the tokens it drafts, from none to the pilot's measured round (from
    outside the engine no other point of its cost curve is measured). An engine whose drafts vary
    in length (llama-server's) drafted L = proposed / rounds tokens a round on average; at K' a
    round is priced at min(L, K') tokens, no less than the rounds' mean of min(L_r, K') (min is
    concave), so that prediction errs slow. End to end: each run's own time to the first token is
    added (an engine set up to speculate can take longer to its first token: vLLM's CPU build here
    ~0.7 against ~0.4 s)."""
    out = {0: 1.0}
    step_s = plain.decode_s / max(plain.decode_tokens, 1)
    steps = pilot.plain_steps
    # a pilot that never drafted (no match in a category) predicts plain steps at every K
    round_s = (pilot.decode_s - steps * step_s) / pilot.rounds if pilot.rounds else step_s
    mean_len = pilot.proposed / pilot.rounds if pilot.proposed and pilot.rounds else k
    acc = pilot.accepted_per_position + [0] * k
    plain_s = plain.prefill_s / plain.requests + pilot.decode_tokens / pilot.requests * step_s
    for d in range(1, k + 1):
        tokens = steps + pilot.rounds + sum(acc[:d])
        seconds = steps * step_s + pilot.rounds * (step_s + (round_s - step_s) * min(mean_len, d) / mean_len)
        out[d] = plain_s / (pilot.prefill_s / pilot.requests + seconds * pilot.decode_tokens / tokens / pilot.requests)
    return out


def curves_text(planner: Planner, max_k: int = 17) -> str:
    lines = ["k   verify ms" + ("   draft ms" if planner.draft is not None else "")]
    for k in range(1, max_k + 1):
        row = f"{k:<3} {1e3 * planner.target(k):9.1f}"
        if planner.draft is not None:
            row += f"  {1e3 * planner.draft(k):9.1f}"
        lines.append(row)
    if planner.draft is None:
        lines.append(f"drafter: {1e3 * planner.draft_call_s:.2f} ms per proposal (measured in the pilot)")
    return "\n".join(lines)


def hardware() -> dict:
    from draftwise.machine import cpu_model

    import os

    return {"cpu": cpu_model() or platform.processor(), "cores": os.cpu_count(), "machine": platform.machine(),
            "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def engine_configs(drafter: str, d: int, draft_model: str | None, ngram: tuple[int, int], target: str) -> dict:
    """The setting as a vLLM --speculative-config JSON and as SGLang flags (D = 0: speculation off)."""
    if d == 0:
        return {"vllm": None, "sglang": "", "note": "speculation does not pay here: serve without it"}
    if drafter == "ngram":
        vllm = {"method": "ngram", "num_speculative_tokens": d, "prompt_lookup_min": ngram[0],
                "prompt_lookup_max": ngram[1]}
        sglang = f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {d + 1}"
    else:
        vllm = {"method": "draft_model", "model": draft_model, "num_speculative_tokens": d}
        sglang = (f"--speculative-algorithm STANDALONE --speculative-draft-model-path {draft_model} "
                  f"--speculative-num-steps {d} --speculative-eagle-topk 1 --speculative-num-draft-tokens {d + 1}")
    return {"vllm": vllm, "sglang": sglang, "target": target}


def write_predictions(out_dir: Path, planner: Planner, pred: dict[int, float], p: Pilot, meta: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    best = max(pred, key=pred.get)
    doc = {"kind": "plan-prediction", "hardware": hardware(), **meta,
           "curves_ms": {"verify": [1e3 * planner.target(k) for k in range(1, 18)],
                         "draft": [1e3 * planner.draft(k) for k in range(1, 18)] if planner.draft else None},
           "pilot": {"rounds": len(p.rounds), "plain_steps": p.plain_steps, "max_draft": p.max_draft},
           "predicted_speedup": {str(d): v for d, v in pred.items()}, "best_fixed_d": best}
    path = out_dir / "plan_predictions.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def save_engine_configs(out_dir: Path, cfgs: dict) -> list[Path]:
    label = hardware()
    paths = []
    if cfgs["vllm"] is not None:
        paths.append(out_dir / "vllm_speculative_config.json")
        paths[-1].write_text(json.dumps(cfgs["vllm"]) + "\n")
    paths.append(out_dir / "engine_settings.json")
    paths[-1].write_text(json.dumps({"measured_on": label, **cfgs}, indent=1) + "\n")
    return paths


def plan_here(spec, out: Path, workload: str, n: int | None, seed: int, max_tokens: int, pilot_tokens: int,
              measure: bool = True, progress: bool = True, log=print) -> dict[int, float]:
    """`draftwise plan` in process: a pilot at D = spec.num_draft_tokens (the largest D
    predicted) on the workload's prompts, the planner's curves calibrated on it, the speedup of
    every fixed D predicted (replay) and written with the engine settings of the best one before
    any measured run; then (`measure`) plain, the drafter at `auto` and at the best fixed D
    measured side by side. Returns the predictions."""
    from draftwise.bench import BenchConfig, run_bench, summarise
    from draftwise.bench.config import load_prompts
    from draftwise.build import build_engine, load_drafter
    from draftwise.policy_build import make_planner

    pilot_d = spec.num_draft_tokens
    spec_engine, runner, tok = build_engine(spec)
    drafter = spec_engine.drafter
    planner = make_planner(runner, drafter, max_draft=pilot_d)
    cfg = BenchConfig(**spec.model_fields(), max_tokens=max_tokens, workload=workload, n_per_category=n, seed=seed,
                      configs=("plain",), out_dir=str(out / "bench"), margins=False)
    prompts = load_prompts(cfg)
    ids = [p.token_ids(tok) for p in prompts]
    print(f"pilot: {len(ids)} prompts x {pilot_tokens} tokens at D={pilot_d}", file=sys.stderr)
    pil = pilot(spec_engine, ids, pilot_tokens)
    calibrate(planner, pil)
    pred = predict(planner, pil, max_tokens)
    best = max(pred, key=pred.get)
    path = write_predictions(out, planner, pred, pil, {"target": spec.target, "drafter": spec.drafter,
                                                       "backend": runner.backend, "workload": workload})
    log(curves_text(planner))
    log(f"predicted speedup over plain decoding per fixed D (replay of the pilot on the curves; "
        f"{max_tokens}-token requests, the pilot's mean prefill of {pil.prefill_s:.2f} s included):")
    log("  " + "  ".join(f"D={d}: {v:.2f}x" for d, v in pred.items()))
    log(f"chosen: --num-draft-tokens auto (per round); best fixed D = {best} ({pred[best]:.2f}x); "
        f"predictions written to {path} before the measured run")
    cfgs = engine_configs(spec.drafter, best, spec.draft_model, (spec.ngram_min, spec.ngram_max), spec.target)
    for p_ in save_engine_configs(out, cfgs):
        log(f"wrote {p_}")
    if not measure:
        return pred
    engines = {"plain": Engine(runner, tok, max_running=1),
               f"{spec.drafter}:auto": Engine(runner, tok, drafter, "auto", planner=planner, max_running=1)}
    if best > 0:
        other = load_drafter(spec, tok, draft_runner=drafter.runner)
        engines[f"{spec.drafter}:{best}"] = Engine(runner, tok, other, best, max_running=1)
    cfg.configs, cfg.margins = tuple(engines), True
    run_bench(cfg, engines=engines, tokenizer=tok, prompts=prompts, progress=progress)
    s = summarise(cfg.out_dir)
    log(f"{'config':<14} {'predicted':>9} {'measured [95% CI]':>26}")
    for r in s.rows:
        if r.scope != "all" or r.config == "plain":
            continue
        d = r.config.split(":")[1]
        guess = pred[int(d)] if d != "auto" else r.predicted_speedup
        ci = f"[{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if r.speedup_lo is not None else ""
        log(f"{r.config:<14} {guess or 0:>8.2f}x {r.speedup:>9.2f}x {ci:>16}")
    log(f"(auto's prediction is the planner's own, summed over the rounds it planned; "
        f"outputs checked: {len(s.mismatches)} mismatches of {s.checked})")
    return pred


def choose_k(pred: dict[int, float], per_category: dict[str, dict[int, float]], floor: float = 1.0) -> int:
    """The K with the highest predicted speedup over the whole workload among those predicted to
    keep every category at `floor` or above (a fixed K is served to every request; 1.0: slow no
    category); 0 (no speculation) when none is."""
    ok = [d for d in pred if all(p[d] >= floor for p in per_category.values())]
    return max(ok, key=lambda d: (pred[d], -d), default=0)


def plan_peer(engine: str, target: str, method: str, k: int, draft_model: str, bench_kw: dict, out_dir: Path,
              port: int = 8401, max_context: int = 2048, measure: bool = True, log=print, floor: float = 1.0) -> dict:
    """`draftwise plan --engine vllm|llama-server`: the plain engine and the engine drafting at
    most k tokens a round (vLLM: `method` ngram or draft; llama-server: ngram-simple, ngram-mod or
    draft, peers.llama_spec) measured side by side at concurrency 1 (the pilot), the speedup of
    every K' <= k predicted (predict_fixed_k) over the workload and per prompt category, the best
    that keeps every category at `floor` or above (choose_k) written as the engine's setting (vLLM:
    vllm_speculative_config.json; llama-server: llama_server_flags.txt), then the engine started
    with exactly that setting and measured against the same plain server (every server without
    its prompt cache: the plain one is asked every prompt twice). `bench_kw`: the
    BenchConfig fields of the workload (target, workload, n_per_category, seed, max_tokens; the
    pilot's max_tokens under "pilot_tokens"). Returns {"predicted", "per_category", "best",
    "measured"}."""
    from draftwise.bench import BenchConfig, run_bench, summarise, write_report
    from draftwise.peers import Server, llama_server_command, llama_spec, vllm_command, vllm_spec

    if engine == "vllm":
        spec = lambda d: vllm_spec(method, d, draft_model)  # noqa: E731
        cmd = lambda p, s: vllm_command(target, p, max_context, 1, s, prompt_cache=False)  # noqa: E731
        setting, write = "vllm_speculative_config.json", lambda s: json.dumps(s) + "\n"  # noqa: E731
    elif engine == "llama-server":
        spec = lambda d: llama_spec(method, d, draft_model)  # noqa: E731
        cmd = lambda p, s: llama_server_command(target, p, max_context, 1, s, prompt_cache=False)  # noqa: E731
        setting, write = "llama_server_flags.txt", lambda s: " ".join(s) + "\n"  # noqa: E731
    else:
        raise ValueError(f"plan --engine {engine!r}: expected vllm or llama-server")
    spec(k)  # a bad method or k fails here, before any server starts
    out_dir.mkdir(parents=True, exist_ok=True)
    kw = dict(bench_kw)
    pilot_tokens = kw.pop("pilot_tokens", kw.get("max_tokens", 64))
    name = f"{method}{k}"

    def bench(eps: dict, sub: str, tokens: int):
        cfg = BenchConfig(**{**kw, "max_tokens": tokens}, endpoints=eps, out_dir=str(out_dir / sub), concurrency=(1,))
        run_bench(cfg, progress=False)
        return cfg.out_dir

    with open(out_dir / f"{engine}.log", "ab") as elog:
        with Server(cmd(port, None), port, log=elog) as plain:
            log(f"plain {engine} up; pilot: {method} drafting up to k = {k}")
            with Server(cmd(port + 1, spec(k)), port + 1, log=elog) as pilot:
                pdir = bench({"plain": plain.url, name: pilot.url}, "pilot", pilot_tokens)
            ps = summarise(pdir)
            ps.save(pdir)
            write_report(ps, Path(pdir) / "report.html")
            res = Results.load(pdir)
            base, run = EndpointRun.of(res, "plain"), EndpointRun.of(res, name)
            step_s = base.decode_s / max(base.decode_tokens, 1)
            pred = predict_fixed_k(base, run, k)
            cats = sorted({r.get("category") for r in res.requests.values()} - {None})
            per_cat = {c: predict_fixed_k(EndpointRun.of(res, "plain", category=c),
                                          EndpointRun.of(res, name, category=c), k) for c in cats}
            best = choose_k(pred, per_cat, floor)
            log(f"plain step {1e3 * step_s:.1f} ms; pilot: {run.rounds} rounds ({run.proposed} tokens drafted), "
                f"{run.plain_steps} plain steps, accepted per position {run.accepted_per_position}")
            log("predicted speedup per K (end to end): " + "  ".join(f"K={d}: {v:.2f}x" for d, v in pred.items()))
            for c, p in per_cat.items():
                log(f"  {c}: " + "  ".join(f"K={d}: {v:.2f}x" for d, v in p.items()))
            doc = {"kind": "plan-prediction", "engine": engine, "hardware": hardware(), "target": target,
                   "method": method, "pilot_k": k, "plain_step_ms": 1e3 * step_s,
                   "pilot": {"rounds": run.rounds, "proposed": run.proposed, "plain_steps": run.plain_steps,
                             "accepted_per_position": run.accepted_per_position},
                   "predicted_speedup": {str(d): v for d, v in pred.items()},
                   "predicted_speedup_per_category": {c: {str(d): v for d, v in p.items()} for c, p in per_cat.items()},
                   "category_floor": floor, "best_k": best, "setting": spec(best) if best else None}
            (out_dir / "plan_predictions.json").write_text(json.dumps(doc, indent=1))
            result = {"predicted": pred, "per_category": per_cat, "best": best, "measured": None}
            if best == 0:
                log(f"every K is predicted to take a category below {floor:g}x: serve {engine} without speculation")
                return result
            path = out_dir / setting
            path.write_text(write(spec(best)))
            log(f"wrote {path}")
            if not measure:
                return result
            chosen = f"{method}{best}"
            with Server(cmd(port + 1, spec(best)), port + 1, log=elog) as spec_srv:
                mdir = bench({"plain": plain.url, chosen: spec_srv.url}, "measured", kw.get("max_tokens", 64))
    s = summarise(mdir)
    s.save(mdir)
    write_report(s, Path(mdir) / "report.html")
    row = next(r for r in s.rows if r.scope == "all" and r.config == chosen)
    result["measured"] = (row.speedup, row.speedup_lo, row.speedup_hi)
    log(f"{chosen}: predicted {pred[best]:.2f}x, measured {row.speedup:.2f}x [{row.speedup_lo:.2f}, {row.speedup_hi:.2f}] "
        f"(outputs: {len(s.mismatches)} of {s.checked} differ from plain)")
    for c, p in per_cat.items():
        r = next(x for x in s.rows if x.scope == f"category:{c}" and x.config == chosen)
        log(f"  {c}: predicted {p[best]:.2f}x, measured {r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]")
    return result
