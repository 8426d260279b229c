"""The server's loop: a thread of its own that runs a Scheduler's steps while requests wait or
run, and its end (drain, close). `Engine` runs the same steps in the caller's thread instead.

An exception that escapes a step is the loop's own (every request's part of a step runs inside
that request's failure boundary): logged, counted, and the step run again; after MAX_LOOP_ERRORS
in a row every request in flight fails, rather than wait forever.
"""
from __future__ import annotations

import logging
import threading
import time

from draftwise.scheduler import Scheduler

MAX_LOOP_ERRORS = 3  # steps failing in a row outside any request's boundary before the running fail
log = logging.getLogger(__name__)


class LoopThread:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.step_started: float | None = None  # time.monotonic() at the start of the step in progress
        self._thread: threading.Thread | None = None
        self._close_lock = threading.Lock()  # drain and the server's shutdown may both close
        self._errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="draftwise-scheduler", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """The thread (`start`) is running."""
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        sched = self.scheduler
        while sched.waiting.wait(busy=lambda: sched.counts().running > 0):
            self.step_started = time.monotonic()
            try:
                sched.step()
                self._errors = 0
            except Exception as e:  # noqa: BLE001
                self._error(e)
            finally:
                self.step_started = None

    def drain(self, timeout: float) -> bool:
        """Take no more requests; let those in flight finish for up to `timeout` seconds, then close
        (the rest fail with draftwise.waiting.ShuttingDown). True if every one finished."""
        self.scheduler.waiting.refuse()
        deadline = time.monotonic() + timeout
        while any(self.scheduler.counts()) and self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        done = not any(self.scheduler.counts())
        self.close()
        return done

    def close(self) -> None:
        """End the thread after its step, then close the scheduler (what is left fails)."""
        with self._close_lock:
            self.scheduler.waiting.close()
            if self._thread is not None:
                self._thread.join()
            self.scheduler.close()

    def _error(self, e: Exception) -> None:
        self._errors += 1
        log.error("scheduler step failed (%d in a row)", self._errors, exc_info=e)
        try:
            self.scheduler.observer.fault("loop")
        finally:
            if self._errors >= MAX_LOOP_ERRORS:
                self._errors = 0
                self.scheduler.fail_all(e)
