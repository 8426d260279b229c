"""`draftwise bench --endpoint` against one server process per configuration on loopback, at
concurrency 1, 2, 4, 8, 16 (docs/server.md, Measuring it): `draftwise serve` (default: speculation off,
n-gram `auto`, n-gram D = 4), or with `--engine llama-server` llama.cpp's own server
(scripts/setup_peers.sh builds it; configurations plain, its n-gram types, `draft`: the 0.5B
draft model; docs/peers.md), or vLLM; with a peer, `draftwise-auto` adds `draftwise serve` at
`auto` on the same prompts (`draftwise-auto@onnx`: on the onnx backend); with `--engine openvino`
OpenVINO GenAI (scripts/genai_server.py; plain, `lookup`: its prompt lookup, `draft`: its draft-model
speculation), with `--engine onnx-genai` ONNX Runtime GenAI (plain, `ngram`: its n-gram decoding). `--prompt-cache` (draftwise's servers; a peer's own flags go in
`--serve-args`): by default off for draftwise alone (`--prompt-cache-mb 0`), so that every repeat of
a prompt measures its prefill, and on beside a peer, which reuses cached prompts as deployed
(llama-server a slot's KV for a shared prefix whatever its flags), for a like TTFT. The bench interleaves the servers' request groups, so only one
computes at a time; at temperature 0 it asks every server for logprobs and compares outputs token
by token.

    .venv/bin/python benchmarks/server_bench.py --out results/server_bench
    .venv/bin/python benchmarks/server_bench.py --model qwen2.5-coder-1.5b --out results/server_bench_qwen
    .venv/bin/python benchmarks/server_bench.py --engine llama-server --configs plain ngram-mod draft draftwise-auto
    .venv/bin/python benchmarks/server_bench.py --engine vllm --model qwen2.5-coder-1.5b --configs plain ngram
    .venv/bin/python benchmarks/server_bench.py --engine openvino --model qwen2.5-coder-1.5b \
        --configs draftwise-plain plain lookup draft draftwise-auto@onnx --concurrency 1
    .venv/bin/python benchmarks/server_bench.py --dry-run     # print the commands
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from draftwise.peers import (LLAMA_NGRAM, genai_command, llama_server_command, llama_spec, ort_spec, ov_spec,
                             vllm_command, vllm_spec, wait_healthy)

CLI = [sys.executable, "-m", "draftwise.cli"]


def server_flags(config: str, drafter: str) -> list[str]:
    """`plain` -> speculation off; `auto` or an integer D -> the drafter (--drafter) at that D."""
    if config == "plain":
        return ["--drafter", "none"]
    if config != "auto" and not config.isdigit():
        raise SystemExit(f"configuration {config!r}: expected plain, auto or an integer D")
    return ["--drafter", drafter, "--num-draft-tokens", config]


def llama_server_flags(config: str, draft_model: str) -> list[str]:
    """`plain`; one of llama.cpp's n-gram types (LLAMA_NGRAM) or `draft` (the draft model), at its
    defaults, or with a draft length: `ngram-simple16`, `draft4` (peers.llama_spec)."""
    import re
    if config == "plain":
        return []
    m = re.fullmatch(r"([a-z0-9-]*?[a-z-])(\d*)", config)
    if m is None or m.group(1) not in (*LLAMA_NGRAM, "draft"):
        raise SystemExit(f"configuration {config!r}: expected plain, draft[K] or one of {', '.join(LLAMA_NGRAM)} (with [K])")
    try:
        return llama_spec(m.group(1), int(m.group(2)) if m.group(2) else None, draft_model)
    except ValueError as e:
        raise SystemExit(f"configuration {config!r}: {e}")


def peer_config(config: str, methods: tuple[str, ...], expected: str) -> tuple[str, int | None] | None:
    """None for `plain`; (method, K or None) for `METHOD[K]`, METHOD one of `methods`."""
    import re
    if config == "plain":
        return None
    m = re.fullmatch(rf"({'|'.join(methods)})(\d*)", config)
    if m is None:
        raise SystemExit(f"configuration {config!r}: expected {expected}")
    return m.group(1), int(m.group(2)) if m.group(2) else None


def vllm_flags(config: str, draft_model: str) -> dict | None:
    """`plain` -> None; `ngram` or `ngramK` (vLLM's prompt lookup, n = 2..4, K tokens, default 4),
    `draft[K]` (the draft model's Hugging Face export), `eagle3[K]` (the packaged draft head as
    EAGLE-3) -> its --speculative-config."""
    got = peer_config(config, ("ngram", "draft", "eagle3"), "plain, ngram[K], draft[K] or eagle3[K]")
    return None if got is None else vllm_spec(got[0], got[1] or 4, draft_model)


def ov_flags(config: str, draft_model: str) -> list[str]:
    """`plain`; `lookup[K]` (OpenVINO GenAI's prompt lookup) or `draft[K]` (its draft-model
    speculation), K tokens a step (default peers.OV_K)."""
    got = peer_config(config, ("lookup", "draft"), "plain, lookup[K] or draft[K]")
    return [] if got is None else ov_spec(*got, draft_model)


def ort_flags(config: str) -> list[str]:
    """`plain`; `ngram` (ONNX Runtime GenAI's n-gram decoding as its docs set it, peers.ORT_NGRAM)
    or `ngramK` (a fixed width of K)."""
    got = peer_config(config, ("ngram",), "plain or ngram[K]")
    return [] if got is None else ort_spec(got[1])


def draftwise_command(a: argparse.Namespace, config: str, port: int, extra: list[str]) -> list[str]:
    """`draftwise serve` at a configuration (server_flags); `CONFIG@onnx` on the onnx backend (one
    request at a time: it runs a batch's sequences one after another)."""
    config, _, backend = config.partition("@")
    if backend not in ("", "onnx"):
        raise SystemExit(f"configuration {config}@{backend}: the backend after @ may be onnx only")
    return CLI + ["serve", "--target", a.model, "--backend", backend or "llama.cpp", "--threads", str(a.threads),
                  "--max-running", "1" if backend else "16", "--max-context", str(a.max_context), "--host", "127.0.0.1",
                  *([] if a.prompt_cache == "on" else ["--prompt-cache-mb", "0"]), *server_flags(config, a.drafter),
                  *extra, "--port", str(port)]


def commands(a: argparse.Namespace) -> tuple[dict[str, list[str]], list[str]]:
    """Each server's command line by configuration name, and the bench's. With a peer engine, a
    configuration `draftwise-auto` (or -plain, -D) is `draftwise serve` on the same model in the
    same run (--serve-args are the peer's)."""
    names, servers = {}, {}
    for i, c in enumerate(a.configs):
        port = a.port + i
        if a.engine != "draftwise" and c.startswith("draftwise-"):
            names[c] = c
            servers[c] = draftwise_command(a, c.removeprefix("draftwise-"), port, [])
        elif a.engine == "llama-server":
            names[c] = c
            servers[c] = llama_server_command(a.model, port, a.max_context, max(a.concurrency),
                                              llama_server_flags(c, a.draft_model) + a.serve_args.split(), a.threads)
        elif a.engine in ("openvino", "onnx-genai"):
            runtime = "openvino" if a.engine == "openvino" else "onnx"
            names[c] = f"{'ov' if runtime == 'openvino' else 'ort'}-{c}"
            flags = ov_flags(c, a.draft_model) if runtime == "openvino" else ort_flags(c)
            servers[names[c]] = genai_command(runtime, a.model, port, flags + a.serve_args.split())
        elif a.engine == "vllm":
            names[c] = c
            cmd = vllm_command(a.model, port, a.max_context, max(a.concurrency), vllm_flags(c, a.draft_model))
            servers[c] = cmd[:-2] + a.serve_args.split() + cmd[-2:]
        else:
            names[c] = c if c in ("plain", "auto") else f"D{c}"
            servers[names[c]] = draftwise_command(a, c, port, a.serve_args.split())
    endpoints = [x for i, c in enumerate(a.configs) for x in ("--endpoint", f"{names[c]}=http://127.0.0.1:{a.port + i}/v1")]
    bench = CLI + ["bench", *endpoints, "--baseline", names[a.configs[0]],
                   "--target", a.model, "--workload", a.workload, "--n", str(a.n), "--max-tokens", str(a.max_tokens),
                   "--concurrency", *map(str, a.concurrency), "--repeats", str(a.repeats),
                   "--warmup", "2", "--no-progress", "--endpoint-api", a.api, "--out", a.out] \
        + (["--goal", a.goal] if a.goal else [])
    return servers, bench


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/server_bench")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--engine", choices=["draftwise", "llama-server", "vllm", "openvino", "onnx-genai"], default="draftwise")
    ap.add_argument("--configs", nargs="+", default=None,
                    help="one server each, the first the baseline: plain, auto or an integer D (draftwise; "
                         "default plain auto 4); plain, draft or an n-gram type (llama-server; default "
                         "plain ngram-simple ngram-mod draft); plain, ngram[K], draft[K] (vllm; default plain ngram); "
                         "plain, lookup[K], draft[K] (openvino; default plain lookup draft); plain, ngram[K] "
                         "(onnx-genai; default plain ngram); with a peer, "
                         "draftwise-CONFIG[@onnx] too")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b", help="llama-server's and vLLM's `draft` configuration")
    ap.add_argument("--serve-args", default="", help="more draftwise serve options, for every server")
    ap.add_argument("--workload", default="editeval,writing")
    ap.add_argument("--n", type=int, default=8, help="prompts per category")
    ap.add_argument("--api", choices=["tokens", "chat"], default="tokens",
                    help="the bench's --endpoint-api: chat sends rows' messages and response_format as chat requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--port", type=int, default=8301, help="the first server's; the others take the next ones")
    ap.add_argument("--health-timeout", type=float, default=3600.0,
                    help="seconds to wait for each server's /health (auto measures the batch cost curves once: "
                         "~20 min for the 1.5B)")
    ap.add_argument("--goal", default=None, help="the bench's service goal (docs/bench.md), e.g. \"speedup>=1.0\"")
    ap.add_argument("--prompt-cache", choices=["auto", "on", "off"], default="auto",
                    help="draftwise's servers' prompt cache: auto (default) = on beside a peer engine, off alone")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    a = ap.parse_args(argv)
    if a.prompt_cache == "auto":
        a.prompt_cache = "off" if a.engine == "draftwise" else "on"
    if a.configs is None:
        a.configs = {"draftwise": ["plain", "auto", "4"], "vllm": ["plain", "ngram"],
                     "openvino": ["plain", "lookup", "draft"], "onnx-genai": ["plain", "ngram"]}.get(
            a.engine, ["plain", "ngram-simple", "ngram-mod", "draft"])
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    servers, bench = commands(a)
    if a.dry_run:
        for cmd in (*servers.values(), bench):
            print(shlex.join(cmd))
        return 0
    procs = []
    try:
        for i, cmd in enumerate(servers.values()):  # one at a time: cost curves measured on a quiet machine
            procs.append(subprocess.Popen(cmd))
            wait_healthy(a.port + i, a.health_timeout, procs[-1])
        return subprocess.run(bench).returncode
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
