"""The server's life, as /health reports it:

    loading    the port is bound; the model loads and `auto` measures its cost curves in a
               background thread (503, as every /v1/ route)
    ok         the scheduler's loop runs (200)
    unhealthy  its thread has died, or one step has run longer than stall_timeout (503): an
               orchestrator should restart the server
    draining   SIGTERM: no new requests (503); those in flight finish for up to drain_timeout,
               then fail with an error event
    failed     loading raised (503); `draftwise serve` exits with status 1
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import uvicorn

from draftwise.loop_thread import LoopThread
from draftwise.scheduler import Scheduler
from draftwise.server.errors import ApiError

log = logging.getLogger(__name__)


class Lifecycle:
    """`build()` -> (scheduler, HTTP tokenizers), run in a background thread by `start`."""

    def __init__(self, build: Callable[[], tuple[Scheduler, object]], stall_timeout: float = 120.0):
        self._build, self.stall_timeout = build, stall_timeout
        self.state = "loading"
        self.scheduler: Scheduler | None = None
        self.loop: LoopThread | None = None  # the thread that runs the scheduler's steps
        self.tokenizers = None
        self.error: str | None = None
        self.on_failure: Callable[[], None] | None = None  # serve(): stop the server
        self._loaded = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._load, name="draftwise-load", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until loading has ended (ready or failed)."""
        return self._loaded.wait(timeout)

    def _load(self) -> None:
        try:
            sched, toks = self._build()
            loop = LoopThread(sched)
            with self._lock:
                if self.state != "loading":  # shut down while loading
                    loop.close()
                    return
                loop.start()
                self.scheduler, self.loop, self.tokenizers, self.state = sched, loop, toks, "ok"
        except BaseException as e:  # noqa: BLE001 - reported by /health and the exit status
            log.error("loading the model failed", exc_info=e)
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
            if self.on_failure is not None:
                self.on_failure()
        finally:
            self._loaded.set()

    def serving(self) -> tuple[Scheduler, object]:
        """(scheduler, tokenizers), or a 503 while loading, draining or failed."""
        if self.state != "ok":
            raise ApiError(503, {"loading": "the model is loading; retry when /health says ok",
                                 "failed": f"the model failed to load: {self.error}"}.get(
                                     self.state, "the server is shutting down"))
        return self.scheduler, self.tokenizers

    def health(self) -> tuple[int, dict]:
        """(HTTP status, body) for /health."""
        if self.scheduler is None:
            return 503, {"status": self.state} | ({"error": self.error} if self.error else {})
        waiting, running = self.scheduler.counts()
        body = {"status": self.state, "waiting": waiting, "running": running}
        if self.state != "ok":
            return 503, body
        started = self.loop.step_started
        if not self.loop.alive():
            return 503, body | {"status": "unhealthy", "reason": "the scheduler's loop thread has stopped"}
        if started is not None and time.monotonic() - started > self.stall_timeout:
            return 503, body | {"status": "unhealthy", "reason": f"one step has run for "
                                f"{time.monotonic() - started:.0f} s (stall timeout {self.stall_timeout:g} s)"}
        return 200, body

    def drain(self, timeout: float) -> None:
        """Take no more requests; finish those in flight for up to `timeout` s; fail the rest."""
        with self._lock:
            if self.state in ("loading", "ok"):
                self.state = "draining"
        if self.loop is not None:
            done = self.loop.drain(timeout)
            if not done:
                log.warning("drain timeout (%g s): the requests still in flight were cancelled", timeout)

    def close(self) -> None:
        with self._lock:
            if self.state in ("loading", "ok"):
                self.state = "draining"
        if self.loop is not None:
            self.loop.close()
        if self.tokenizers is not None:
            self.tokenizers.close()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose shutdown (SIGTERM or SIGINT: uvicorn stops accepting connections)
    drains the scheduler alongside uvicorn's wait for the open connections."""

    def __init__(self, config: uvicorn.Config, life: Lifecycle, drain_timeout: float):
        super().__init__(config)
        self.life, self.drain_timeout = life, drain_timeout

    async def shutdown(self, sockets=None) -> None:
        drain = asyncio.ensure_future(asyncio.to_thread(self.life.drain, self.drain_timeout))
        await super().shutdown(sockets)
        await drain
