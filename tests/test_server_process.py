"""`draftwise serve` as a process: the port answers while the model loads (/health: loading, 503),
SIGTERM drains (a stream still running at --drain-timeout ends with an error event) and the
process exits; a warning without a key on a non-loopback address; exit status 1 when loading fails."""
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("llama_cpp")
DRAFTWISE = [sys.executable, "-m", "draftwise.cli"]  # the interpreter running the tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_loads_in_the_background_and_drains_on_sigterm():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([*DRAFTWISE, "serve", "--target", "smollm2-135m", "--backend", "llama.cpp",
                             "--drafter", "none", "--max-context", "512", "--threads", "2", "--host", "0.0.0.0",
                             "--port", str(port), "--drain-timeout", "0.5"], stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                r = httpx.get(url + "/health", timeout=5)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            seen.append(r.json()["status"])
            if r.status_code == 200:
                break
            time.sleep(0.05)
        assert seen[0] == "loading" and seen[-1] == "ok", seen
        lines, first = [], threading.Event()

        def read():
            body = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                    "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        first.set()
        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        reader.join(30)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once shut down
    finally:
        proc.kill()
    assert lines[-1] == "[DONE]"
    last = json.loads(lines[-2])
    assert last["error"]["code"] == "503" and "shutting down" in last["error"]["message"]
    assert len(lines) > 3  # it was streaming when the drain ran out
    stderr = proc.stderr.read()
    assert "WARNING: 0.0.0.0 is not a loopback address and no API key is set" in stderr


def test_serve_exits_1_when_the_model_cannot_load(tmp_path):
    run = subprocess.run([*DRAFTWISE, "serve", "--target", "/nonexistent/model.gguf", "--num-draft-tokens", "4",
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2  # refused before the server starts, in one line
    assert "GGUF file /nonexistent/model.gguf does not exist" in run.stderr and "Traceback" not in run.stderr
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file")
    run = subprocess.run([*DRAFTWISE, "serve", "--target", str(bad), "--num-draft-tokens", "4",
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "failed to load" in run.stderr
