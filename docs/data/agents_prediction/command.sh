# docs/agents.md's measurement: plain, n-gram (D auto, the server's default) without and with the
# prediction, side by side in one run (configurations interleaved per request group)
.venv/bin/draftwise bench --workload benchmarks/workloads/code_rewrites_2026_12_07.jsonl --n 0 \
    --configs plain ngram:auto ngram:auto+prediction --kernels repacked --threads 2 \
    --max-tokens 320 --out docs/data/agents_prediction
# requests.jsonl: the run's rows without per-chunk times and decision logs (docs/data's size limit);
# summary.csv was made from the whole rows (bench's summary needs the per-chunk times)
