#!/bin/bash
# the onnx backend's measurements, in one hold of the CPU lock
cd "$(dirname "$0")/../../.."
D=docs/data/ort_backend
echo "== $(date +%T) tests"; .venv/bin/pytest -q tests/test_ort_backend.py 2>&1 | tail -3
echo "== $(date +%T) curves"; .venv/bin/python benchmarks/ort_backend.py curves --repeats 5 --out $D 2>&1 | grep -v "^llama\|^load" | tail -12
echo "== $(date +%T) agree"; .venv/bin/python benchmarks/ort_backend.py agree --max-tokens 96 --out $D 2>&1 | tail -12
echo "== $(date +%T) profile"; .venv/bin/draftwise profile --backend onnx --threads 2 --batch-sizes 1 --max-k 16 --repeats 5 --out $D/profile_qwen2.5-coder-1.5b_onnx.json 2>&1 | tail -22
for b in onnx llama.cpp; do
  echo "== $(date +%T) bench $b"
  .venv/bin/draftwise bench --backend $b --threads 2 --configs plain ngram:auto --workload editeval,humaneval,writing --n 2 --max-tokens 128 --no-progress --out docs/data/ort_backend/bench_$b 2>&1 | tail -25
done
echo "== $(date +%T) done"
