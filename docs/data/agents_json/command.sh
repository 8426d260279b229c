# docs/agents.md, "Measured (structured outputs)": rows.jsonl (`--table docs/data/agents_json/rows.jsonl` prints its table)
flock /work/runs/cpu.lock .venv/bin/python benchmarks/agents.py json --out docs/data/agents_json --drafters ngram suffix model \
    --max-tokens 160 --backends llama.cpp onnx
# forced runs joined with drafts, replayed on the plain answers (llama.cpp's curve, then onnx's):
.venv/bin/python benchmarks/agents.py forced docs/data/agents_json/rows.jsonl
.venv/bin/python benchmarks/agents.py forced docs/data/agents_json/rows.jsonl --curve 1:35,2:37,4:46,8:71,16:120
# grammar_engines.txt (xgrammar is not a dependency; without it its column is skipped):
# pip install xgrammar==0.2.9 && .venv/bin/python benchmarks/agents.py engines --repeats 3 > docs/data/agents_json/grammar_engines.txt
# the draft model at a fixed D = 4 under the grammar (model_d4_rows.jsonl), beside constrained plain:
flock /work/runs/cpu.lock .venv/bin/python benchmarks/agents.py json --out /tmp/json_model --drafters model:4 --max-tokens 160
cp /tmp/json_model/rows.jsonl docs/data/agents_json/model_d4_rows.jsonl
