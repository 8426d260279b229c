# docs/agents.md, "On onnx": the code-rewrite prompts with and without their predictions on both
# backends, one run, configurations interleaved (~20 min at 2 cores; the onnx model converted on
# first use). The top-2 margins were not computed (--no-margins): onnx's outputs differ from
# llama.cpp's by the conversion, not by speculation. requests.jsonl.gz: Results.load reads it.
.venv/bin/draftwise bench --workload benchmarks/workloads/code_rewrites_2026_12_07.jsonl --n 0 \
    --configs plain ngram:auto+prediction plain@onnx ngram:auto@onnx ngram:auto+prediction@onnx \
    --kernels repacked --threads 2 --max-tokens 320 --no-margins --out results/agents_prediction_onnx
gzip -9c results/agents_prediction_onnx/requests.jsonl > docs/data/agents_prediction_onnx/requests.jsonl.gz
