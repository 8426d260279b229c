"""draftwise serve over real HTTP on loopback, smollm2-135m on llama.cpp: the official openai
client, greedy identity alone vs concurrent, batched forwards, per-request speculation control,
errors, cancellation on disconnect, the queue bound, failing requests beside healthy streams."""
import json
import threading
import time

import httpx
import openai
import pytest

from draftwise.bench.endpoint import parse_prometheus
from draftwise.compare import divergence_report
from draftwise.prompts import load_workload
from serving import LiveServer

pytest.importorskip("llama_cpp")
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def srv():
    s = LiveServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def metric(srv, name, **labels):
    text = httpx.get(srv.url + "/metrics").text
    return sum(v for n, lab, v in parse_prometheus(text) if n == name and all(lab.get(k) == w for k, w in labels.items()))


def complete(srv, **body):
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    return r.status_code, r.json()


def test_openai_client_stream_and_not(client):
    kw = dict(model=MODEL, prompt="def fibonacci(n):", max_tokens=16, temperature=0)
    whole = client.completions.create(**kw)
    assert whole.usage.completion_tokens == 16 and whole.choices[0].finish_reason == "length"
    parts = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert parts[-1].usage.completion_tokens == 16

    msgs = [{"role": "user", "content": "Name three colours."}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 12
    streamed = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content
    assert [m.id for m in client.models.list()] == [MODEL]


def test_greedy_identity_alone_vs_concurrent_and_batched_forwards(srv):
    from draftwise.models.load import load_tokenizer
    from draftwise.models.registry import resolve

    tok = load_tokenizer(resolve(MODEL))
    prompts = [p.token_ids(tok)[-120:] for p in load_workload("editeval", 6)][:6]
    alone = [complete(srv, prompt=p, max_tokens=24, return_token_ids=True)[1]["choices"][0]["token_ids"]
             for p in prompts]
    steps_before = metric(srv, "draftwise:forward_sequences_count", kind="step")
    single_before = metric(srv, "draftwise:forward_sequences_bucket", kind="step", le="1.0")
    gate, out = threading.Barrier(len(prompts)), [None] * len(prompts)

    def one(i):
        gate.wait()
        out[i] = complete(srv, prompt=prompts[i], max_tokens=24, return_token_ids=True)[1]["choices"][0]["token_ids"]
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    multi = (metric(srv, "draftwise:forward_sequences_count", kind="step") - steps_before) \
        - (metric(srv, "draftwise:forward_sequences_bucket", kind="step", le="1.0") - single_before)
    assert multi > 0, "no target forward carried more than one sequence under concurrent load"
    diverged = [(i, divergence_report(srv.scheduler.target, prompts[i], alone[i], out[i]))  # server idle now
                for i in range(len(prompts)) if out[i] != alone[i]]
    assert not diverged, f"batched greedy output differs from alone (first divergence, top-2 margins): {diverged}"


def test_per_request_speculation_control(srv):
    p = "a = [1, 2, 3]\nb = [1, 2, 3]\nc = [1, 2, 3]\nd = [1, 2,"
    _, on = complete(srv, prompt=p, max_tokens=20)
    _, off = complete(srv, prompt=p, max_tokens=20, speculation=False)
    _, d2 = complete(srv, prompt=p, max_tokens=20, num_draft_tokens=2)
    assert on["choices"][0]["text"] == off["choices"][0]["text"] == d2["choices"][0]["text"]
    assert on["draftwise"]["stats"]["verification_rounds"] > 0
    assert off["draftwise"]["stats"]["verification_rounds"] == 0
    assert len(d2["draftwise"]["stats"]["proposed_per_position"]) == 2
    assert metric(srv, "vllm:spec_decode_num_drafts_total") > 0
    assert metric(srv, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0


@pytest.mark.parametrize("body, param", [
    ({"model": "nope", "prompt": "a"}, "model"),
    ({"prompt": "a", "n": 2}, "n"),
    ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ({"prompt": "a", "best_of": 2}, "best_of"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": ["a", "b"]}, "prompt"),  # a batch of prompts: the field is named, not its description
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": [5] * 600}, None),  # longer than the context (512)
    ({"prompt": [10 ** 9]}, None),  # token id out of the vocabulary
    ({"prompt": "a", "stop": [""]}, None),
    ({}, "prompt"),
])
def test_bad_requests_are_400_with_openai_error(srv, body, param):
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param


def test_bad_requests_through_openai_client(srv, client):
    with pytest.raises(openai.BadRequestError, match="not implemented by draftwise: n"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    r = httpx.post(srv.url + "/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_disconnect_cancels_and_frees_kv(srv):
    cancelled = metric(srv, "draftwise:requests_cancelled_total")
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 480, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["choices"][0]["finish_reason"] is None
    deadline = time.time() + 20
    while time.time() < deadline and srv.scheduler.counts() != (0, 0):
        time.sleep(0.05)
    assert srv.scheduler.counts() == (0, 0)
    assert srv.scheduler.target._lengths == {}  # the runner holds no sequence
    assert metric(srv, "draftwise:requests_cancelled_total") == cancelled + 1


def test_add_generation_prompt_false_leaves_out_the_assistant_opening(srv):
    msgs = [{"role": "user", "content": "Hi"}]
    n = {}
    for gen in (True, False):
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1,
                                                               "add_generation_prompt": gen})
        assert r.status_code == 200, r.text
        n[gen] = r.json()["usage"]["prompt_tokens"]
    tok = srv.scheduler.tokenizer
    assert n[False] == len(tok.apply_chat(msgs, generation_prompt=False)) < n[True] == len(tok.apply_chat(msgs))


def test_a_client_that_leaves_a_whole_response_cancels_it_while_chunks_flow(srv):
    cancelled = metric(srv, "draftwise:requests_cancelled_total")
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 480, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # leaves while the scheduler is decoding (events arriving)
        httpx.post(srv.url + "/v1/completions", json=body, timeout=1.5)
    deadline = time.time() + 10
    while time.time() < deadline and srv.scheduler.counts() != (0, 0):
        time.sleep(0.05)
    assert srv.scheduler.counts() == (0, 0) and srv.scheduler.target._lengths == {}
    assert metric(srv, "draftwise:requests_cancelled_total") == cancelled + 1


def test_queue_overflow_gives_429():
    s = LiveServer(max_running=1, max_queue=1)
    try:
        gate, codes = threading.Barrier(6), []

        def one():
            gate.wait()
            r = httpx.post(s.url + "/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0})
            codes.append((r.status_code, r.json()))
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(c for c, _ in codes)
        assert 200 in statuses and 429 in statuses and set(statuses) <= {200, 429}, statuses
        assert all(b["error"]["type"] == "rate_limit_exceeded" for c, b in codes if c == 429)
        assert metric(s, "draftwise:requests_rejected_total", reason="queue_full") == statuses.count(429)
        assert s.scheduler.target._lengths == {}
    finally:
        s.close()


def test_logprobs_are_the_targets_and_line_up_with_speculation(srv, client):
    """Each emitted token's logprob is read from the verification row that scored it: a speculative
    request (n-gram drafts on a repetitive prompt) reports the same logprobs as a plain one."""
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    got = {}
    for spec in (False, True):
        code, body = complete(srv, prompt=prompt, max_tokens=24, logprobs=2, speculation=spec)
        assert code == 200, body
        got[spec] = body
    lp, text = got[True]["choices"][0]["logprobs"], got[True]["choices"][0]["text"]
    assert got[True]["draftwise"]["stats"]["accepted_draft_tokens"] > 0
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == got[True]["usage"]["completion_tokens"] == 24
    assert "".join(lp["tokens"]) == text and lp["text_offset"][0] == 0
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 2 and chosen == pytest.approx(max(top.values()), abs=1e-6)  # greedy = top-1
        assert all(v <= 0 for v in top.values())
    plain = got[False]["choices"][0]["logprobs"]
    assert plain["tokens"] == lp["tokens"]
    for k in (0, 1):  # sampled: the chosen token is always among the top (OpenAI's up to k + 1)
        code, body = complete(srv, prompt="Once upon a time", max_tokens=8, logprobs=k, temperature=1.5, seed=4)
        sampled = body["choices"][0]["logprobs"]
        assert all(t in top and top[t] == x and len(top) <= k + 1 for t, x, top in
                   zip(sampled["tokens"], sampled["token_logprobs"], sampled["top_logprobs"])), sampled
    assert plain["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=2e-2)

    msgs = [{"role": "user", "content": "Count to five."}]
    parts = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0,
                                                logprobs=True, top_logprobs=3, stream=True,
                                                stream_options={"include_usage": True}))
    content = [c for p in parts if p.choices and p.choices[0].logprobs for c in p.choices[0].logprobs.content]
    assert len(content) == parts[-1].usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.top_logprobs[2].logprob for c in content)
    assert "".join(c.token for c in content) == "".join(p.choices[0].delta.content or "" for p in parts if p.choices)


def stream(srv, body):
    """(status, streamed text, the last data event before [DONE]) of a streaming completion."""
    with httpx.stream("POST", srv.url + "/v1/completions", json={"model": MODEL, "stream": True, **body},
                      timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, "", r.json()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return 200, "".join(e["choices"][0]["text"] for e in events if "choices" in e), events[-1]


def together(srv, bodies):
    gate, out = threading.Barrier(len(bodies)), [None] * len(bodies)

    def one(i):
        gate.wait()
        out[i] = stream(srv, bodies[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_failing_requests_touch_no_other_stream(srv, monkeypatch):
    """Two streams finish identical to a run without the rest: seeds out of range (400), and
    requests whose forwards fail inside the scheduler (the first after its prefill: a batched
    forward, retried per sequence), each ending with its error. No sequence is left open."""
    good = [{"prompt": "def fibonacci(n):", "max_tokens": 40, "temperature": 0},
            {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.8, "seed": 11}]
    reference = together(srv, good)
    poison, poisoned = [7] * 9, set()
    forward = srv.scheduler.target.forward

    def faulty(seqs, toks, k):
        poisoned.update(s for s, t in zip(seqs, toks) if t == poison)  # its prefill goes through
        if poisoned & set(seqs) and poison not in toks:
            raise RuntimeError("injected fault")
        return forward(seqs, toks, k)
    monkeypatch.setattr(srv.scheduler.target, "forward", faulty)
    faults = metric(srv, "draftwise:scheduler_faults_total", kind="forward")
    bad = [{"prompt": "hi", "seed": 2 ** 64}, {"prompt": "hi", "seed": 2 ** 63}] * 6 + [{"prompt": poison}] * 3
    got = together(srv, good + bad)
    assert [text for _, text, _ in got[:2]] == [text for _, text, _ in reference]
    assert all(code == 400 and last["error"]["param"] == "seed" for code, _, last in got[2:14])
    for code, _, last in got[14:]:
        assert code == 200 and last["error"]["code"] == "500" and "injected fault" in last["error"]["message"]
    assert metric(srv, "draftwise:scheduler_faults_total", kind="forward") > faults
    deadline = time.time() + 10
    while any(srv.scheduler.counts()) and time.time() < deadline:
        time.sleep(0.05)
    assert srv.scheduler.sequences_held == 0 and srv.scheduler.target._lengths == {}
    assert metric(srv, "draftwise:sequences_held") == 0


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "\ud800 hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \udfff"}]}),
])
def test_lone_surrogates_are_400(srv, path, body):
    r = httpx.post(srv.url + path, content=json.dumps({"model": MODEL, **body}),  # "\ud800" escaped
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_the_server_loader_takes_loaded_objects_out_of_the_collectors_view(monkeypatch):
    """After loading, a full garbage collection must not walk what loading allocated
    (draftwise.build.freeze_heap): the loader freezes the heap once the scheduler is built."""
    import gc

    import draftwise.server.load as load
    from fakes import CharTokenizer

    before = gc.get_freeze_count()
    held = [[i] for i in range(1000)]  # loaded state: tracked objects that stay alive
    from types import SimpleNamespace

    loaded = SimpleNamespace(target=SimpleNamespace(vocab_size=64))  # a scheduler, as far as the loader reads it
    monkeypatch.setattr(load, "_build", lambda spec, **kw: (loaded, CharTokenizer()))
    try:
        _, toks = load.build_scheduler(load.ServeConfig())
        toks.close()
        assert gc.get_freeze_count() >= before + len(held)
    finally:
        gc.unfreeze()


def test_the_prompt_cache_serves_a_prompt_asked_again():
    s = LiveServer(prompt_cache_mb=64)
    try:
        body = {"model": MODEL, "prompt": "def fibonacci(n):\n    ", "max_tokens": 12, "temperature": 0}
        first, again = (s.post("/v1/completions", json=body).json() for _ in range(2))
        n = first["usage"]["prompt_tokens"]
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": n}
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert metric(s, "vllm:prefix_cache_hits_total") == n
        assert metric(s, "vllm:prefix_cache_queries_total") == 2 * n
        assert metric(s, "draftwise:prompt_cache_entries") == 1 and metric(s, "draftwise:prompt_cache_bytes") > 0
        private = s.post("/v1/completions", json={**body, "private": True}).json()
        assert private["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert private["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        s.close()
