"""`draftwise bench --endpoint` against two `draftwise serve` processes on loopback, speculation off
and on (n-gram drafter), at concurrency 1, 2, 4, 8 (docs/results.md §6). The bench interleaves the
two servers' request groups, so only one computes at a time; at temperature 0 it asks both for
logprobs and compares their outputs token by token.

    .venv/bin/python benchmarks/server_bench.py --out results/server_bench
    .venv/bin/python benchmarks/server_bench.py --dry-run     # print the three commands
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
import urllib.request

CLI = [sys.executable, "-m", "draftwise.cli"]


def commands(a: argparse.Namespace) -> tuple[dict[str, list[str]], list[str]]:
    """The two servers' command lines by configuration name, and the bench's."""
    common = ["serve", "--target", a.model, "--backend", "llama.cpp", "--threads", str(a.threads),
              "--max-running", "16", "--max-context", "1024", "--host", "127.0.0.1"]
    servers = {"plain": CLI + common + ["--drafter", "none", "--port", str(a.port)],
               "ngram": CLI + common + ["--drafter", "ngram", "--num-draft-tokens", str(a.d), "--port", str(a.port + 1)]}
    bench = CLI + ["bench", "--endpoint", f"plain=http://127.0.0.1:{a.port}/v1",
                   "--endpoint", f"ngram=http://127.0.0.1:{a.port + 1}/v1", "--baseline", "plain",
                   "--target", a.model, "--workload", a.workload, "--n", str(a.n), "--max-tokens", str(a.max_tokens),
                   "--concurrency", *map(str, a.concurrency), "--warmup", "2", "--no-progress", "--out", a.out]
    return servers, bench


def wait_healthy(port: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"server on port {port} did not become healthy in {timeout_s:.0f} s")
            time.sleep(0.5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/server_bench")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--d", type=int, default=4, help="the n-gram server's draft length")
    ap.add_argument("--workload", default="editeval")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=8301, help="the plain server's; the n-gram server's is the next")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    servers, bench = commands(a)
    if a.dry_run:
        for cmd in (*servers.values(), bench):
            print(shlex.join(cmd))
        return 0
    procs = [subprocess.Popen(cmd) for cmd in servers.values()]
    try:
        for port in (a.port, a.port + 1):
            wait_healthy(port)
        return subprocess.run(bench).returncode
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
