# docs/agents.md, "Against llama-server": llama-server (grammar from response_format / tools, no speculation;
# --jinja for its tool-call parsing) beside draftwise serve without (draftwise-plain) and with n-gram D auto
# (draftwise-auto), chat requests, JSON-extraction and tool-call rows in one interleaved run (~15 min)
bash scripts/setup_peers.sh   # llama-server, once
flock /work/runs/cpu.lock .venv/bin/python benchmarks/server_bench.py --engine llama-server --model qwen2.5-coder-1.5b \
    --configs plain draftwise-plain draftwise-auto --api chat --concurrency 1 --max-tokens 160 --n 8 \
    --workload benchmarks/workloads/json_extraction_2026_12_07.jsonl,benchmarks/workloads/tool_calls_2026_12_07.jsonl \
    --serve-args "--cache-ram 0 --jinja" --prompt-cache off --out docs/data/agents_peers
# (--prompt-cache off: draftwise's servers without their prompt cache, as recorded; the default beside
# a peer keeps it, as llama-server keeps its slot's KV)
# docs/data's size limit: requests.jsonl is the run's rows without per-chunk times and logprobs;
# table.md: benchmarks/agents.py peers docs/data/agents_peers
