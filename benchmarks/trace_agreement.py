"""Teacher-forced traces of a bench run's plain outputs, for replaying the planner offline.

For every plain request of RUN (its prompt rebuilt from the run's workload and seed), both models
score prompt + output in one forward each; per output position t the trace holds the target's
token and top probability and the draft model's argmax and its probability. Greedy acceptance of
any round is then known: a draft started at t is accepted up to the first position where the
draft's argmax differs from the target's token (accepted tokens are the target's, so the draft's
context is the one it was scored in). benchmarks/replay_planner.py replays the planner on them.

    .venv/bin/python benchmarks/trace_agreement.py docs/data/plain_llama_prose16 results/traces.jsonl
"""
from __future__ import annotations

import argparse
import json

import torch

from draftwise.bench.config import BenchConfig, load_prompts


def run_prompts(run: str) -> tuple[list[dict], dict]:
    """The run's plain requests in run order, and its prompts by id (rebuilt from its plan)."""
    rows = [json.loads(x) for x in open(f"{run}/requests.jsonl")]
    plan = next(r for r in rows if r.get("kind") == "session")["plan"]
    cfg = BenchConfig(workload=plan["workload"], n_per_category=plan["n_per_category"], seed=plan["seed"])
    plain = sorted((r for r in rows if r.get("kind") == "request" and r["config"] == "plain"),
                   key=lambda r: r["order"])
    return plain, {p.id: p for p in load_prompts(cfg)}


def trace(request: dict, prompt_ids: list[int], target, draft) -> dict:
    """One plain request's trace: both models score prompt + output in one forward each."""
    out = request["token_ids"]
    feed, n = prompt_ids + out[:-1], len(out)
    rec = {"prompt_id": request["prompt_id"], "category": request["category"], "order": request["order"],
           "prompt_tokens": len(prompt_ids), "prompt_ids": prompt_ids, "tokens": out}
    for name, m in (("target", target), ("draft", draft)):
        s = m.new_sequence()
        p = torch.softmax(m.forward([s], [feed], [n])[0].float(), -1)  # [n, V]
        m.free(s)
        top, arg = p.max(-1)
        rec[name + "_top"] = [round(float(x), 4) for x in top]
        rec[name + "_argmax"] = arg.tolist()
    return rec


def write_traces(run: str, out: str, target, draft, tok) -> None:
    plain, prompts = run_prompts(run)
    with open(out, "w") as f:
        for r in plain:
            rec = trace(r, prompts[r["prompt_id"]].token_ids(tok), target, draft)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            agree = sum(a == b for a, b in zip(rec["draft_argmax"], rec["tokens"])) / len(rec["tokens"])
            print(r["prompt_id"], r["category"], rec["prompt_tokens"], len(rec["tokens"]), f"agree {agree:.2f}",
                  flush=True)


def _load(name: str, threads: int):
    from draftwise.build import EngineSpec, build_engine

    _, runner, tok = build_engine(EngineSpec(target=name, drafter="none", num_draft_tokens=0,
                                             backend="llama.cpp", threads=threads))
    return runner, tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a `draftwise bench` results directory with plain requests")
    ap.add_argument("out", help="traces file to write (JSONL)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    target, tok = _load(a.target, a.threads)
    draft, _ = _load(a.draft, a.threads)
    write_traces(a.run, a.out, target, draft, tok)


if __name__ == "__main__":
    main()
