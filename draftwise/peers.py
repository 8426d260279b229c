"""Peer engines started by draftwise (`draftwise plan --engine vllm|llama-server`, benchmarks/server_bench.py,
OpenVINO GenAI and ONNX Runtime GenAI through scripts/genai_server.py):
their command lines, and a server process that is up once its /health answers and is stopped on
exit. Installed by scripts/setup_peers.sh under .peers/ (docs/peers.md)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

VLLM_SERVE = ".peers/bin/vllm-serve"  # vLLM's OpenAI server, threads bound (setup_peers.sh vllm)
VLLM_HF = ".peers/hf"  # the packaged models exported to Hugging Face directories
LLAMA_SERVER = ".peers/bin/llama-server"  # llama.cpp's server from the pinned sdist (setup_peers.sh)
OV_PYTHON = ".peers/openvino/bin/python"  # OpenVINO GenAI's own environment (setup_peers.sh openvino)
GENAI_SERVER = "scripts/genai_server.py"  # either runtime behind an OpenAI-compatible server (theirs are not on PyPI)
OV_MODELS = ".peers/ov"  # the packaged models as OpenVINO int4 directories (optimum-cli export openvino)
OV_K = 5  # tokens a step when none is named: OpenVINO GenAI's samples' num_assistant_tokens
# ONNX Runtime GenAI's n-gram decoding as its docs' n-gram example sets it: 4-grams, chained lookup,
# an adaptive width starting (and floored) at 2; with a width named, that width fixed
ORT_NGRAM = {"ngram": 4, "draft": 8, "adaptive": 2, "chained": True}
LLAMA_NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


VLLM_HEAD = f"{VLLM_HF}/qwen2.5-coder-1.5b-head-eagle3"  # the packaged head (models export-eagle3)


def vllm_spec(method: str, k: int, draft_model: str = "qwen2.5-coder-0.5b") -> dict:
    """vLLM's --speculative-config for n-gram prompt lookup (n = 2..4), the draft model or the
    packaged draft head as EAGLE-3 (`eagle3`), k tokens."""
    if k < 1:
        raise ValueError(f"vLLM drafts at least 1 token a step, got {k}")
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "draft":
        return {"method": "draft_model", "model": f"{VLLM_HF}/{draft_model}", "num_speculative_tokens": k}
    if method == "eagle3":
        return {"method": "eagle3", "model": VLLM_HEAD, "num_speculative_tokens": k}
    raise ValueError(f"vLLM drafter {method!r}: expected ngram, draft or eagle3")


def vllm_command(model: str, port: int, max_context: int, max_seqs: int, spec: dict | str | None = None,
                 prompt_cache: bool = True) -> list[str]:
    """`vllm-serve` for a packaged model's export, serving it under its draftwise name; `spec`: its
    --speculative-config (a JSON text is passed as it is); prompt_cache=False: no prefix caching
    (a server asked the same prompts twice would otherwise serve the second pass from it)."""
    cmd = [VLLM_SERVE, "--model", f"{VLLM_HF}/{model}", "--served-model-name", model, "--dtype", "bfloat16",
           "--max-model-len", str(max_context), "--max-num-seqs", str(max_seqs), "--host", "127.0.0.1"]
    if spec:
        cmd += ["--speculative-config", spec if isinstance(spec, str) else json.dumps(spec)]
    if not prompt_cache:
        cmd += ["--no-enable-prefix-caching"]
    return cmd + ["--port", str(port)]


def gguf(model: str) -> str:
    """A packaged or local model's GGUF file (llama-server loads nothing else)."""
    from draftwise.models.registry import resolve
    src = resolve(model)
    if src.kind != "gguf":
        raise ValueError(f"llama-server needs a GGUF model; {model} is {src.kind}")
    return str(src.path)


def llama_spec(method: str, k: int | None = None, draft_model: str = "qwen2.5-coder-0.5b") -> list[str]:
    """llama-server's flags for one of its n-gram types (LLAMA_NGRAM) or `draft` (the draft model,
    `draft-simple`: without a type llama-server loads the draft model and never drafts), at its
    defaults, or drafting at most k tokens: ngram-simple's m-gram (--spec-ngram-simple-size-m),
    ngram-mod's n-max with n-min 1 (its drafts then stop only where the lookup fails, so a shorter
    limit drafts a prefix of the same tokens), the draft model's n-max."""
    if method in LLAMA_NGRAM:
        flags = ["--spec-type", method]
    elif method == "draft":
        flags = ["--spec-type", "draft-simple", "--spec-draft-model", gguf(draft_model)]
    else:
        raise ValueError(f"llama-server drafter {method!r}: expected draft or one of {', '.join(LLAMA_NGRAM)}")
    if k is None:
        return flags
    if k < 1:
        raise ValueError(f"a draft of at least 1 token, got {k}")
    knob = {"ngram-simple": ["--spec-ngram-simple-size-m", str(k)],
            "ngram-mod": ["--spec-ngram-mod-n-max", str(k), "--spec-ngram-mod-n-min", "1"],
            "draft": ["--spec-draft-n-max", str(k)]}.get(method)
    if knob is None:
        raise ValueError(f"llama-server's {method} has no draft length planned here: use ngram-simple, ngram-mod or draft")
    return flags + knob


def ov_spec(method: str, k: int | None = None, draft_model: str = "qwen2.5-coder-0.5b") -> list[str]:
    """scripts/genai_server.py's flags for OpenVINO GenAI's prompt lookup (`lookup`, n-grams up to 3)
    or its draft-model speculation (`draft`, the draft model's OpenVINO export), k tokens a step."""
    k = OV_K if k is None else k
    if k < 1:
        raise ValueError(f"a draft of at least 1 token, got {k}")
    if method == "lookup":
        return ["--prompt-lookup", str(k)]
    if method == "draft":
        return ["--draft-model", f"{OV_MODELS}/{draft_model}", "--draft", str(k)]
    raise ValueError(f"OpenVINO GenAI drafter {method!r}: expected lookup or draft")


def ort_spec(k: int | None = None) -> list[str]:
    """scripts/genai_server.py's flags for ONNX Runtime GenAI's n-gram decoding: ORT_NGRAM, or a
    fixed width of k tokens."""
    o = dict(ORT_NGRAM) if k is None else {**ORT_NGRAM, "draft": k, "adaptive": 0}
    if o["draft"] < 1:
        raise ValueError(f"a draft of at least 1 token, got {o['draft']}")
    return ["--ngram", str(o["ngram"]), "--draft", str(o["draft"]), "--adaptive", str(o["adaptive"]),
            *(["--chained"] if o["chained"] else [])]


def genai_command(runtime: str, model: str, port: int, flags: list[str] | None = None) -> list[str]:
    """scripts/genai_server.py on a packaged model, served under its draftwise name, one request at
    a time: OpenVINO GenAI on its export in .peers/ov (on every core, its CPU plugin's default), or
    ONNX Runtime GenAI, in draftwise's environment, on the model the onnx backend converted."""
    if runtime == "openvino":
        py, path = OV_PYTHON, f"{OV_MODELS}/{model}"
    elif runtime == "onnx":
        from draftwise.models.ort_convert import converted_dir
        conv = converted_dir(model)
        if conv is None:
            raise FileNotFoundError(f"{model} is not converted for onnx yet: run `draftwise generate --target {model} "
                                    "--backend onnx` once (docs/design.md, CPU backends)")
        py, path = sys.executable, str(conv)
    else:
        raise ValueError(f"runtime {runtime!r}: expected openvino or onnx")
    return [py, GENAI_SERVER, "--runtime", runtime, "--model", path, "--name", model, "--host", "127.0.0.1",
            *(flags or []), "--port", str(port)]


def llama_server_command(model: str, port: int, max_context: int, slots: int, flags: list[str] | None = None,
                         threads: int = 2, prompt_cache: bool = True) -> list[str]:
    """`llama-server` for a GGUF model, `slots` requests at a time of max_context tokens each, with
    Prometheus counters on; prompt_cache=False: without its in-memory cache of whole prompts
    (`--cache-ram 0`; it would serve a prompt asked again)."""
    return [LLAMA_SERVER, "-m", gguf(model), "-t", str(threads), "-np", str(slots), "-c", str(max_context * slots),
            "--metrics", "--no-webui", "--host", "127.0.0.1", *(flags or []),
            *([] if prompt_cache else ["--cache-ram", "0"]), "--port", str(port)]


def check_installed(cmd: list[str]) -> None:
    if not Path(cmd[0]).exists():
        raise FileNotFoundError(f"{cmd[0]} is not installed: run scripts/setup_peers.sh (docs/peers.md)")


def wait_healthy(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Until http://127.0.0.1:port/health answers; fails early if the process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server for port {port} exited with status {proc.returncode} before it was healthy")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {port} did not become healthy in {timeout_s:.0f} s")
            time.sleep(0.5)


class Server:
    """A server process for `with`: started, waited for (/health), terminated on exit."""

    def __init__(self, cmd: list[str], port: int, timeout_s: float = 900.0, log=None):
        self.cmd, self.port, self.timeout_s, self.log = cmd, port, timeout_s, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Server:
        check_installed(self.cmd)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT if self.log else None)
        try:
            wait_healthy(self.port, self.timeout_s, self.proc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
