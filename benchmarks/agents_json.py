"""Constrained plain vs constrained speculative decoding on the JSON-extraction workload, side by
side in one run on one loaded target (greedy): time per token end to end and after the first
token, the grammar's time (masks, walks, rollbacks), acceptance, schema validity and identity
with constrained plain decoding. Rows go to OUT/rows.jsonl, the table to stdout.

    flock /work/runs/cpu.lock .venv/bin/python benchmarks/agents_json.py \
        --out docs/data/agents_json --drafters ngram suffix --max-tokens 160
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from draftwise.build import EngineSpec, build_engine, load_target
from draftwise.compare import first_divergence
from draftwise.engine import Engine
from draftwise.grammar import Grammars

WORKLOAD = Path(__file__).parent / "workloads" / "json_extraction_2026_12_07.jsonl"


def run(engine: Engine, ids: list[int], grammar, max_tokens: int) -> dict:
    r = engine.generate(ids, max_tokens=max_tokens, constraint=grammar)
    s, n = r.stats, len(r.token_ids)
    return {"tokens": n, "wall_s": s.wall_s, "ttft_s": r.ttft_s, "grammar_s": s.grammar_s,
            "after_first_ms": 1e3 * (s.wall_s - r.ttft_s) / max(n - 1, 1), "proposed": s.proposed_tokens,
            "accepted": s.accepted_draft_tokens, "finish": r.finish_reason, "text": r.text, "token_ids": r.token_ids}


def valid(grammar, token_ids: list[int], text: str) -> bool:
    """The whole answer parses and a fresh parser of the schema takes it to its end."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    c = grammar.start()
    c.advance(token_ids)
    return c.finished


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/data/agents_json")
    ap.add_argument("--drafters", nargs="+", default=["ngram", "suffix"])
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--kernels", default="repacked")
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    rows = [json.loads(x) for x in WORKLOAD.read_text().splitlines() if x.strip()][: a.limit]
    base = EngineSpec(drafter="none", backend="llama.cpp", kernels=a.kernels, max_running=1)
    target = load_target(base)
    runner, tok = target
    grammars = Grammars(tok, runner.vocab_size)
    engines = {"plain": Engine(runner, tok, max_running=1)}
    for d in a.drafters:
        engines[d] = build_engine(EngineSpec(drafter=d, num_draft_tokens="auto", backend="llama.cpp",
                                             kernels=a.kernels, max_running=1), target=target)[0]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    warm = grammars.json_object()  # one untimed request per engine: kernels, cost curves, the grammar's caches
    for eng in engines.values():
        eng.generate(tok.apply_chat([{"role": "user", "content": "Say hi as JSON."}]), max_tokens=16, constraint=warm)
    results = []
    with open(out / "rows.jsonl", "w") as f:
        for row in rows:
            g = grammars.json_schema(row["response_format"]["json_schema"]["schema"])
            ids = tok.apply_chat([{"role": "user", "content": row["prompt"]}])
            plain = None
            for name, eng in engines.items():
                r = run(eng, ids, g, a.max_tokens)
                r.update(id=row["id"], config=name, valid=valid(g, r["token_ids"], r["text"]))
                plain = plain or r
                r["divergence"] = first_divergence(plain["token_ids"], r["token_ids"])
                results.append(r)
                f.write(json.dumps({k: v for k, v in r.items() if k != "token_ids"}) + "\n")
                print(f"{row['id']:10s} {name:7s} {r['tokens']:4d} tok  {r['after_first_ms']:6.1f} ms/tok after "
                      f"the first  grammar {1e3 * r['grammar_s'] / max(r['tokens'], 1):.2f} ms/tok  "
                      f"valid {r['valid']}  divergence {r['divergence']}", file=sys.stderr, flush=True)
    print("| config | tokens | ms/token end to end | ms/token after the first | speedup e2e | speedup after first "
          "| grammar ms/token | acceptance | valid | identical to plain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    plain_rows = [r for r in results if r["config"] == "plain"]
    p_e2e = sum(r["wall_s"] for r in plain_rows) / sum(r["tokens"] for r in plain_rows)
    p_after = sum(r["wall_s"] - r["ttft_s"] for r in plain_rows) / sum(r["tokens"] - 1 for r in plain_rows)
    for name in engines:
        rs = [r for r in results if r["config"] == name]
        n = sum(r["tokens"] for r in rs)
        e2e = sum(r["wall_s"] for r in rs) / n
        after = sum(r["wall_s"] - r["ttft_s"] for r in rs) / sum(r["tokens"] - 1 for r in rs)
        acc = sum(r["accepted"] for r in rs) / max(sum(r["proposed"] for r in rs), 1)
        print(f"| {name} | {n} | {1e3 * e2e:.1f} | {1e3 * after:.1f} | {p_e2e / e2e:.2f}x | {p_after / after:.2f}x | "
              f"{1e3 * sum(r['grammar_s'] for r in rs) / n:.2f} | {acc:.2f} | {sum(r['valid'] for r in rs)}/{len(rs)} | "
              f"{sum(r['divergence'] is None for r in rs)}/{len(rs)} |")
    print(f"median prompt tokens: {statistics.median(len(tok.apply_chat([{'role': 'user', 'content': r['prompt']}])) for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
