#!/usr/bin/env bash
# draftwise verify for the Qwen pair (0.5B drafting for the 1.5B) on the torch backend
# (docs/verify.md): greedy identity on EditEval, then the sampling check on the answer-record
# prompt at temperature 0.7 / top-p 0.9 (sized for TV 0.2) and at temperature 1.0 (TV 0.15). ~30 minutes.
# Usage: benchmarks/verify_torch.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/verify_torch}"
mkdir -p "$out"
pair="--target qwen2.5-coder-1.5b --drafter model --draft-model qwen2.5-coder-0.5b --backend torch --draft-backend torch --threads 2"
.venv/bin/draftwise verify $pair --workload editeval --prompts 3 --max-tokens 64 --temperature 0 \
    --json "$out/greedy.json" 2>/dev/null | tee "$out/greedy.txt"
sampling="--num-draft-tokens 1 --workload docs/data/verify_qwen_answer.jsonl --positions 1 --alpha 0.01 --power 0.99"
.venv/bin/draftwise verify $pair $sampling --temperature 0.7 --top-p 0.9 --min-tv 0.2 \
    --json "$out/t07_top_p09.json" 2>/dev/null | tee "$out/t07_top_p09.txt"
.venv/bin/draftwise verify $pair $sampling --temperature 1.0 --min-tv 0.15 \
    --json "$out/t10_tv015.json" 2>/dev/null | tee "$out/t10_tv015.txt"
