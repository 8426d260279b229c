"""Run `draftwise bench` with every garbage collection of the process logged (wall start, seconds,
generation), then charge each collection to the request running at the time: is Python's cyclic
garbage collector inside the timed requests, and more in some configurations than others?

    .venv/bin/python benchmarks/gc_bench.py bench --target qwen2.5-coder-1.5b --backend torch \
        --threads 2 --configs plain ngram:auto,4 model:4 --workload writing,humanities --n 2 \
        --max-tokens 64 --out results/gc_check
"""
import gc
import sys
import time
from collections import defaultdict

events, _t = [], {}  # (wall start, seconds, generation) of every collection


def cb(phase, info):
    if phase == "start":
        _t["t"] = time.time()
    else:
        events.append((_t["t"], time.time() - _t["t"], info["generation"]))


gc.callbacks.append(cb)

from draftwise.bench.results import Results  # noqa: E402
from draftwise.cli import main  # noqa: E402

out = sys.argv[sys.argv.index("--out") + 1]
try:
    main(sys.argv[1:])
except SystemExit:
    pass
rows = sorted(Results.load(out).requests.values(), key=lambda r: r["started_unix"])
per = defaultdict(lambda: [0, 0.0, 0, 0.0, 0.0])  # config -> n requests, gc s in requests, gen2 count, gen2 s, e2e s
for r in rows:
    a, b = r["started_unix"], r["started_unix"] + r["e2e_s"]
    ev = [e for e in events if a <= e[0] < b]
    p = per[r["config"]]
    p[0] += 1
    p[1] += sum(e[1] for e in ev)
    p[2] += sum(e[2] == 2 for e in ev)
    p[3] += sum(e[1] for e in ev if e[2] == 2)
    p[4] += r["e2e_s"]
print("config        requests  gc_s   gen2  gen2_s  e2e_s  gc share")
for c, p in per.items():
    print(f"{c:12} {p[0]:8} {p[1]:6.2f} {p[2]:6} {p[3]:6.2f} {p[4]:6.1f} {p[1]/p[4]:7.3%}")
print("objects tracked at the end:", len(gc.get_objects()))
print("slowest collections (s, gen):", sorted(((round(e[1], 3), e[2]) for e in events), reverse=True)[:10])
