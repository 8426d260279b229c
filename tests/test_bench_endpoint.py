"""The server client against a tiny local OpenAI-style server: SSE streaming, TTFT/ITL from chunk
arrival, usage, Prometheus spec-decode counters mapped to draftwise's words, real concurrency."""
import json
from pathlib import Path
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftwise.bench import BenchConfig, run_bench, summarise, write_report
from draftwise.bench.endpoint import EndpointTarget, iter_sse, parse_prometheus, server_stats, spec_counters
from draftwise.prompts import Prompt
from draftwise.stats import SpecStats
from fakes import CharTokenizer

GAP = 0.03  # seconds between streamed chunks
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} 0.0
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


class FakeServer:
    """Streams PIECES for each request; each request adds 3 drafts of 3 tokens, 4 accepted (3 at
    position 0, 1 at position 1) to its counters. `usage` off: no usage chunk; `spec` off: no counters.
    Its usage counts 7 completion tokens (not the 4 pieces, so tests see where a count came from);
    with `logprobs` on, one token per piece, as a server that reports logprobs does."""

    PIECES = ["Hel", "lo", " wor", "ld"]

    def __init__(self, usage=True, spec=True, text=None, logprobs=False):
        self.usage, self.spec, self.text, self.logprobs = usage, spec, text, logprobs
        self.bodies, self.requests, self.in_flight, self.max_in_flight = [], 0, 0, 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        srv = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake-model"}]}))
                elif self.path == "/metrics":
                    n = srv.requests
                    text = METRICS.format(d=3 * n, t=9 * n, a=4 * n, p0=3 * n, p1=n) if srv.spec else "up 1\n"
                    self._send(200, text, "text/plain")
                else:
                    self._send(404, "{}")

            def _chunk(self, obj):
                data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("max_tokens", 0) > 1000:
                    return self._send(400, json.dumps({"error": "max_tokens too large"}))
                with srv.lock:
                    srv.bodies.append((self.path, body))
                    srv.in_flight += 1
                    srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
                chat = self.path.endswith("/chat/completions")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"3\r\n: \n\r\n")  # an SSE comment line
                pieces = srv.text(body) if srv.text else srv.PIECES
                for i, piece in enumerate(pieces):
                    time.sleep(GAP)
                    last = i == len(pieces) - 1
                    choice = {"index": 0, "finish_reason": "length" if last else None}
                    choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                    if srv.logprobs and body.get("logprobs"):  # piece i: top-2 margin 0.5 + i
                        top = {piece: -0.1, "~": -0.6 - i}
                        choice["logprobs"] = {"content": [{"token": piece, "logprob": -0.1, "top_logprobs": [
                            {"token": t, "logprob": v} for t, v in top.items()]}]} if chat else \
                            {"tokens": [piece], "token_logprobs": [-0.1], "top_logprobs": [top]}
                    self._chunk({"id": "x", "choices": [choice]})
                with srv.lock:  # counted before the stream ends, so /metrics read afterwards has it
                    srv.requests += 1
                if srv.usage:
                    self._chunk({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces) if srv.logprobs else 7}})
                self._chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                with srv.lock:
                    srv.in_flight -= 1

        return H


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


KW = {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 3}
PROMPT = Prompt("p0", "c", text="abc")


def test_prometheus_parsing_and_vllm_counters():
    text = METRICS.format(d=6, t=18, a=8, p0=6, p1=2) + METRICS.format(d=4, t=12, a=3, p0=2, p1=1).replace(
        'engine="0"', 'engine="1"')
    samples = parse_prometheus(text)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 0.0) in samples
    c = spec_counters(text)  # summed over engines; the _created timestamps ignored
    assert (c["drafts"], c["draft_tokens"], c["accepted"]) == (10, 30, 11)
    assert c["per_pos"] == {0: 8, 1: 3, 2: 0}
    assert spec_counters("up 1\n") is None
    assert parse_prometheus('x{a="q\\"uote"} 2 1700000000\n') == [("x", {"a": 'q"uote'}, 2.0)]


def test_counter_deltas_in_draftwise_words():
    before = spec_counters(METRICS.format(d=6, t=18, a=8, p0=6, p1=2))
    after = spec_counters(METRICS.format(d=10, t=30, a=15, p0=10, p1=5))
    fields = server_stats(before, after, emitted_tokens=40)
    st = SpecStats(**fields)
    assert st.verification_rounds == 4 and st.proposed_tokens == 12 and st.accepted_draft_tokens == 7
    assert st.acceptance_rate == pytest.approx(7 / 12)
    assert st.acceptance_length == pytest.approx(1 + 7 / 4)  # each round also emits a recovered or bonus token
    assert st.proposed_per_position == [4, 4, 4] and st.per_position_acceptance == [1.0, 0.75, 0.0]
    assert server_stats(None, after, 1) is None


def test_draftwise_servers_own_counters_give_the_engines_per_position_acceptance():
    from draftwise.server.metrics import ServerMetrics

    m, engine = ServerMetrics("m"), SpecStats()
    before = spec_counters(m.render().decode())
    for proposed, accepted, depth in ((1, 1, None), (4, 3, None), (6, 2, 3)):  # two chains, a tree of depth 3
        m.round(proposed, accepted, depth or proposed)
        engine.record_round(proposed, accepted, depth)
    st = SpecStats(**server_stats(before, spec_counters(m.render().decode()), emitted_tokens=9))
    assert st.proposed_per_position == engine.proposed_per_position == [3, 2, 2, 1]  # D varies: not drafts x D
    assert st.accepted_per_position == engine.accepted_per_position == [3, 2, 1, 0]
    assert st.per_position_acceptance == engine.per_position_acceptance


def test_iter_sse_joins_multiline_data_and_stops_at_done():
    lines = [b": comment\n", b"data: {\"a\":\n", b"data: 1}\n", b"\n", b"event: x\n", b"data:2\n", b"\n",
             b"data: [DONE]\n", b"\n", b"data: 3\n", b"\n"]
    assert list(iter_sse(iter(lines))) == ['{"a":\n1}', "2"]


def test_streaming_request_times_chunks_as_they_arrive(server):
    t = EndpointTarget(server.url)
    assert t.model == "fake-model"  # the server's first model
    r = t.run_one(PROMPT, [0, 1, 2], KW)
    assert r["text"] == "Hello world" and r["finish_reason"] == "length"
    assert r["emitted_tokens"] == 7 and r["tokens_from"] == "usage" and r["prompt_tokens"] == 5
    assert r["ttft_s"] >= GAP and len(r["itl_s"]) == 3
    assert all(g >= 0.8 * GAP for g in r["itl_s"]) and r["e2e_s"] >= r["chunk_times_s"][-1]
    path, body = server.bodies[0]
    assert path == "/v1/completions" and body["prompt"] == [0, 1, 2] and body["stream"] is True
    assert body["max_tokens"] == 8 and body["seed"] == 3 and "top_k" not in body
    assert body["stream_options"] == {"include_usage": True}


def test_without_usage_tokens_are_counted_by_chunk():
    s = FakeServer(usage=False)
    try:
        r = EndpointTarget(s.url, model="m").run_one(PROMPT, [0], KW)
        assert r["emitted_tokens"] == 4 and r["tokens_from"] == "chunks"
    finally:
        s.close()


def test_chat_api_opens_the_assistant_turn(server):
    p = Prompt("e", "editeval", messages=({"role": "user", "content": "fix"},), assistant_prefix="```python\n")
    r = EndpointTarget(server.url, api="chat").run_one(p, [1], {**KW, "top_k": 5})
    assert r["text"] == "Hello world"
    path, body = server.bodies[-1]
    assert path == "/v1/chat/completions" and body["top_k"] == 5
    assert body["messages"][-1] == {"role": "assistant", "content": "```python\n"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_http_errors_are_raised(server):
    with pytest.raises(RuntimeError, match="HTTP 400"):
        EndpointTarget(server.url).run_one(PROMPT, [0], {**KW, "max_tokens": 5000})
    with pytest.raises(ValueError):
        EndpointTarget("ftp://x")
    port = server.httpd.server_address[1]
    server.close()
    with pytest.raises(ValueError, match="not reachable"):
        EndpointTarget(f"http://127.0.0.1:{port}")


def test_bench_against_two_servers(tmp_path, server):
    plain = FakeServer(spec=False, text=lambda b: ["Hel", "lo", " wor", "ld"] if b["prompt"] != [1, 2] else ["Help"])
    try:
        wl = tmp_path / "w.jsonl"
        wl.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": t}) + "\n"
                              for i, t in enumerate(["abc", "bc", "cde"])))
        cfg = BenchConfig(target="fake", workload=str(wl), n_per_category=None, max_tokens=8, warmup=0,
                          concurrency=(1, 2), out_dir=str(tmp_path / "out"),
                          endpoints={"plain": plain.url, "spec": server.url})
        path = run_bench(cfg, tokenizer=CharTokenizer(), progress=False)
        assert server.max_in_flight == 2  # concurrency 2 is real against a server
        lines = [json.loads(x) for x in open(path)]
        recs = [x for x in lines if x["kind"] == "request"]
        assert len(recs) == 2 * (3 + 3) and not any(r["sequential"] for r in recs)
        assert [r["config"] for r in recs[:4]] == ["plain", "spec", "spec", "plain"]  # rotated per group
        srv = [x for x in lines if x["kind"] == "server"]
        assert {x["config"] for x in srv} == {"spec"} and len(srv) == 3 + 2  # counters only where exposed
        s = summarise(path)
        assert s.checked == 6 + 3  # each spec output, and the baseline's outputs at concurrency 2 vs its first
        rows = {(r.config, r.concurrency): r for r in s.rows if r.scope == "all"}
        spec = rows[("spec", 1)]
        assert spec.acceptance_rate == pytest.approx(4 / 9) and spec.acceptance_length == pytest.approx(1 + 4 / 3)
        assert spec.per_position_acceptance == pytest.approx([1.0, 1 / 3, 0.0])
        assert rows[("plain", 1)].acceptance_rate is None and spec.speedup is not None
        assert not rows[("spec", 2)].sequential
        # the plain server answered p1 differently: the check finds it by text, at each concurrency
        assert [(m.prompt_id, m.config, m.unit, m.position) for m in s.mismatches] == \
            [("p1", "spec", "char", 3), ("p1", "spec", "char", 3)]
        page = write_report(s, tmp_path / "report.html").read_text()
        assert "2 of 9 outputs DIFFER" in page and "http://127.0.0.1" in page  # the servers, in the conditions
    finally:
        plain.close()


@pytest.mark.parametrize("api", ["tokens", "chat"])
def test_logprobs_give_token_positions_and_margins(tmp_path, api):
    """With logprobs (asked for at temperature 0), servers' outputs are compared token by token and
    each divergence carries the top-2 margin in the baseline's output and in the other's."""
    spec = FakeServer(logprobs=True)
    plain = FakeServer(logprobs=True, text=lambda b: ["Hel", "lo", " war", "ld"] if b.get("prompt") == [1, 2] else spec.PIECES)
    try:
        target = EndpointTarget(spec.url, api=api, logprobs=True)
        r = target.run_one(Prompt("p", "c", messages=({"role": "user", "content": "x"},)), [1], KW)
        assert r["tokens"] == spec.PIECES and r["margins"] == pytest.approx([0.5, 1.5, 2.5, 3.5])
        body = spec.bodies[-1][1]
        assert body["logprobs"] == (True if api == "chat" else 2) and body.get("top_logprobs") == (2 if api == "chat" else None)

        wl = tmp_path / "w.jsonl"
        wl.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": t}) + "\n"
                              for i, t in enumerate(["abc", "bc"])))
        cfg = BenchConfig(target="fake", workload=str(wl), n_per_category=None, max_tokens=8, warmup=0,
                          out_dir=str(tmp_path / "out"), endpoints={"plain": plain.url, "spec": spec.url})
        s = summarise(run_bench(cfg, tokenizer=CharTokenizer(), progress=False))
        assert [(m.prompt_id, m.unit, m.position, m.baseline, m.other, m.margin_single, m.margin_batched)
                for m in s.mismatches] == [("p1", "token", 2, " war", " wor", 2.5, 2.5)]
    finally:
        spec.close()
        plain.close()


LLAMA_SERVER = Path(__file__).parent / "data" / "llama_server"
VLLM = Path(__file__).parent / "data" / "vllm"


def replay(recorded: Path, model: str) -> tuple[dict, float]:
    """One request through EndpointTarget against a server that answers with an engine's recorded
    /metrics (metrics_after.txt) and stream (stream.txt): (the request's record, drafts counted)."""
    stream = (recorded / "stream.txt").read_bytes()

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): ...

        def do_GET(self):
            body = (recorded / "metrics_after.txt").read_bytes() if self.path == "/metrics" \
                else json.dumps({"data": [{"id": model}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(stream)))
            self.end_headers()
            self.wfile.write(stream)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t = EndpointTarget(f"http://127.0.0.1:{srv.server_address[1]}/v1", logprobs=True)
        return t.run_one(PROMPT, [1, 2, 3], KW), t.counters()["drafts"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_llama_server_counters_and_timings_from_recorded_responses():
    """llama-server's own /metrics and stream (tests/data/llama_server): one draft of 20 tokens,
    7 accepted, read in draftwise's words; its drafts vary in length, so proposals per position
    stay unknown; the response's own draft counts are kept with the request."""
    before = spec_counters((LLAMA_SERVER / "metrics_before.txt").read_text())
    after = spec_counters((LLAMA_SERVER / "metrics_after.txt").read_text())
    assert before["engine"] == after["engine"] == "llama.cpp"
    st = SpecStats(**server_stats(before, after, emitted_tokens=60))
    assert (st.verification_rounds, st.proposed_tokens, st.accepted_draft_tokens) == (1, 20, 7)
    assert st.acceptance_length == pytest.approx(8.0) and st.proposed_per_position == []
    assert st.accepted_per_position[:8] == [1] * 7 + [0]
    rec, drafts = replay(LLAMA_SERVER, "smollm2")
    assert drafts == 1
    assert rec["server_draft"] == {"draft_n": 20, "draft_n_accepted": 7}
    assert rec["emitted_tokens"] == 60 and rec["tokens_from"] == "usage" and rec["text"].startswith("1.")
    assert rec["tokens"][:2] == ["1", "."] and rec["margins"][0] == pytest.approx(3.006366 - 0.120647, abs=1e-5)


def test_vllm_counters_and_stream_from_recorded_responses():
    """vLLM's own /metrics and stream (tests/data/vllm): 8 drafts of 4 tokens, 25 accepted, 7, 7,
    6, 5 at positions 1..4; its stream carries several tokens in a chunk (a round's), each with
    its logprobs, and the token count in the usage event."""
    before = spec_counters((VLLM / "metrics_before.txt").read_text())
    after = spec_counters((VLLM / "metrics_after.txt").read_text())
    assert before["engine"] == after["engine"] == "vllm" and before["drafts"] == 0
    st = SpecStats(**server_stats(before, after, emitted_tokens=40))
    assert (st.verification_rounds, st.proposed_tokens, st.accepted_draft_tokens) == (8, 32, 25)
    assert st.proposed_per_position == [8] * 4 and st.accepted_per_position == [7, 7, 6, 5]
    assert st.acceptance_length == pytest.approx(33 / 8)
    rec, drafts = replay(VLLM, "qwen2.5-coder-1.5b")
    assert drafts == 8
    assert rec["emitted_tokens"] == 40 and rec["tokens_from"] == "usage" and rec["text"].startswith("def")
    assert len(rec["tokens"]) == 40 and len(rec["itl_s"]) == 18  # 19 chunks of tokens: a time between each
    assert rec["tokens"][0] == "def" and rec["margins"][0] == pytest.approx(-0.2604987 + 1.5104988, abs=1e-5)


def test_a_prediction_is_sent_as_openais_predicted_outputs(server):
    from draftwise.bench.config import BenchConfig

    EndpointTarget(server.url).run_one(PROMPT, [0, 1, 2], {**KW, "prediction": "def f(): pass"})
    assert server.bodies[-1][1]["prediction"] == {"type": "content", "content": "def f(): pass"}
    EndpointTarget(server.url).run_one(PROMPT, [0, 1, 2], KW)
    assert "prediction" not in server.bodies[-1][1]
    cfg = BenchConfig(endpoints={"dw": server.url, "dw+prediction": server.url})
    assert [(c.name, c.prediction) for c in cfg.run_configs()] == [("dw", False), ("dw+prediction", True)]


def test_a_rows_response_format_is_sent_to_chat_and_as_llama_servers_json_schema_to_completions(server):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    EndpointTarget(server.url).run_one(PROMPT, [0, 1, 2], {**KW, "response_format": fmt})
    assert server.bodies[-1][1]["response_format"] == fmt and server.bodies[-1][1]["json_schema"] == schema
    chat = Prompt("p1", "c", messages=({"role": "user", "content": "abc"},))
    EndpointTarget(server.url, api="chat").run_one(chat, [0, 1, 2], {**KW, "response_format": {"type": "json_object"}})
    path, body = server.bodies[-1]
    assert path.endswith("/chat/completions") and body["response_format"] == {"type": "json_object"}
    assert "json_schema" not in body
    EndpointTarget(server.url).run_one(PROMPT, [0, 1, 2], KW)
    assert "response_format" not in server.bodies[-1][1] and "json_schema" not in server.bodies[-1][1]


def test_a_rows_tools_go_to_chat_servers_and_streamed_calls_are_put_back_together(server, tmp_path):
    from draftwise.bench.endpoint import add_tool_calls
    from draftwise.prompts import from_jsonl

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = Prompt("p1", "c", messages=({"role": "user", "content": "abc"},), tools=tuple(tools), tool_choice="required")
    kw = {**KW, "tools": tools, "tool_choice": "required"}
    EndpointTarget(server.url, api="chat", logprobs=True).run_one(chat, [0, 1, 2], kw)
    assert server.bodies[-1][1]["tools"] == tools and server.bodies[-1][1]["tool_choice"] == "required"
    assert "logprobs" not in server.bodies[-1][1]  # llama-server refuses logprobs with streamed tools
    with pytest.raises(ValueError, match="--endpoint-api chat"):
        EndpointTarget(server.url).body(chat, [0, 1, 2], kw)
    calls = []
    add_tool_calls(calls, [{"index": 0, "id": "call_1", "function": {"name": "get", "arguments": ""}}])
    add_tool_calls(calls, [{"index": 0, "function": {"arguments": '{"a": '}}])
    add_tool_calls(calls, [{"index": 0, "function": {"arguments": "1}"}}, {"index": 1, "function": {"name": "h", "arguments": "{}"}}])
    assert calls == [{"name": "get", "arguments": '{"a": 1}'}, {"name": "h", "arguments": "{}"}]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "abc", "tools": tools}) + "\n")
    with pytest.raises(ValueError, match="in a row with 'messages'"):
        from_jsonl(rows)


def test_a_run_with_tool_rows_in_process_is_refused_before_it_measures(tmp_path):
    from fakes import CycleRunner

    from draftwise.engine import Engine

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "t", "messages": [{"role": "user", "content": "abc"}], "tools": tools}) + "\n")
    cfg = BenchConfig(target="fake", workload=str(rows), n_per_category=None, configs=("plain",),
                      out_dir=str(tmp_path / "out"), max_tokens=4)
    with pytest.raises(ValueError, match="--endpoint URL --endpoint-api chat"):
        run_bench(cfg, engines={"plain": Engine(CycleRunner(), CharTokenizer())}, tokenizer=CharTokenizer(),
                  progress=False)
    assert not (tmp_path / "out").exists()
