#!/bin/bash
# the onnx backend's measurements, in one hold of the CPU lock
cd "$(dirname "$0")/../../.."
D=docs/data/ort_backend
echo "== $(date +%T) tests"; .venv/bin/pytest -q tests/test_ort_backend.py 2>&1 | tail -3
echo "== $(date +%T) curves"; .venv/bin/python benchmarks/ort_backend.py curves --repeats 5 --out $D 2>&1 | grep -v "^llama\|^load" | tail -12
echo "== $(date +%T) agree"; .venv/bin/python benchmarks/ort_backend.py agree --max-tokens 96 --out $D 2>&1 | tail -12
echo "== $(date +%T) humaneval"; .venv/bin/python benchmarks/ort_backend.py humaneval --n 0 --max-tokens 384 --out $D 2>&1 | tail -1
echo "== $(date +%T) profile"; .venv/bin/draftwise profile --backend onnx --threads 2 --batch-sizes 1 --max-k 16 --repeats 5 --out $D/profile_qwen2.5-coder-1.5b_onnx.json 2>&1 | tail -22
echo "== $(date +%T) interleaved bench"
.venv/bin/draftwise bench --threads 2 --kernels repacked --configs plain ngram:auto plain@onnx ngram:auto@onnx \
    --workload benchmarks/workloads/heldout_2026_12_07.jsonl --n 6 --max-tokens 128 --no-progress --out $D/interleaved 2>&1 | tail -12
echo "== $(date +%T) wide bench"
.venv/bin/draftwise bench --threads 2 --kernels repacked --configs plain ngram:auto plain@onnx ngram:auto@onnx \
    --workload editeval,humaneval,writing,roleplay,humanities,summarization,qa --n 3 --max-tokens 128 --no-progress \
    --out results/ort_wide 2>&1 | tail -12
gzip -9c results/ort_wide/requests.jsonl > $D/wide/requests.jsonl.gz && cp results/ort_wide/summary.csv $D/wide/
echo "== $(date +%T) done"
