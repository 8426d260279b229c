"""Bounded load test of `draftwise serve` on loopback: N requests at concurrency C, T tokens each.

Starts the server as a subprocess, warms it up (so every sequence slot and buffer has been used),
reads its resident memory, runs the load, reads it again. Passes when no request failed and the
resident memory after the run is within 5% of after warm-up. Half the requests stream.

    .venv/bin/python scripts/loadtest_server.py [--requests 500] [--concurrency 16] [--max-tokens 32]

With the suffix drafter it also reports the size of its shared trie (`draftwise:drafter_shared_nodes`)
at its peak during the run and after it, against the cap (`--suffix-max-nodes`), and always the
prompt cache's size and its looked-up and reused prompt tokens (serve's default cache unless
--serve-args sets --prompt-cache-mb).
"""
from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["a binary search in Python", "why the sky is blue", "a haiku about rain", "the rules of chess",
          "how a hash map works", "a recipe for bread", "the water cycle", "a SQL join", "photosynthesis",
          "a limerick about a cat", "what TCP does", "quicksort in C", "the French revolution",
          "how vaccines work", "a regular expression for dates", "what a monad is"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(port: int, i: int, max_tokens: int, model: str) -> tuple[bool, str]:
    stream = i % 2 == 1
    body = {"model": model, "messages": [{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "temperature": 0 if i % 3 else 0.8, "seed": i, "stream": stream}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        if resp.status != 200:
            return False, f"HTTP {resp.status}: {data[:200]}"
        if stream:
            ok = data.rstrip().endswith("data: [DONE]") and '"finish_reason": "' in data and '"error"' not in data
            return ok, "" if ok else f"bad stream: {data[-200:]}"
        ok = json.loads(data)["choices"][0]["finish_reason"] in ("stop", "length")
        return ok, "" if ok else data[:200]
    except Exception as e:  # noqa: BLE001 - a failure to count, not to crash on
        return False, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def run_load(port: int, n: int, conc: int, max_tokens: int, model: str, start: int = 0) -> dict:
    t = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda i: one(port, i, max_tokens, model), range(start, start + n)))
    wall = time.perf_counter() - t
    errors = [e for ok, e in res if not ok]
    return {"requests": n, "failed": len(errors), "errors": errors[:5], "wall_s": round(wall, 2),
            "requests_per_s": round(n / wall, 2)}


def metric(port: int, name: str) -> float | None:
    """A gauge's value from the server's /metrics (None if absent)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", c.getresponse().read().decode(), re.M)
    return None if m is None else float(m.group(1))


class Sampler(threading.Thread):
    """The largest value of a gauge while the load runs, read every `every` seconds."""

    def __init__(self, port: int, name: str, every: float = 2.0):
        super().__init__(daemon=True)
        self.port, self.name, self.every, self.peak = port, name, every, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            v = metric(self.port, self.name)
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--serve-args", default="--backend llama.cpp --drafter ngram --max-running 16 --max-context 1024",
                    help="extra draftwise serve options")
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    a = ap.parse_args()

    port = free_port()
    cmd = [str(ROOT / ".venv/bin/draftwise"), "serve", "--target", a.target, "--port", str(port),
           "--model-name", a.target, *a.serve_args.split()]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 1800  # /health is 503 while the model and cost curves load
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not become healthy in 30 minutes")
            time.sleep(0.2)
        ps = psutil.Process(proc.pid)
        warm = run_load(port, a.warmup, a.concurrency, a.max_tokens, a.target)
        rss_warm = ps.memory_info().rss
        nodes = Sampler(port, "draftwise:drafter_shared_nodes")
        nodes.start()
        load = run_load(port, a.requests, a.concurrency, a.max_tokens, a.target, start=a.warmup)
        nodes.done.set()
        rss_after = ps.memory_info().rss
        shared = {"peak": nodes.peak, "after_run": metric(port, "draftwise:drafter_shared_nodes")}
        cache = {k: metric(port, m) for k, m in (("bytes", "draftwise:prompt_cache_bytes"),
                                                  ("entries", "draftwise:prompt_cache_entries"),
                                                  ("queried_tokens", "vllm:prefix_cache_queries_total"),
                                                  ("hit_tokens", "vllm:prefix_cache_hits_total"))}
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/health")
        health = json.loads(c.getresponse().read())
    finally:
        proc.terminate()
        proc.wait(30)
    growth = (rss_after - rss_warm) / rss_warm
    out = {"command": " ".join(cmd[1:]), "warmup": warm, "load": load, "concurrency": a.concurrency,
           "max_tokens": a.max_tokens, "rss_after_warmup_mb": round(rss_warm / 2**20, 1),
           "rss_after_run_mb": round(rss_after / 2**20, 1), "rss_growth": round(growth, 4),
           "idle_after_run": health, "drafter_shared_nodes": shared, "prompt_cache": cache, "pass": load["failed"] == 0 and abs(growth) <= 0.05}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
