#!/bin/bash
# usage: ablate.sh OUTDIR ; runs old-planner replays with each ablation
cd /work/base
PY=/work/main/.venv/bin/python
out=$1; mkdir -p $out
LL=docs/data/profile_qwen2.5-coder-1.5b_llama_repacked_k33_epyc.json
for abl in none probe deeper looks whole catchup stop shadow tshadow relax treefit workload; do
  ABL=$abl PYTHONPATH=/work/base $PY benchmarks/replay_planner.py docs/data/traces_prose16.jsonl docs/data/profile_qwen2.5-coder-1.5b_torch_hybrid_method2_xeon.json docs/data/profile_qwen2.5-coder-0.5b_torch_method2_xeon.json > $out/model_torch_$abl.txt 2>&1
  ABL=$abl PYTHONPATH=/work/base $PY benchmarks/replay_planner.py docs/data/traces_prose16.jsonl docs/data/profile_qwen2.5-coder-1.5b_llama_method2_xeon.json docs/data/profile_qwen2.5-coder-0.5b_llama_method2_xeon.json > $out/model_llama_$abl.txt 2>&1
  for d in ngram suffix; do
    ABL=$abl PYTHONPATH=/work/base $PY benchmarks/replay_planner.py docs/data/strings_llama10 $LL --drafter $d > $out/${d}_strings_$abl.txt 2>&1
  done
  ABL=$abl PYTHONPATH=/work/base $PY benchmarks/replay_planner.py docs/data/suffix_tree_editeval_llama_cached $LL --drafter suffix-tree > $out/tree_cached_$abl.txt 2>&1
done
echo finished > $out/DONE
