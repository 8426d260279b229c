# docs/agents.md's measurement: plain, n-gram (D auto, the server's default) without and with the
# prediction, side by side in one run (configurations interleaved per request group)
.venv/bin/draftwise bench --workload benchmarks/workloads/code_rewrites_2026_12_07.jsonl --n 0 \
    --configs plain ngram:auto ngram:auto+prediction --kernels repacked --threads 2 \
    --max-tokens 320 --out docs/data/agents_prediction
# requests.jsonl: the run's rows without per-chunk times and decision logs (docs/data's size limit);
# summary.csv was made from the whole rows (bench's summary needs the per-chunk times)
# per prompt, after the first token, each configuration against plain (docs/agents.md's per-prompt ranges):
python3 -c "import json; R=[r for r in map(json.loads, open('docs/data/agents_prediction/requests.jsonl')) if r.get('kind')=='request']
by={}; [by.setdefault(r['prompt_id'], {}).__setitem__(r['config'], r['e2e_s'] - r['ttft_s']) for r in R]
[print(p, *(f'{c} {t[\"plain\"] / t[c]:.2f}' for c in t if c != 'plain')) for p, t in by.items()]"
