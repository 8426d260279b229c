"""Peer engines started by draftwise (draftwise.peers) and `plan --engine vllm|llama-server`'s prediction."""
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from draftwise.bench.results import Results
from draftwise.peers import LLAMA_SERVER, VLLM_HEAD, VLLM_SERVE, Server, llama_server_command, llama_spec, vllm_command, vllm_spec
from draftwise.plan import EndpointRun, choose_k, predict_fixed_k


def test_a_pilot_at_k_predicts_every_shorter_k_by_hand():
    """Two requests. Plain: 0.5 s to the first token, then 100 ms a token (3.5 s a request). The
    pilot at K = 4: 1 s to the first token, 30 plain steps and 10 rounds of 200 ms whose draft
    tokens 1..4 were accepted 8, 6, 4, 2 times (60 tokens in 5 s). At K' a round costs 100 ms +
    100 ms x K' / 4 and emits 1 + the first K' positions' acceptances per round."""
    plain = EndpointRun(decode_s=6.0, decode_tokens=60, prefill_s=1.0, requests=2)
    run = EndpointRun(decode_s=5.0, decode_tokens=60, prefill_s=2.0, requests=2, rounds=10,
                      accepted_per_position=[8, 6, 4, 2])
    assert run.plain_steps == 30
    pred = predict_fixed_k(plain, run, 4)
    assert pred[0] == 1.0
    # K' = 1: 48 tokens in 3 + 10 x 0.125 s, so a request's 30 tokens take 2.656 s, + 1 s
    assert pred[1] == pytest.approx(3.5 / (1.0 + 4.25 * 60 / 48 / 2))  # 0.96x: the slower first token
    assert pred[2] == pytest.approx(3.5 / (1.0 + 4.5 * 60 / 54 / 2))
    assert pred[3] == pytest.approx(3.5 / (1.0 + 4.75 * 60 / 58 / 2))
    assert pred[4] == pytest.approx(1.0)  # the pilot itself, as measured: 2.5 + 1 s against 3.5 s
    assert max(pred, key=pred.get) == 3
    # it never drafted: every K decodes as plain, and only the first token's time differs
    never = predict_fixed_k(plain, EndpointRun(3.0, 30, prefill_s=2.0, requests=2), 4)
    assert sorted(never) == [0, 1, 2, 3, 4] and never[4] == pytest.approx((0.5 + 1.5) / (1.0 + 1.5))


def test_drafts_of_varying_length_are_priced_at_their_mean_length_up_to_k():
    """llama-server drafts until its lookup fails: the pilot at K = 8 drafted 40 tokens in 10
    rounds (L = 4 a round). The same runs as above otherwise: a round costs 100 ms more than a
    plain step with its 4 tokens, so at K' it costs 100 ms + 100 ms x min(4, K') / 4; at K' >= 4
    it is the pilot's round."""
    plain = EndpointRun(decode_s=6.0, decode_tokens=60, prefill_s=1.0, requests=2)
    run = EndpointRun(decode_s=5.0, decode_tokens=60, prefill_s=2.0, requests=2, rounds=10, proposed=40,
                      accepted_per_position=[8, 6, 4, 2])
    pred = predict_fixed_k(plain, run, 8)
    assert pred[2] == pytest.approx(3.5 / (1.0 + 4.5 * 60 / 54 / 2))
    assert pred[4] == pred[8] == pytest.approx(1.0)  # positions 5..8 accepted nothing and cost nothing more
    assert pred[6] == pytest.approx(1.0)


def test_an_endpoint_run_is_read_from_a_bench_of_the_engine(tmp_path):
    def req(pid, cat, conc, e2e, config="ngram4"):
        return {"kind": "request", "config": config, "concurrency": conc, "prompt_id": pid, "category": cat,
                "ttft_s": 0.5, "e2e_s": e2e, "emitted_tokens": 31}
    rows = [{"kind": "meta"}, req("e/1", "editeval", 1, 2.5), req("w/1", "writing", 1, 3.5),
            req("e/1", "editeval", 4, 9.0), req("e/1", "editeval", 1, 3.5, "plain"),
            {"kind": "server", "config": "ngram4", "concurrency": 1, "prompt_ids": ["e/1"],
             "stats": {"verification_rounds": 6, "proposed_tokens": 18, "accepted_per_position": [5, 3, 1]}},
            {"kind": "server", "config": "ngram4", "concurrency": 1, "prompt_ids": ["w/1"],
             "stats": {"verification_rounds": 4, "accepted_per_position": [3, 3, 2, 1]}}]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps({"key": str(i), **r}) for i, r in enumerate(rows)) + "\n")
    res = Results.load(path)
    run = EndpointRun.of(res, "ngram4")
    assert (run.decode_s, run.decode_tokens, run.prefill_s, run.requests, run.rounds) == (5.0, 60, 1.0, 2, 10)
    assert run.accepted_per_position == [8, 6, 3, 1] and run.plain_steps == 32 and run.proposed == 18
    code = EndpointRun.of(res, "ngram4", category="editeval")  # its request and its group's counters
    assert (code.decode_s, code.decode_tokens, code.rounds, code.accepted_per_position) == (2.0, 30, 6, [5, 3, 1])
    with pytest.raises(ValueError, match="no requests of 'ngram8'"):
        EndpointRun.of(res, "ngram8")
    with pytest.raises(ValueError, match="in category 'qa'"):
        EndpointRun.of(res, "ngram4", category="qa")


def test_the_exported_k_slows_no_category():
    pred = {0: 1.0, 1: 1.2, 2: 1.3, 3: 1.25}
    assert choose_k(pred, {}) == 2
    # code gains at every K, chat only up to K = 1: the workload's best K = 2 would slow chat
    per_cat = {"code": {0: 1.0, 1: 1.5, 2: 1.7, 3: 1.6}, "chat": {0: 1.0, 1: 1.0, 2: 0.96, 3: 0.9}}
    assert choose_k(pred, per_cat) == 1
    per_cat["chat"][1] = 0.99  # every K slows chat: no speculation
    assert choose_k(pred, per_cat) == 0
    assert choose_k(pred, per_cat, floor=0.97) == 1  # chat may lose up to 3%: K = 2 takes it to 0.96
    assert choose_k(pred, per_cat, floor=0.95) == 2


def test_vllm_commands_and_speculative_configs():
    assert vllm_spec("ngram", 6) == {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2,
                                     "prompt_lookup_max": 4}
    assert vllm_spec("draft", 3)["model"].endswith("/qwen2.5-coder-0.5b")
    assert vllm_spec("eagle3", 3) == {"method": "eagle3", "model": VLLM_HEAD, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="expected ngram, draft or eagle3"):
        vllm_spec("eagle", 3)
    with pytest.raises(ValueError, match="at least 1"):
        vllm_spec("ngram", 0)
    text = '{"method": "ngram", "num_speculative_tokens": 2}'
    cmd = vllm_command("qwen2.5-coder-1.5b", 9001, 2048, 1, text)  # a file's text goes as it is
    assert cmd[0] == VLLM_SERVE and cmd[cmd.index("--speculative-config") + 1] == text
    assert cmd[-2:] == ["--port", "9001"] and "--speculative-config" not in vllm_command("m", 1, 8, 1)
    assert "--no-enable-prefix-caching" in vllm_command("m", 1, 8, 1, prompt_cache=False) and "--no-enable-prefix-caching" not in cmd


def test_llama_server_commands_and_draft_lengths():
    assert llama_spec("ngram-mod") == ["--spec-type", "ngram-mod"]  # llama.cpp's defaults
    assert llama_spec("ngram-simple", 12)[2:] == ["--spec-ngram-simple-size-m", "12"]
    # ngram-mod stops where its lookup fails; n-min 1 keeps the drafts a shorter limit cuts
    assert llama_spec("ngram-mod", 8)[2:] == ["--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "1"]
    draft = llama_spec("draft", 3, "smollm2-135m")
    assert draft[:2] == ["--spec-type", "draft-simple"] and draft[3].endswith(".gguf") and draft[-2:] == ["--spec-draft-n-max", "3"]
    with pytest.raises(ValueError, match="expected draft or one of"):
        llama_spec("eagle", 3)
    with pytest.raises(ValueError, match="no draft length planned"):
        llama_spec("ngram-cache", 3)
    with pytest.raises(ValueError, match="at least 1"):
        llama_spec("ngram-simple", 0)
    cmd = llama_server_command("smollm2-135m", 9001, 1024, 4, llama_spec("ngram-simple", 6))
    assert cmd[0] == LLAMA_SERVER and cmd[cmd.index("-c") + 1] == "4096" and cmd[cmd.index("-np") + 1] == "4"
    assert cmd[-2:] == ["--port", "9001"] and "--metrics" in cmd and "--spec-ngram-simple-size-m" in cmd
    assert "--cache-ram" not in cmd  # llama.cpp's default; the plan turns it off:
    assert llama_server_command("smollm2-135m", 1, 64, 1, prompt_cache=False)[-4:] == ["--cache-ram", "0", "--port", "1"]


def test_plan_refuses_a_bad_peer_setting_before_starting_a_server(tmp_path):
    from draftwise.plan import plan_peer

    with pytest.raises(ValueError, match="expected vllm or llama-server"):
        plan_peer("sglang", "smollm2-135m", "ngram", 4, "smollm2-135m", {}, tmp_path)
    with pytest.raises(ValueError, match="no draft length planned"):
        plan_peer("llama-server", "smollm2-135m", "ngram-cache", 4, "smollm2-135m", {}, tmp_path)
    with pytest.raises(ValueError, match="expected ngram, draft or eagle3"):
        plan_peer("vllm", "smollm2-135m", "ngram-simple", 4, "smollm2-135m", {}, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_is_waited_for_and_stopped(tmp_path):
    port = _free_port()
    ok = ("import http.server as h\n"
          "class H(h.BaseHTTPRequestHandler):\n"
          "    def do_GET(self): self.send_response(200); self.end_headers()\n"
          f"h.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    with Server([sys.executable, "-c", ok], port, timeout_s=30) as s:
        assert s.proc.poll() is None and s.url == f"http://127.0.0.1:{port}/v1"
    assert s.proc.poll() is not None
    with pytest.raises(RuntimeError, match="exited with status 3"):
        with Server([sys.executable, "-c", "import sys; sys.exit(3)"], _free_port(), timeout_s=30):
            pass
    with pytest.raises(FileNotFoundError, match="setup_peers.sh"):
        with Server([str(tmp_path / "vllm-serve")], _free_port()):
            pass


PEERS = os.environ.get("DRAFTWISE_PEER_TESTS") == "1"


@pytest.mark.skipif(not PEERS or not Path(VLLM_SERVE).exists(),
                    reason="opt-in: DRAFTWISE_PEER_TESTS=1 with vLLM installed (scripts/setup_peers.sh vllm)")
def test_vllm_serves_a_bench_and_its_counters_are_read(tmp_path):
    """The real vLLM (~2 minutes, ~8 GB): one EditEval prompt through `bench --endpoint` against
    vLLM with n-gram K = 4, its counters read in draftwise's words."""
    from draftwise.bench import BenchConfig, run_bench, summarise

    port = _free_port()
    with Server(vllm_command("qwen2.5-coder-1.5b", port, 2048, 1, vllm_spec("ngram", 4)), port) as s:
        cfg = BenchConfig(target="qwen2.5-coder-1.5b", workload="editeval", n_per_category=1, max_tokens=32,
                          endpoints={"ngram4": s.url}, out_dir=str(tmp_path / "b"), baseline="ngram4")
        run_bench(cfg, progress=False)
    row = next(r for r in summarise(cfg.out_dir).rows if r.scope == "all")
    assert row.emitted_tokens == 32 and row.per_position_acceptance and row.acceptance_length >= 1.0


def test_plan_for_a_peer_names_what_it_cannot_plan(tmp_path, capsys):
    from draftwise import cli

    out = ["--out", str(tmp_path / "p")]
    assert cli.main(["plan", "--engine", "vllm", "--spec-type", "ngram-mod", *out]) == 2
    assert "--spec-type is llama-server's" in capsys.readouterr().err
    assert cli.main(["plan", "--engine", "llama-server", "--drafter", "suffix", *out]) == 2
    assert "not --drafter suffix" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.mark.skipif(not PEERS or not Path(LLAMA_SERVER).exists(),
                    reason="opt-in: DRAFTWISE_PEER_TESTS=1 with llama-server built (scripts/setup_peers.sh)")
def test_plan_for_llama_server_end_to_end(tmp_path):
    """The real llama-server on smollm2-135m (~1 minute): a pilot of ngram-simple at K = 8 on two
    EditEval prompts, predictions for K' = 1..8, and, when one is exported, its flags file and
    the measured run against plain."""
    from draftwise.plan import plan_peer

    port = _free_port()
    kw = {"target": "smollm2-135m", "workload": "editeval", "n_per_category": 2, "max_tokens": 32, "pilot_tokens": 32}
    out = plan_peer("llama-server", "smollm2-135m", "ngram-simple", 8, "smollm2-135m", kw, tmp_path, port=port,
                    max_context=1024, log=lambda m: None)
    assert sorted(out["predicted"]) == list(range(9)) and out["predicted"][0] == 1.0
    doc = json.loads((tmp_path / "plan_predictions.json").read_text())
    assert doc["engine"] == "llama-server" and doc["best_k"] == out["best"]
    flags = tmp_path / "llama_server_flags.txt"
    if out["best"]:
        assert flags.read_text().split() == llama_spec("ngram-simple", out["best"])
        assert out["measured"] is not None and (tmp_path / "measured" / "summary.csv").is_file()
    else:
        assert not flags.exists() and out["measured"] is None


def genai_server():
    """scripts/genai_server.py (it runs in a runtime's environment; its HTTP layer needs nothing of it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("genai_server", Path(__file__).parents[1] / "scripts" / "genai_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def byte_engine(mod):
    """genai_server's Engine on no runtime: tokens are UTF-8 bytes, and the "model" answers the
    prompt's text upper-cased after "é: ", streamed 1, 2, 3, 1, 2, 3... tokens a step, as a
    speculative runtime hands its accepted tokens over (so "é"'s two bytes arrive apart), each
    step counted as a round whose tokens but the last were accepted drafts, under ONNX Runtime
    GenAI's counter prefix."""

    class ByteEngine(mod.Engine):
        prefix = "onnxgenai"

        def __init__(self):
            super().__init__()
            self.prompts = []

        def encode(self, text: str) -> list[int]:
            return list(text.encode())

        def decode(self, ids: list[int]) -> str:
            return bytes(ids).decode("utf-8", "replace")

        def chat_ids(self, messages: list[dict]) -> list[int]:
            return self.encode("\n".join(m["content"] for m in messages))

        def run(self, ids: list[int], body: dict, max_tokens: int, tq) -> None:
            self.prompts.append(ids)
            answer = list(("é: " + self.decode(ids).upper()).encode())[:max_tokens]
            i, step = 0, 1
            while i < len(answer):
                tq.put_tokens(answer[i:i + step])
                for name, n in (("drafts", 1), ("draft_tokens", len(answer[i:i + step])),
                                ("accepted_tokens", len(answer[i:i + step]) - 1)):
                    key = f"spec_decode_num_{name}"
                    self.counts[key] = self.counts.get(key, 0) + n
                i, step = i + step, step % 3 + 1

    return ByteEngine()


def test_a_split_character_waits_for_its_second_byte():
    mod = genai_server()
    tq = mod.TokenQueue(lambda ids: bytes(ids).decode("utf-8", "replace"))
    tq.put_tokens(0xC3)
    assert tq.q.empty()  # half of "é": nothing sent yet
    tq.put_tokens([0xA9, ord("!")])
    assert tq.q.get_nowait() == "é!" and tq.q.empty()


def test_each_piece_decodes_a_window_not_the_whole_output():
    """A long output's pieces come from decoding the last piece's tokens and the new ones: the work
    per token stays flat however long the answer (decoding everything each token is O(n) a token)."""
    mod = genai_server()
    windows = []

    def decode(ids):
        windows.append(len(ids))
        return bytes(ids).decode("utf-8", "replace")

    tq = mod.TokenQueue(decode)
    text = "naïve café " * 40
    for b in text.encode():
        tq.put_tokens(b)
    pieces = []
    while not tq.q.empty():
        pieces.append(tq.q.get_nowait())
    assert "".join(pieces) == text and max(windows) <= 3  # a 2-byte character waits one token


def test_the_runtime_server_answers_the_harness_and_the_openai_client():
    """The wrapper's OpenAI surface, on a byte "model": the harness's streamed completions with
    token ids, and the openai client's chat, streamed and not; bad input is a 400; its counts."""
    import threading

    import openai

    from draftwise.bench.endpoint import EndpointTarget
    from draftwise.prompts import Prompt

    mod = genai_server()
    engine = byte_engine(mod)
    srv = mod.serve(engine, "byte-model", "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        target = EndpointTarget(url)
        assert target.model == "byte-model"
        kw = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0}
        rec = target.run_one(Prompt("p1", "code", "abc"), list(b"abc"), kw)
        assert rec["text"] == "é: ABC" and rec["emitted_tokens"] == 7 and rec["tokens_from"] == "usage"
        assert rec["finish_reason"] == "stop" and rec["prompt_tokens"] == 3 and engine.prompts[-1] == list(b"abc")
        cut = target.run_one(Prompt("p2", "code", "abcdef"), list(b"abcdef"), {**kw, "max_tokens": 5})
        assert cut["text"] == "é: A" and cut["finish_reason"] == "length" and cut["emitted_tokens"] == 5
        client = openai.OpenAI(base_url=url, api_key="none")
        msgs = [{"role": "user", "content": "hi"}]
        whole = client.chat.completions.create(model="byte-model", messages=msgs, max_tokens=32, temperature=0)
        assert whole.choices[0].message.content == "é: HI" and whole.usage.completion_tokens == 6
        stream = client.chat.completions.create(model="byte-model", messages=msgs, max_tokens=32, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "é: HI"
        assert chunks[-1].usage.completion_tokens == 6
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        with pytest.raises(openai.BadRequestError, match="expected a string or a list of token ids"):
            client.completions.create(model="byte-model", prompt=[[1, 2]], max_tokens=4)
        counts = {k: engine.counts[k] for k in ("requests", "prompt_tokens", "generation_tokens")}
        assert counts == {"requests": 4, "prompt_tokens": 3 + 6 + 2 + 2, "generation_tokens": 7 + 5 + 6 + 6}
        c = target.counters()  # steps of 1, 2, 3, 1 / 1, 2, 2 / 1, 2, 3 / 1, 2, 3 tokens
        assert (c["engine"], c["drafts"], c["draft_tokens"], c["accepted"]) == ("onnxruntime-genai", 13, 24, 11)
    finally:
        srv.shutdown()
        srv.server_close()
