"""A real draftwise server on a loopback ephemeral port, in a thread of the test process (so tests
can also look at its scheduler and runner)."""
import socket
import threading
import time

import uvicorn

from draftwise.build import EngineSpec
from draftwise.server import ServeConfig, build_app


class LiveServer:
    def __init__(self, **cfg):
        cfg = {"target": "smollm2-135m", "backend": "llama.cpp", "drafter": "ngram", "max_context": 512,
               "max_running": 8, "threads": 2, "num_draft_tokens": 4, **cfg}
        server = {k: cfg.pop(k) for k in ("max_queue", "spec_off_above", "model_name", "pad_ragged") if k in cfg}
        self.app = build_app(ServeConfig(EngineSpec(**cfg), **server))
        self.scheduler = self.app.state.scheduler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if time.time() - t0 > 30 or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
