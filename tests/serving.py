"""A real draftwise server on a loopback ephemeral port, in a thread of the test process (so tests
can also look at its scheduler and runner): smollm2-135m on llama.cpp, or the toy runner of
tests/fakes.py with injectable faults (`toy_build`)."""
import socket
import threading
import time

import httpx

from draftwise.build import EngineSpec
from draftwise.drafters.ngram import NgramDrafter
from draftwise.policy import FixedDraftLength
from draftwise.scheduler import Scheduler
from draftwise.server import ServeConfig, build_app, make_server
from draftwise.server.load import Tokenizers
from fakes import CharTokenizer, CycleRunner


class Runner(CycleRunner):
    """The toy runner with llama.cpp's limits (sequence slots, the context) and injectable faults:
    `fail(seq_ids, tokens)` true makes a forward raise; `delay` seconds per forward."""

    def __init__(self, n_seq_max=None, fail=None, delay=0.0, **kw):
        super().__init__(**{"period": 16, **kw})
        self.n_seq_max, self.fail, self.delay = n_seq_max, fail, delay

    def new_sequence(self):
        if self.n_seq_max is not None and len(self.seqs) >= self.n_seq_max:
            raise RuntimeError("no free sequence slot")
        return super().new_sequence()

    def forward(self, seq_ids, tokens, num_logits):
        time.sleep(self.delay)
        if self.fail is not None and self.fail(seq_ids, tokens):
            raise RuntimeError("injected forward failure")
        for s, toks in zip(seq_ids, tokens):
            assert len(self.seqs[s]) + len(toks) <= self.max_context, "past the context"
        return super().forward(seq_ids, tokens, num_logits)


class ChatChars(CharTokenizer):
    def apply_chat(self, messages, assistant_prefix="", generation_prompt=True, tools=None):
        return self.encode("".join(m["content"] for m in messages) + assistant_prefix)

    def tool_call_tokens(self):
        return None  # no tool-call format


def toy_build(runner=None, tokenizer=None, gate=None):
    """A `build` for build_app: the toy runner (no EOS: period 15) with n-gram drafting at D = 4,
    loaded once `gate` (a threading.Event) is set."""
    def build(cfg, observer):
        if gate is not None and not gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        tok = tokenizer or ChatChars()
        sched = Scheduler(runner or Runner(period=15), tok, NgramDrafter(1, 3), FixedDraftLength(4), max_running=4,
                          max_queue=cfg.max_queue, observer=observer, reserve_draft=False)
        return sched, Tokenizers(tok)
    return build

SERVER_FIELDS = ("max_queue", "spec_off_above", "model_name", "pad_ragged", "max_body_bytes", "max_prompt_tokens",
                 "max_stop", "max_stop_chars", "api_keys", "protect_metrics", "drain_timeout", "stall_timeout")


class LiveServer:
    def __init__(self, build=None, wait=True, **cfg):
        cfg = {"target": "smollm2-135m", "backend": "llama.cpp", "drafter": "ngram", "max_context": 512,
               "max_running": 8, "threads": 2, "num_draft_tokens": 4, **cfg}
        server = {k: cfg.pop(k) for k in SERVER_FIELDS if k in cfg}
        self.cfg = ServeConfig(spec=EngineSpec(**cfg), **server)
        self.app = build_app(self.cfg, build)
        self.life = self.app.state.life
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = make_server(self.app, self.cfg, log_level="warning", lifespan="on")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if time.time() - t0 > 30 or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        if wait and not (self.life.wait(120) and self.life.state == "ok"):
            raise RuntimeError(f"the server did not load: {self.life.state} {self.life.error}")

    @property
    def scheduler(self):
        return self.life.scheduler

    def headers(self) -> dict:
        keys = self.cfg.api_keys
        return {"Authorization": f"Bearer {keys[0]}"} if keys else {}

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, headers=self.headers() | kw.pop("headers", {}), timeout=120, **kw)

    def close(self):
        self.server.should_exit = True  # what uvicorn's SIGTERM handler does
        self.thread.join(60)
        self.sock.close()
