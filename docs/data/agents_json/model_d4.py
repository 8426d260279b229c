# The JSON rows with the 0.5B draft model at a fixed D = 4 (each token from its masked q'), beside constrained plain
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")  # run from the repository root
import agents
from draftwise.build import EngineSpec, build_engine, load_target
from draftwise.engine import Engine
from draftwise.grammar import Grammars
rows = [json.loads(x) for x in agents.WORKLOAD.read_text().splitlines() if x.strip()]
target = load_target(EngineSpec(drafter="none", backend="llama.cpp", kernels="repacked", max_running=1))
runner, tok = target
engines = {"plain": Engine(runner, tok, max_running=1),
           "model:4": build_engine(EngineSpec(drafter="model", num_draft_tokens=4, backend="llama.cpp",
                                              kernels="repacked", max_running=1), target=target)[0]}
out = agents.measure(engines, tok, Grammars(tok, runner.vocab_size), rows, 160, Path(sys.argv[1]))
print(agents.table(out))
