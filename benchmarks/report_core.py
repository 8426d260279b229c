"""Summarise a core_torch.jsonl run as markdown: speed, speedups with bootstrap 95% intervals,
stats per configuration, and every output divergence from draftwise plain decoding.

    .venv/bin/python benchmarks/report_core.py results/core_torch.jsonl > docs/results_core_torch.md
"""
from __future__ import annotations

import json
import random
import sys
from collections import defaultdict

from draftwise.stats import SpecStats, aggregate


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


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    runs = [r for r in rows if not r["config"].startswith("divergence:")]
    divs = {(r["prompt_id"], r["config"].split(":", 1)[1]): r["divergence"] for r in rows
            if r["config"].startswith("divergence:")}
    by = defaultdict(lambda: defaultdict(dict))  # category -> config -> prompt -> row
    for r in runs:
        by[r["category"]][r["config"]][r["prompt_id"]] = r
    meta = runs[0]
    backend = meta.get("backend", "torch")
    detail = ("dequantised to fp32, torch " + meta["torch"]) if backend == "torch" else \
        f"on llama.cpp (llama-cpp-python {meta.get('llama_cpp_python')})"
    print(f"Machine: {meta['machine']}, {meta['threads']} threads, greedy, max {meta['max_tokens']} new tokens, "
          f"Qwen2.5-Coder-1.5B Q4_K_M {detail}.\n")
    for cat, cfgs in by.items():
        base = cfgs["dw_plain"]
        ext = next(n for n in cfgs if n.endswith("_plain") and n != "dw_plain")
        print(f"### {cat} ({len(base)} prompts)\n")
        print(f"| configuration | tokens/s | ms/token | vs draftwise plain (95% CI) | vs {ext} (95% CI) | "
              "acceptance rate | AL | outputs = draftwise plain |")
        print("|---|---|---|---|---|---|---|---|")
        for name, cfg in cfgs.items():
            ms = ms_per_token(list(cfg.values()))
            sp, lo, hi = speedup_ci(base, cfg)
            hf, hlo, hhi = speedup_ci(cfgs[ext], cfg)
            st = aggregate([SpecStats(**{k: v for k, v in r["stats"].items() if k in SpecStats.__slots__})
                            for r in cfg.values()]) if "stats" in next(iter(cfg.values())) else None
            checked = [p for p in cfg if (p, name) in divs or name == "dw_plain"]
            same = sum(1 for p in checked if divs.get((p, name)) is None)
            fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
            print(f"| {name} | {1000 / ms:.2f} | {ms:.0f} | {sp:.2f}× [{lo:.2f}, {hi:.2f}] | {hf:.2f}× [{hlo:.2f}, {hhi:.2f}] | "
                  f"{fmt(st and st.acceptance_rate, '{:.3f}')} | {fmt(st and st.acceptance_length, '{:.2f}')} | "
                  f"{same}/{len(checked)}" + ("" if len(checked) == len(cfg) else f" ({len(cfg) - len(checked)} unchecked)") + " |")
        print()
        for name, cfg in cfgs.items():
            if "stats" not in next(iter(cfg.values())) or name == "dw_plain":
                continue
            st = aggregate([SpecStats(**{k: v for k, v in r["stats"].items() if k in SpecStats.__slots__})
                            for r in cfg.values()])
            print(f"`{name}` stats: proposed {st.proposed_tokens}, accepted {st.accepted_draft_tokens}, "
                  f"emitted {st.emitted_tokens}, rounds {st.verification_rounds}, plain steps {st.plain_steps}, "
                  f"discarded {st.discarded_tokens}; time: prefill {st.prefill_s:.1f} s, draft {st.draft_s:.1f} s, "
                  f"verify {st.verify_s:.1f} s, other {st.other_s:.2f} s; per-position acceptance "
                  + ", ".join(f"{a:.2f}" for a in st.per_position_acceptance) + "\n")
    bad = [(k, v) for k, v in divs.items() if v is not None]
    print("### Output divergences from draftwise plain decoding\n")
    if not bad:
        print("None: every output is token-for-token identical to draftwise plain decoding.\n")
    for (pid, name), d in bad:
        print(f"- {pid} `{name}`: position {d['position']}, plain token {d['plain_token']}, other {d['spec_token']}; "
              f"target top-2 logit margin {d['margin_single']:.4f} (single-token) / {d['margin_batched']:.4f} (batched)")


if __name__ == "__main__":
    main(sys.argv[1])
