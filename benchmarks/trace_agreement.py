"""Teacher-forced traces of a bench run's plain outputs, for replaying the planner offline.

For every plain request of RUN (its prompt rebuilt from the run's workload and seed), both models
score prompt + output in one forward each; per output position t the trace holds the target's
token and top probability and the draft model's argmax and its probability. Greedy acceptance of
any round is then known: a draft started at t is accepted up to the first position where the
draft's argmax differs from the target's token (accepted tokens are the target's, so the draft's
context is the one it was scored in). benchmarks/replay_planner.py replays the planner on them.

With `--head [NAME|DIR]` it measures a draft head instead: its teacher-forced acceptance per draft
position (train-head's unroll, draftwise.train_head.ttt_losses) over the chains that start in each
plain output, per category and overall, next to what the run's head configurations accepted in
generation (docs/heads.md).

    .venv/bin/python benchmarks/trace_agreement.py docs/data/plain_llama_prose16 results/traces.jsonl
    .venv/bin/python benchmarks/trace_agreement.py results/head_llama10 results/head_tf.json --head
"""
from __future__ import annotations

import argparse
import json

import torch

from draftwise.bench.config import run_prompts as prompts_of_run
from draftwise.bench.results import Results


def run_prompts(run: str) -> tuple[list[dict], dict]:
    """The run's plain requests in run order, and its prompts by id (rebuilt from its plan)."""
    res = Results.load(run)
    plain = sorted((r for r in res.requests.values() if r["config"] == "plain"), key=lambda r: r["order"])
    return plain, prompts_of_run(res.sessions[0]["plan"], res.meta["conditions"])


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


def head_acceptance(run: str, out: str, target, tok, head_spec: str | None, target_name: str, steps: int = 3) -> dict:
    """The head's teacher-forced acceptance on the run's plain outputs, next to generation's."""
    from collections import defaultdict

    from draftwise.models.head import load_head
    from draftwise.models.heads import resolve_head
    from draftwise.train_head import acceptance, features_of, ttt_losses

    head = load_head(resolve_head(head_spec, target_name), target)
    t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
    t2d[head.draft_to_target] = torch.arange(head.config.draft_vocab_size)
    plain, prompts = run_prompts(run)
    hits, tot = defaultdict(lambda: [0] * steps), defaultdict(lambda: [0] * steps)
    for r in plain:
        ids = prompts[r["prompt_id"]].token_ids(tok) + r["token_ids"]
        logits, feats = features_of(target, ids)
        greedy = logits.argmax(-1)
        with torch.no_grad():
            _, _, alive, _ = ttt_losses(head, torch.tensor([ids]), feats[None], greedy[None], steps, t2d)
        first = len(ids) - len(r["token_ids"]) - 1  # chain i starts at position i + 1: the output's
        for key in (r["category"], "all"):
            for k, a in enumerate(alive):
                hits[key][k] += int(a[0, first:].sum())
                tot[key][k] += a[0, first:].numel()
        print(r["prompt_id"], f"{hits['all'][0] / max(tot['all'][0], 1):.3f}", flush=True)
    gen = defaultdict(lambda: [[0] * 16, [0] * 16])
    for r in Results.load(run).requests.values():
        if r["config"].startswith("head:"):
            st = r["stats"]
            for k, (p, a) in enumerate(zip(st["proposed_per_position"], st["accepted_per_position"])):
                gen[r["config"]][0][k] += a
                gen[r["config"]][1][k] += p
    res = {"teacher_forced": {k: acceptance(hits[k], tot[k]) for k in hits},
           "generation": {c: acceptance([a for a, p in zip(*v) if p], [p for p in v[1] if p]) for c, v in gen.items()}}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res


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
    ap.add_argument("--head", nargs="?", const="", default=None,
                    help="measure a draft head (a name or directory; bare: the target's packaged head)")
    a = ap.parse_args(argv)
    target, tok = _load(a.target, a.threads)
    if a.head is not None:
        res = head_acceptance(a.run, a.out, target, tok, a.head or None, a.target)
        for k, v in res["teacher_forced"].items():
            print(f"teacher-forced {k}: " + ", ".join(f"{x:.3f}" for x in v["acceptance_per_position"]))
        for k, v in res["generation"].items():
            print(f"generation {k}: " + ", ".join(f"{x:.3f}" for x in v["acceptance_per_position"]))
        return
    draft, _ = _load(a.draft, a.threads)
    write_traces(a.run, a.out, target, draft, tok)


if __name__ == "__main__":
    main()
