"""Measuring an OpenAI-compatible server (vLLM, SGLang, TensorRT-LLM, llama-server, ...) with
streaming requests, stdlib only.

Timing is the client's: chunk arrival times of the SSE stream, as a user of the server sees them.
Acceptance comes from the server's Prometheus counters, read before and after each group of
requests and mapped to draftwise's words (see `server_stats`). The delta counts every request
the server served meanwhile, so measure a server nobody else is using.
"""
from __future__ import annotations

import http.client
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from draftwise.bench.measure import timing_fields
from draftwise.grammar import format_schema
from draftwise.prompts import Prompt

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# spec-decode counter names (without the `_total` suffix) -> draftwise words; vLLM's and
# llama-server's (`--metrics`) differ only in their prefix
WORDS = {"spec_decode_num_drafts": "drafts", "spec_decode_num_draft_tokens": "draft_tokens",
         "spec_decode_num_accepted_tokens": "accepted", "spec_decode_num_accepted_tokens_per_pos": "per_pos"}
# prefix -> engine (onnxgenai: ONNX Runtime GenAI's own statistics as scripts/genai_server.py serves them)
ENGINES = {"vllm": "vllm", "llamacpp": "llama.cpp", "onnxgenai": "onnxruntime-genai"}
# draftwise's server also counts proposals per position (its D varies by request and round)
PROPOSED_PER_POS = "draftwise:spec_decode_num_proposed_tokens_per_pos"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of the Prometheus text format as (name, labels, value); comments skipped."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def spec_counters(text: str) -> dict | None:
    """vLLM's or llama-server's spec-decode counters summed over their other labels (model,
    engine); None if absent. Returns {"engine", "drafts", "draft_tokens", "accepted",
    "per_pos": {position: accepted}, "proposed_pos": {position: proposed}} (the last from
    draftwise's server only)."""
    out: dict = {"per_pos": {}, "proposed_pos": {}}
    for name, labels, value in parse_prometheus(text):
        if name.endswith("_created") or ":" not in name:  # prometheus_client's timestamps, not counts
            continue
        if name.removesuffix("_total") == PROPOSED_PER_POS:
            pos = int(labels.get("position", 0))
            out["proposed_pos"][pos] = out["proposed_pos"].get(pos, 0.0) + value
            continue
        prefix, _, bare = name.partition(":")
        word = WORDS.get(bare.removesuffix("_total")) if prefix in ENGINES else None
        if word:
            out["engine"] = ENGINES[prefix]
        if word == "per_pos":
            pos = int(labels.get("position", 0))
            out["per_pos"][pos] = out["per_pos"].get(pos, 0.0) + value
        elif word:
            out[word] = out.get(word, 0.0) + value
    return out if "drafts" in out else None


def server_stats(before: dict | None, after: dict | None, emitted_tokens: int) -> dict | None:
    """SpecStats fields from two counter readings. A draft is one verification round, emitting
    its accepted tokens plus one recovered or bonus token. vLLM drafts k tokens every round (k
    fixed by the server), so proposed_per_position[i] = drafts for i < k; llama-server's drafts
    vary in length and it does not count proposals per position, so those stay unknown (empty)
    while accepted_per_position is its own count. draftwise's server counts its proposals per
    position (`proposed_pos`): those are used as they are."""
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("drafts", "draft_tokens", "accepted")}

    def diff(key: str, positions: list[int]) -> list[int]:
        b, a = before.get(key, {}), after.get(key, {})
        return [int(a.get(p, 0) - b.get(p, 0)) for p in positions]

    counted = sorted(set(after.get("proposed_pos", {})) | set(before.get("proposed_pos", {})))
    positions = sorted(set(before["per_pos"]) | set(after["per_pos"]) | set(counted))
    per_pos = diff("per_pos", positions)
    rounds = int(d["drafts"])
    fixed = after.get("engine", "vllm") == "vllm"
    k = len(per_pos) or (round(d["draft_tokens"] / rounds) if rounds and fixed else 0)
    proposed = diff("proposed_pos", positions) if counted else [rounds] * k if fixed else []
    return {"verification_rounds": rounds, "proposed_tokens": int(d["draft_tokens"]),
            "accepted_draft_tokens": int(d["accepted"]), "round_emitted_tokens": int(d["accepted"]) + rounds,
            "emitted_tokens": emitted_tokens, "proposed_per_position": proposed,
            "accepted_per_position": per_pos or [0] * k, "requests": 0}


def iter_sse(resp):
    """`data:` payloads of a server-sent-event stream, one per event, until [DONE]."""
    data: list[str] = []
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            payload, data = "\n".join(data), []
            if payload == "[DONE]":
                return
            yield payload
    if data and data != ["[DONE]"]:
        yield "\n".join(data)


def add_tool_calls(calls: list[dict], deltas: list[dict]) -> None:
    """Accumulate streamed tool-call deltas into whole calls ({"name", "arguments"}), as OpenAI's
    client does: by index, the name and the argument string's pieces concatenated."""
    for d in deltas:
        i = d.get("index", len(calls))
        while len(calls) <= i:
            calls.append({"name": "", "arguments": ""})
        fn = d.get("function") or {}
        calls[i]["name"] += fn.get("name") or ""
        calls[i]["arguments"] += fn.get("arguments") or ""


def _token_logprobs(lp: dict | None) -> list[tuple[str, list[float]]]:
    """(token text, its top logprobs, largest first) per token of an OpenAI logprobs object:
    chat's `content` list or completions' parallel lists."""
    if not lp:
        return []
    if "content" in lp:
        return [(e["token"], sorted((t["logprob"] for t in e.get("top_logprobs") or []), reverse=True))
                for e in lp["content"] or []]
    tops = lp.get("top_logprobs") or [None] * len(lp.get("tokens") or [])
    return [(t, sorted((top or {}).values(), reverse=True)) for t, top in zip(lp.get("tokens") or [], tops)]


class EndpointTarget:
    """One server, one configuration. Groups run truly concurrently, so rows are not sequential."""

    sequential = False

    def __init__(self, url: str, model: str | None = None, api: str = "tokens", metrics: bool = True,
                 timeout_s: float = 600.0, logprobs: bool = False):
        """logprobs: ask for each token's top-2 logprobs (OpenAI's `logprobs`), so the output check
        can compare token by token and give the top-2 margin at a divergence."""
        u = urlsplit(url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint {url!r} is not an http(s) URL")
        self.url, self.api, self.metrics, self.timeout_s, self.logprobs = url, api, metrics, timeout_s, logprobs
        self._https, self._host, self._port = u.scheme == "https", u.hostname, u.port
        self._root = u.path.removesuffix("/v1")  # /metrics sits at the server root, beside /v1
        self.model = model or self._first_model()

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout_s)

    def _get(self, path: str) -> tuple[int, str]:
        conn = self._conn()
        try:
            conn.request("GET", self._root + path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def _first_model(self) -> str:
        try:
            status, body = self._get("/v1/models")
        except OSError as e:
            raise ValueError(f"endpoint {self.url} is not reachable: {e}") from None
        if status == 200:
            data = json.loads(body).get("data") or []
            if data:
                return data[0]["id"]
        return "default"

    def counters(self) -> dict | None:
        if not self.metrics:
            return None
        try:
            status, body = self._get("/metrics")
        except OSError:
            return None
        return spec_counters(body) if status == 200 else None

    def body(self, prompt: Prompt, ids: list[int], kw: dict) -> tuple[str, dict]:
        b = {"model": self.model, "max_tokens": kw["max_tokens"], "temperature": kw["temperature"],
             "top_p": kw["top_p"], "stream": True, "stream_options": {"include_usage": True}}
        if kw.get("top_k"):
            b["top_k"] = kw["top_k"]  # an extension (vLLM, SGLang, llama-server), not OpenAI's
        if kw.get("seed") is not None:
            b["seed"] = kw["seed"]
        if kw.get("prediction"):  # OpenAI's Predicted Outputs
            b["prediction"] = {"type": "content", "content": kw["prediction"]}
        if kw.get("response_format"):  # OpenAI's (chat); completions: llama-server's json_schema too
            b["response_format"] = kw["response_format"]
        b.update({k: kw[k] for k in ("tools", "tool_choice") if k in kw})
        chat = self.api == "chat" and prompt.messages is not None
        if self.logprobs and "tools" not in kw:  # llama-server refuses logprobs with streamed tools
            b.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
        if "tools" in kw and not chat:
            raise ValueError(f"prompt {prompt.id} has tools: measure it with --endpoint-api chat")
        if chat:
            msgs = list(prompt.messages)
            if prompt.assistant_prefix:  # vLLM's way to open the assistant turn
                msgs.append({"role": "assistant", "content": prompt.assistant_prefix})
                b.update(continue_final_message=True, add_generation_prompt=False)
            return "/v1/chat/completions", {**b, "messages": msgs}
        schema = format_schema(kw.get("response_format"))
        if schema is not None:
            b["json_schema"] = schema
        return "/v1/completions", {**b, "prompt": ids if self.api == "tokens" else prompt.text}

    def run_one(self, prompt: Prompt, ids: list[int], kw: dict) -> dict:
        path, body = self.body(prompt, ids, kw)
        conn = self._conn()
        t_chunks, parts, usage, finish, timings, calls = [], [], None, None, None, []
        tokens, margins = [], []
        t0 = time.perf_counter()
        try:
            conn.request("POST", self._root + path, json.dumps(body),
                         {"Content-Type": "application/json", "Accept": "text/event-stream",
                          "Connection": "close"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"{self.url}{path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            for payload in iter_sse(resp):
                now = time.perf_counter() - t0
                obj = json.loads(payload)
                if "error" in obj:
                    raise RuntimeError(f"{self.url}{path}: {obj['error']}")
                usage = obj.get("usage") or usage
                timings = obj.get("timings") or timings  # llama-server: its own per-request counts
                for c in obj.get("choices") or []:
                    text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                    finish = c.get("finish_reason") or finish
                    if (c.get("delta") or {}).get("tool_calls"):
                        t_chunks.append(now)
                        add_tool_calls(calls, c["delta"]["tool_calls"])
                    for tok, top in _token_logprobs(c.get("logprobs")):
                        tokens.append(tok)
                        margins.append(top[0] - top[1] if len(top) >= 2 else None)
                    if text:
                        t_chunks.append(now)
                        parts.append(text)
            end = time.perf_counter() - t0
            resp.read()  # the rest of the body after [DONE], so the server sees a clean close
        finally:
            conn.close()
        counted = usage is not None and usage.get("completion_tokens") is not None
        return {"_t0": t0, **timing_fields(t_chunks, end), "text": "".join(parts), "finish_reason": finish,
                "emitted_tokens": usage["completion_tokens"] if counted else len(t_chunks),
                "tokens_from": "usage" if counted else "chunks",
                "prompt_tokens": (usage or {}).get("prompt_tokens") or len(ids), "token_ids": None, "stats": None,
                **({"tokens": tokens, "margins": margins} if self.logprobs and tokens else {}),
                **({"tool_calls": calls} if calls else {}),
                **({"server_draft": {"draft_n": timings.get("draft_n", 0),
                                     "draft_n_accepted": timings.get("draft_n_accepted", 0)}} if timings else {})}

    def run_group(self, requests: list[tuple[Prompt, list[int], dict]]) -> tuple[list[dict], dict | None]:
        """All requests of the group at once; the counters are read before and after the group."""
        before = self.counters()
        gate = threading.Barrier(len(requests))

        def one(req):
            gate.wait()
            return self.run_one(*req)

        t_group = time.perf_counter()
        with ThreadPoolExecutor(len(requests)) as pool:
            recs = list(pool.map(one, requests))
        for r in recs:
            r["queue_s"] = r.pop("_t0") - t_group
        emitted = sum(r["emitted_tokens"] for r in recs)
        return recs, server_stats(before, self.counters(), emitted)

    def forget_prompts(self) -> None:
        """Nothing to forget here: a server's prompt cache is its own (a warm-up may leave it warm)."""

    def describe(self) -> dict:
        return {"sequential": False, "backend": "endpoint", "url": self.url, "model": self.model,
                "api": self.api, "drafter": None, "num_draft_tokens": None}
