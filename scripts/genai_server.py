"""OpenVINO GenAI's LLMPipeline or ONNX Runtime GenAI's Generator behind a minimal OpenAI-compatible
server, so that draftwise's harness (`bench --endpoint`, benchmarks/server_bench.py --engine openvino
| onnx-genai) measures each runtime's own speculation as it measures llama-server and vLLM. Neither
runtime's server is on PyPI (OpenVINO Model Server, Foundry Local); this is the thinnest wrapper over
the Python API users call: one model, one request at a time (both generate one sequence at a time
here), greedy or sampled, streamed as server-sent events.

Runs in the runtime's environment (OpenVINO: .peers/openvino, scripts/setup_peers.sh openvino; ONNX
Runtime GenAI: draftwise's own with the onnx extra), stdlib besides the runtime, never importing
draftwise:

    .peers/openvino/bin/python scripts/genai_server.py --runtime openvino --model .peers/ov/qwen2.5-coder-1.5b \
        [--prompt-lookup K | --draft-model .peers/ov/qwen2.5-coder-0.5b --draft K] --port 8301
    .venv/bin/python scripts/genai_server.py --runtime onnx --model ~/.cache/draftwise/onnx/NAME \
        [--ngram N --draft K [--adaptive K0] [--chained]] --port 8302

Speculation is the runtime's own. OpenVINO GenAI: `prompt_lookup=True` with `num_assistant_tokens=K`
and `max_ngram_size` (its prompt lookup), or `draft_model=` with `num_assistant_tokens=K`. ONNX Runtime
GenAI: its n-gram decoding (`set_speculative_options`: `ngram_size`, `max_draft_tokens`, its chained
lookup and adaptive width). Routes: GET /health, /v1/models, /metrics (request and token counts),
POST /v1/completions (prompt: text or token ids), /v1/chat/completions (the model's chat template).
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DONE = object()  # the end of a generation on its queue


class TokenQueue:
    """The pipeline's streamer target: token ids (one or several a step, as speculation emits
    them) turned into text pieces on a queue. Text is cut only where it decodes whole (a piece
    ending in U+FFFD waits for the rest of its bytes). Each call decodes a window, not the whole
    output: the tokens last sent (`ids[prefix:read]`, context for a tokenizer whose text of a token
    depends on the one before) and the new ones, the new text being what the window adds."""

    def __init__(self, decode):
        self.decode, self.ids, self.q, self.cancelled = decode, [], queue.Queue(), False
        self.prefix = self.read = 0  # ids[prefix:read]: the tokens of the last piece sent

    def put_tokens(self, tokens) -> bool:
        """Returns True when the client has gone and the generation should stop."""
        self.ids.extend(tokens if isinstance(tokens, (list, tuple)) else [tokens])
        sent = self.decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        text = self.decode(self.ids[self.prefix:])
        if not text.endswith("\ufffd") and len(text) > len(sent):
            self.q.put(text[len(sent):])
            self.prefix, self.read = self.read, len(self.ids)
        return self.cancelled


def make_streamer(tq: TokenQueue):
    import openvino_genai as ov_genai

    class Streamer(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()

        def write(self, token):
            stop = tq.put_tokens(token)
            return ov_genai.StreamingStatus.CANCEL if stop else ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    return Streamer()


class Engine:
    """One model and a lock: one generation at a time. `generate(ids, body, tq)` fills the queue
    through the runtime's `run` and ends it with (DONE, finish_reason or the error, tokens).
    `counts` are served at /metrics as Prometheus counters named PREFIX:NAME_total."""
    prefix = "genai"

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}

    def run(self, ids: list[int], body: dict, max_tokens: int, tq: TokenQueue) -> None: ...

    def generate(self, ids: list[int], body: dict, tq: TokenQueue) -> None:
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        with self.lock:
            try:
                self.run(ids, body, max_tokens, tq)
                n = len(tq.ids)
                self.counts["requests"] += 1
                self.counts["prompt_tokens"] += len(ids)
                self.counts["generation_tokens"] += n
                tq.q.put((DONE, "length" if n >= max_tokens else "stop", n))
            except Exception as e:  # reported to the client as the stream's error
                tq.q.put((DONE, e, len(tq.ids)))


class OpenVinoEngine(Engine):
    """OpenVINO GenAI's LLMPipeline, with its prompt lookup or draft-model speculation if asked."""
    prefix = "openvino"

    def __init__(self, model: str, device: str = "CPU", prompt_lookup: int = 0, draft_model: str | None = None,
                 draft: int = 0, max_ngram: int = 3):
        import openvino_genai as ov_genai
        super().__init__()
        kw = {}
        if prompt_lookup and draft_model:
            raise SystemExit("choose one of --prompt-lookup and --draft-model")
        if prompt_lookup:
            kw["prompt_lookup"] = True
        if draft_model:
            kw["draft_model"] = ov_genai.draft_model(draft_model, device)
        self.pipe = ov_genai.LLMPipeline(model, device, **kw)
        self.tokenizer = self.pipe.get_tokenizer()
        self.k = prompt_lookup or (draft if draft_model else 0)
        self.max_ngram = max_ngram if prompt_lookup else 0  # prompt lookup's alone

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def run(self, ids: list[int], body: dict, max_tokens: int, tq: TokenQueue) -> None:
        import numpy as np
        import openvino as ov
        cfg = self.pipe.get_generation_config()
        cfg.max_new_tokens = max_tokens
        t = float(body.get("temperature", 1.0))
        cfg.do_sample = t > 0
        if t > 0:
            cfg.temperature, cfg.top_p = t, float(body.get("top_p", 1.0))
            cfg.top_k = int(body.get("top_k") or 0)
            if body.get("seed") is not None:
                cfg.rng_seed = int(body["seed"])
        if self.k:
            cfg.num_assistant_tokens = self.k
            if self.max_ngram:
                cfg.max_ngram_size = self.max_ngram
        self.pipe.generate(ov.Tensor(np.array([ids], dtype=np.int64)), cfg, make_streamer(tq))


class OnnxEngine(Engine):
    """ONNX Runtime GenAI's Generator, with its n-gram decoding if asked (`ngram` > 0: the last
    ngram-1 tokens matched; `draft`: max_draft_tokens; `adaptive`: min_adaptive_k, its width
    controller's start and floor; `chained`: ngram_chained_lookup). Its speculative statistics
    are served in vLLM's and llama-server's counter names (rounds, proposed and accepted tokens),
    which the harness reads (draftwise.bench.endpoint)."""
    prefix = "onnxgenai"
    STATS = {"rounds": "spec_decode_num_drafts", "draft_tokens_proposed": "spec_decode_num_draft_tokens",
             "draft_tokens_accepted": "spec_decode_num_accepted_tokens"}

    def __init__(self, model: str, ngram: int = 0, draft: int = 4, adaptive: int = 0, chained: bool = False):
        import onnxruntime_genai as og
        super().__init__()
        self.og, self.model = og, og.Model(model)
        self.tokenizer = og.Tokenizer(self.model)
        self.spec = {"ngram_size": ngram, "max_draft_tokens": draft, "ngram_chained_lookup": chained,
                     "min_adaptive_k": adaptive} if ngram else None

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, ids: list[int]) -> str:
        import numpy as np
        return self.tokenizer.decode(np.array(ids, dtype=np.int32))

    def chat_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True))

    def run(self, ids: list[int], body: dict, max_tokens: int, tq: TokenQueue) -> None:
        import numpy as np
        params = self.og.GeneratorParams(self.model)
        t = float(body.get("temperature", 1.0))
        opts = {"max_length": len(ids) + max_tokens, "do_sample": t > 0}
        if t > 0:
            opts.update(temperature=t, top_p=float(body.get("top_p", 1.0)), top_k=int(body.get("top_k") or 0))
            if body.get("seed") is not None:
                opts["random_seed"] = int(body["seed"])
        params.set_search_options(**opts)
        if self.spec:
            params.set_speculative_options(**self.spec)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(np.array([ids], dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
            new = gen.get_sequence(0)[len(ids) + len(tq.ids):]
            if len(new) and tq.put_tokens([int(x) for x in new]):
                break
        if self.spec:
            stats = gen.get_speculative_stats()
            for theirs, ours in self.STATS.items():
                self.counts[ours] = self.counts.get(ours, 0) + int(stats.get(theirs, 0))


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    name: str
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the harness reads answers, not access logs
        pass

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
        if self.path == "/metrics":
            text = "".join(f"{self.engine.prefix}:{k}_total {v}\n" for k, v in self.engine.counts.items()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            return self.wfile.write(text)
        self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            chat = self.path == "/v1/chat/completions"
            if not chat and self.path != "/v1/completions":
                return self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            ids = request_ids(self.engine, body, chat)
        except (ValueError, TypeError, KeyError) as e:
            return self._json(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
        tq = TokenQueue(self.engine.decode)
        threading.Thread(target=self.engine.generate, args=(ids, body, tq), daemon=True).start()
        rid, created = f"genai-{time.monotonic_ns()}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            return self._stream(tq, chat, rid, created, kind, len(ids))
        parts, end = [], None
        while end is None:
            item = tq.q.get()
            if isinstance(item, tuple) and item[0] is DONE:
                end = item
            else:
                parts.append(item)
        if isinstance(end[1], Exception):
            return self._json(500, {"error": {"message": str(end[1]), "type": "server_error"}})
        text = "".join(parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text})
        self._json(200, {"id": rid, "object": kind, "created": created, "model": self.name,
                         "choices": [{**choice, "finish_reason": end[1]}], "usage": usage(len(ids), end[2])})

    def _stream(self, tq: TokenQueue, chat: bool, rid: str, created: int, kind: str, n_prompt: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def send(choices: list[dict], **extra) -> None:
            obj = {"id": rid, "object": kind + ".chunk" if chat else kind, "created": created, "model": self.name,
                   "choices": choices, **extra}
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        def piece(text: str | None, finish: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish}

        try:
            while True:
                item = tq.q.get()
                if isinstance(item, tuple) and item[0] is DONE:
                    break
                send([piece(item, None)])
            if isinstance(item[1], Exception):
                self.wfile.write(f"data: {json.dumps({'error': {'message': str(item[1])}})}\n\n".encode())
            else:
                send([piece(None, item[1])])
                send([], usage=usage(n_prompt, item[2]))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            tq.cancelled = True  # the streamer stops the generation at its next token


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def request_ids(engine: Engine, body: dict, chat: bool) -> list[int]:
    """The prompt's token ids: a chat's messages through the model's template; a completion's
    prompt as text or as token ids (OpenAI's completions take both)."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("messages: expected a non-empty list")
        return engine.chat_ids(msgs)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return engine.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    raise ValueError("prompt: expected a string or a list of token ids")


def serve(engine: Engine, name: str, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"engine": engine, "name": name})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=["openvino", "onnx"], required=True)
    ap.add_argument("--model", required=True,
                    help="the runtime's model directory (optimum-cli export openvino; the onnxruntime-genai builder)")
    ap.add_argument("--name", default=None, help="the model's name in /v1/models (default: the directory's)")
    ap.add_argument("--device", default="CPU", help="openvino: its device")
    ap.add_argument("--prompt-lookup", type=int, default=0, metavar="K", help="openvino: its prompt lookup, K tokens a step")
    ap.add_argument("--max-ngram", type=int, default=3, help="openvino: prompt lookup's longest n-gram matched")
    ap.add_argument("--draft-model", default=None, help="openvino: a draft model's directory (speculative decoding)")
    ap.add_argument("--draft", type=int, default=5, metavar="K",
                    help="tokens a step: openvino's draft model; onnx's max_draft_tokens")
    ap.add_argument("--ngram", type=int, default=0, metavar="N", help="onnx: its n-gram decoding, ngram_size N (2..16)")
    ap.add_argument("--adaptive", type=int, default=0, metavar="K0", help="onnx: min_adaptive_k (0: a fixed width)")
    ap.add_argument("--chained", action="store_true", help="onnx: ngram_chained_lookup")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args(argv)
    if a.runtime == "openvino":
        engine = OpenVinoEngine(a.model, a.device, a.prompt_lookup, a.draft_model, a.draft, a.max_ngram)
    else:
        engine = OnnxEngine(a.model, a.ngram, a.draft, a.adaptive, a.chained)
    name = a.name or a.model.rstrip("/").rsplit("/", 1)[-1]
    server = serve(engine, name, a.host, a.port)
    print(f"genai_server ({a.runtime}): {name} on http://{a.host}:{a.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
