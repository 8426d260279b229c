#!/usr/bin/env bash
# draftwise bench --endpoint against draftwise serve, speculation on and off, concurrency 1 2 4 8
# (docs/results.md, "Server"). Two servers on loopback, one per configuration; the bench
# interleaves their groups, so only one computes at a time. Usage: benchmarks/server_endpoint.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/server_bench}"
model=smollm2-135m
common="--target $model --backend llama.cpp --threads 2 --max-running 16 --max-context 1024 ${SERVE_ARGS:-}"
.venv/bin/draftwise serve $common --drafter none --port 8301 & plain=$!
.venv/bin/draftwise serve $common --drafter ngram --num-draft-tokens "${D:-4}" --port 8302 & spec=$!
trap 'kill $plain $spec 2>/dev/null; wait' EXIT
for port in 8301 8302; do
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 0.5; done
done
.venv/bin/draftwise bench --endpoint plain=http://127.0.0.1:8301/v1 --endpoint ngram=http://127.0.0.1:8302/v1 \
    --baseline plain --target $model --workload editeval --n "${N:-16}" --max-tokens "${MAX_TOKENS:-64}" \
    --concurrency 1 2 4 8 --warmup 2 --no-progress --out "$out"
