"""The HTTP layer over real loopback HTTP on the toy runner: every error in OpenAI's shape (404,
405, 413, invalid / undecodable / over-deep JSON), text that cannot be encoded, the seed and token
ranges, the limits, API keys, readiness while loading, a failed load, and the drain on SIGTERM."""
import json
import threading
import time

import httpx
import pytest

from draftwise.server.auth import ENV, KeyCheck, is_loopback, load_keys
from serving import ChatChars, LiveServer, Runner, toy_build

MODEL = "toy"


@pytest.fixture(scope="module")
def srv():
    s = LiveServer(toy_build(), model_name=MODEL, max_body_bytes=4096, max_prompt_tokens=64, max_stop=2,
                   max_stop_chars=8)
    yield s
    s.close()


def openai_error(r: httpx.Response, status: int, param="-") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"] == str(status)
    if param != "-":
        assert err["param"] == param, err
    return err


def raw(srv, body: bytes, path="/v1/completions") -> httpx.Response:
    return srv.post(path, content=body, headers={"Content-Type": "application/json"})


def test_a_toy_completion(srv):
    r = srv.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "defgh"


@pytest.mark.parametrize("method, path, status", [("GET", "/nope", 404), ("POST", "/v1/nope", 404),
                                                  ("GET", "/v1/completions", 405), ("DELETE", "/health", 405)])
def test_unknown_routes_and_methods(srv, method, path, status):
    err = openai_error(httpx.request(method, srv.url + path), status, None)
    assert path in err["message"]


@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b'{"model": "toy", "prompt": "a",}', "not valid JSON"),
    (b"\xff\xfe{\x00}", "parsing the body"),  # not UTF-8
    (b"[" * 2000 + b"]" * 2000, "parsing the body"),  # within the size limit, deeper than json.loads recurses
])
def test_bodies_that_do_not_parse(srv, body, words):
    err = openai_error(raw(srv, body), 400, None)
    assert words in err["message"]


def test_a_body_that_is_not_a_json_object_is_named(srv):
    assert "got an array" in openai_error(raw(srv, b'["abc"]'), 400, None)["message"]
    assert "got a string" in openai_error(raw(srv, b'"abc"', "/v1/chat/completions"), 400, None)["message"]
    plain = srv.post("/v1/completions", content=b'{"model": "toy", "prompt": "abc"}', headers={"Content-Type": "text/plain"})
    assert "Content-Type: application/json, got text/plain" in openai_error(plain, 400, None)["message"]


def test_a_field_of_the_wrong_type_says_what_it_takes_without_pydantic_names(srv):
    err = openai_error(srv.post("/v1/completions", json={"model": MODEL, "prompt": "ab", "stop": 3}), 400, "stop")
    assert err["message"] == "stop: expected a string or a list, got a number"
    chat = srv.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": 3}]})
    assert openai_error(chat, 400, "messages")["message"] == "messages.0.content: expected a string or a list, got a number"


def test_deep_json_within_the_size_limit(srv):
    openai_error(raw(srv, b'{"model": "toy", "prompt": ' + b"[" * 500 + b"]" * 500 + b"}"), 400, "prompt")


def test_body_size_limit_is_413(srv):
    openai_error(srv.post("/v1/completions", json={"model": MODEL, "prompt": "a" * 5000}), 413)

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000
    openai_error(srv.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}), 413)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", b'{"model": "toy", "prompt": "\\ud800 hi"}', "prompt"),
    ("/v1/completions", b'{"model": "toy", "prompt": ["\\udfff"]}', "prompt"),
    ("/v1/completions", b'{"model": "toy", "prompt": "a", "stop": "\\ud800"}', "stop"),
    ("/v1/chat/completions", b'{"model": "toy", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("/v1/chat/completions", b'{"model": "toy", "messages": [{"role": "user", "content": '
                             b'[{"type": "text", "text": "x\\udc00"}]}]}', "messages"),
])
def test_unencodable_text_is_400(srv, path, body, param):
    err = openai_error(raw(srv, body, path), 400, param)
    assert "UTF-8" in err["message"]


@pytest.mark.parametrize("fields, status, param", [
    ({"seed": 2 ** 64}, 400, "seed"), ({"seed": 2 ** 63}, 400, "seed"), ({"seed": -(2 ** 63) - 1}, 400, "seed"),
    ({"seed": 2 ** 63 - 1}, 200, None), ({"seed": -(2 ** 63)}, 200, None),
    ({"prompt": [2 ** 31]}, 400, "prompt"), ({"prompt": [16]}, 400, None),  # int32; the vocabulary (16)
    ({"stop": ["a", "b", "c"]}, 400, "stop"), ({"stop": "x" * 9}, 400, "stop"),  # --max-stop 2, --max-stop-chars 8
    ({"prompt": "a" * 65}, 400, "prompt"),  # --max-prompt-tokens 64
    ({"max_tokens": 10 ** 30}, 400, None),
])
def test_ranges_and_limits(srv, fields, status, param):
    r = srv.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 4, "temperature": 0.5,
                                          **fields})
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        openai_error(r, status, param)


def test_the_context_check_reserves_no_draft(srv):
    ctx = srv.scheduler.target.max_context
    ok = srv.post("/v1/completions", json={"model": MODEL, "prompt": [0] * 60, "max_tokens": ctx - 60,
                                           "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == ctx - 60
    openai_error(srv.post("/v1/completions", json={"model": MODEL, "prompt": [0] * 60, "max_tokens": ctx - 59}),
                 400)
    chat = srv.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "ab"}],
                                                  "temperature": 0})
    assert chat.json()["usage"]["completion_tokens"] == ctx - 2  # chat's default: up to the context


def test_tokenising_runs_off_the_event_loop():
    class Slow(ChatChars):
        def encode(self, text):
            time.sleep(2.0)
            return super().encode(text)
    s = LiveServer(toy_build(tokenizer=Slow()), model_name=MODEL)
    try:
        body = {"model": MODEL, "prompt": "ab"}
        t = threading.Thread(target=s.post, args=("/v1/completions",), kwargs={"json": body})
        t.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        assert httpx.get(s.url + "/health").status_code == 200
        assert time.perf_counter() - t0 < 1.0  # answered while the prompt was being tokenised
        t.join()
    finally:
        s.close()


def test_api_keys(tmp_path, monkeypatch):
    s = LiveServer(toy_build(), model_name=MODEL, api_keys=("key-one", "key-two"))
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    try:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "key-two"},
                        {"Authorization": "Basic key-two"}):
            r = httpx.post(s.url + "/v1/completions", json=body, headers=headers)
            openai_error(r, 401, None)
            assert r.headers["www-authenticate"] == "Bearer"
        openai_error(httpx.get(s.url + "/v1/nope"), 401)  # before routing
        ok = httpx.post(s.url + "/v1/completions", json=body, headers={"Authorization": "Bearer key-two"})
        assert ok.status_code == 200
        assert httpx.get(s.url + "/v1/models", headers={"Authorization": "bearer key-one"}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200 and httpx.get(s.url + "/metrics").status_code == 200
        schema = httpx.get(s.url + "/openapi.json").json()
        assert schema["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
        assert "unauthorized" in httpx.get(s.url + "/metrics").text
    finally:
        s.close()
    s = LiveServer(toy_build(), model_name=MODEL, api_keys=("k",), protect_metrics=True)
    try:
        openai_error(httpx.get(s.url + "/health"), 401)
        openai_error(httpx.get(s.url + "/metrics"), 401)
        assert httpx.get(s.url + "/health", headers={"Authorization": "Bearer k"}).status_code == 200
    finally:
        s.close()
    keyfile = tmp_path / "keys"
    keyfile.write_text("# the team's keys\nfile-key\n\n")
    monkeypatch.setenv(ENV, "env-key")
    assert load_keys(["flag-key"], [str(keyfile)]) == ("flag-key", "file-key", "env-key")
    with pytest.raises(ValueError, match="whitespace"):
        load_keys([" padded"], env={})
    assert KeyCheck(("a", "b")).ok("Bearer b") and not KeyCheck(("a",)).ok("Bearer ab")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")


def test_readiness_while_loading():
    gate = threading.Event()
    s = LiveServer(toy_build(gate=gate), wait=False, model_name=MODEL)
    try:
        r = httpx.get(s.url + "/health")  # the port is bound at once
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        openai_error(s.post("/v1/completions", json={"model": MODEL, "prompt": "a"}), 503)
        openai_error(httpx.get(s.url + "/v1/models"), 503)
        assert httpx.get(s.url + "/metrics").status_code == 200
        gate.set()
        assert s.life.wait(10)
        assert httpx.get(s.url + "/health").json() == {"status": "ok", "waiting": 0, "running": 0}
    finally:
        s.close()


def test_a_failed_load_is_reported_and_stops_the_server():
    def broken(cfg, observer):
        raise FileNotFoundError("no such model: nope.gguf")
    s = LiveServer(broken, wait=False, model_name=MODEL)
    assert s.life.wait(10)
    s.thread.join(10)
    assert not s.thread.is_alive()  # on_failure stopped uvicorn: `draftwise serve` exits with 1
    assert s.life.health() == (503, {"status": "failed", "error": "FileNotFoundError: no such model: nope.gguf"})


def test_drain_finishes_short_requests_and_cancels_long_ones_with_an_error_event():
    s = LiveServer(toy_build(Runner(period=15, delay=0.01)), model_name=MODEL, drain_timeout=0.5)
    done = {}

    def stream(name, max_tokens):
        body = {"model": MODEL, "prompt": "abc", "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        done[name] = [json.loads(x) for x in lines[:-1]], lines[-1]
    threads = [threading.Thread(target=stream, args=a) for a in (("short", 20), ("long", 480))]
    for t in threads:
        t.start()
    while s.scheduler.counts()[1] < 2:
        time.sleep(0.01)
    s.server.should_exit = True  # uvicorn's SIGTERM handler
    for t in threads:
        t.join(10)
    s.thread.join(10)
    short, end = done["short"]
    assert end == "[DONE]" and short[-1]["choices"][0]["finish_reason"] == "length"
    long, end = done["long"]
    assert end == "[DONE]" and long[-1]["error"]["code"] == "503"
    assert "shutting down" in long[-1]["error"]["message"] and len(long) > 2
    assert s.life.health()[1]["status"] == "draining" and s.scheduler.target.seqs == {}
    assert not s.thread.is_alive()
