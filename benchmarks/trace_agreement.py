"""Teacher-forced traces of a bench run's plain outputs, for replaying the planner offline.

For every plain request of RUN (its prompt rebuilt from the run's workload and seed), both models
score prompt + output in one forward each; per output position t the trace holds the target's
token and top probability and the draft model's argmax and its probability. Greedy acceptance of
any round is then known: a draft started at t is accepted up to the first position where the
draft's argmax differs from the target's token (accepted tokens are the target's, so the draft's
context is the one it was scored in). benchmarks/replay_planner.py replays the planner on them.

    .venv/bin/python benchmarks/trace_agreement.py results/planner_llama_v8 results/traces_llama.jsonl
"""
import json
import sys

import torch

from draftwise.backends.llama_runner import load_llama
from draftwise.bench.config import BenchConfig, load_prompts


def main(run: str, out: str, target: str = "qwen2.5-coder-1.5b", draft: str = "qwen2.5-coder-0.5b") -> None:
    rows = [json.loads(x) for x in open(f"{run}/requests.jsonl")]
    plan = next(r for r in rows if r.get("kind") == "session")["plan"]
    cfg = BenchConfig(workload=plan["workload"], n_per_category=plan["n_per_category"], seed=plan["seed"])
    prompts = {p.id: p for p in load_prompts(cfg)}
    plain = sorted((r for r in rows if r.get("kind") == "request" and r["config"] == "plain"),
                   key=lambda r: r["order"])
    tgt, tok = load_llama(target, threads=2)
    drf, _ = load_llama(draft, threads=2)
    with open(out, "w") as f:
        for r in plain:
            ids, outp = prompts[r["prompt_id"]].token_ids(tok), r["token_ids"]
            feed, n = ids + outp[:-1], len(outp)
            rec = {"prompt_id": r["prompt_id"], "category": r["category"], "order": r["order"],
                   "prompt_tokens": len(ids), "prompt_ids": ids, "tokens": outp}
            for name, m in (("target", tgt), ("draft", drf)):
                s = m.new_sequence()
                p = torch.softmax(m.forward([s], [feed], [n])[0].float(), -1)  # [n, V]
                m.free(s)
                top, arg = p.max(-1)
                rec[name + "_top"] = [round(float(x), 4) for x in top]
                rec[name + "_argmax"] = arg.tolist()
            f.write(json.dumps(rec) + "\n")
            f.flush()
            agree = sum(a == b for a, b in zip(rec["draft_argmax"], outp)) / n
            print(r["prompt_id"], r["category"], len(ids), n, f"agree {agree:.2f}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
