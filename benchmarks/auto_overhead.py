"""What `auto` costs per step when it never drafts, on llama.cpp (Qwen-1.5B target, 0.5B draft):
the same target runner decoding one writing prompt plainly, with a draft-model `auto` whose
margin (10) never lets it draft, and with that `auto` computing the target's top probability in
numpy instead of torch; three rounds of the three, alternated, 128 tokens each.

    .venv/bin/python benchmarks/auto_overhead.py
"""
import numpy as np

import draftwise.engine as E
from draftwise.build import EngineSpec, build_engine, make_planner
from draftwise.engine import Engine
from draftwise.bench.config import BenchConfig, load_prompts
spec = EngineSpec(drafter="model", backend="llama.cpp", threads=2)
auto_eng, runner, tok = build_engine(spec)
auto_eng.planner = make_planner(runner, auto_eng.drafter, margin=10.0)
plain_eng = Engine(runner, tok)
prompts = load_prompts(BenchConfig(workload="writing,roleplay", n_per_category=10, seed=0))
p = prompts[0].token_ids(tok)
torch_top = E.target_top
def np_top(logits, proposed, accepted):
    n = max(min(accepted + 1, proposed), 1)
    x = logits[:n].float().numpy()
    return (1.0 / np.exp(x - x.max(-1, keepdims=True)).sum(-1)).tolist()
res = {}
for rep in range(3):
    for name in ("plain", "auto_torch_top", "auto_np_top"):
        eng = plain_eng if name == "plain" else auto_eng
        E.target_top = np_top if name == "auto_np_top" else torch_top
        r = eng.generate(p, max_tokens=128)
        s = r.stats
        res.setdefault(name, []).append((1000 * s.verify_s / s.plain_steps, 1000 * s.other_s / s.plain_steps,
                                         s.wall_s, s.verification_rounds))
        print(rep, name, [round(x, 2) for x in res[name][-1]], flush=True)
for k, v in res.items():
    med = [round(float(np.median([x[i] for x in v])), 2) for i in range(3)]
    print(k, "itl ms", med[0], "other ms/step", med[1], "wall", med[2])
