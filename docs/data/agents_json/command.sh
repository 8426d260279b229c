# run 1 (rows_run1.jsonl; its first request, person-1, ran before the warm-up was added: excluded in docs/agents.md)
# run 2 (rows_run2_partial.jsonl; with the warm-up; stopped at event-2 / suffix by a grammar error, see docs/agents.md)
flock /work/runs/cpu.lock .venv/bin/python benchmarks/agents.py json --out docs/data/agents_json --drafters ngram suffix --max-tokens 160
# grammar_engines.txt (xgrammar is not a dependency; without it its column is skipped):
# pip install xgrammar==0.2.9 && .venv/bin/python benchmarks/agents.py engines --repeats 3 > docs/data/agents_json/grammar_engines.txt
