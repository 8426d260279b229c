#!/usr/bin/env bash
# Forward-cost curves of both Qwen models on both backends (docs/results.md, "Cost curves").
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results
for m in qwen2.5-coder-1.5b qwen2.5-coder-0.5b; do
    .venv/bin/draftwise profile --model "$m" --backend llama.cpp --threads 2 --context-len 256 \
        --repeats 3 --out "results/profile_${m}_llama.json"
    .venv/bin/draftwise profile --model "$m" --backend torch --threads 2 --context-len 256 \
        --repeats 2 --out "results/profile_${m}_torch.json"
done
