"""The requests submitted and not yet admitted: a bounded queue that any thread may submit to and
the loop takes from (draftwise.scheduler), with the two refusals a caller answers by status."""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from draftwise.request import Request


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: the caller should answer 429."""


class ShuttingDown(RuntimeError):
    """The loop takes no more requests (draining or closed): the caller should answer 503."""


class WaitingQueue:
    def __init__(self, bound: int):
        if bound < 0:
            raise ValueError(f"need max_queue >= 0, got {bound}")
        self.bound = bound
        self._reqs: deque[Request] = deque()
        self._cond = threading.Condition()
        self._accepting = True
        self.closed = False  # the loop thread ends (draftwise.loop_thread)

    def __len__(self) -> int:
        return len(self._reqs)

    def __contains__(self, req: Request) -> bool:
        return req in self._reqs

    def put(self, req: Request) -> None:
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self._reqs) >= self.bound:
                raise QueueFull(f"{len(self._reqs)} requests are waiting (the bound); retry later")
            self._reqs.append(req)
            self._cond.notify()

    def pop(self) -> Request | None:
        with self._cond:
            return self._reqs.popleft() if self._reqs else None

    def remove(self, req: Request) -> None:
        with self._cond:
            if req in self._reqs:
                self._reqs.remove(req)

    def refuse(self) -> None:
        """Take no more requests (ShuttingDown); those waiting stay."""
        with self._cond:
            self._accepting = False

    def close(self) -> None:
        """Take no more; wake the loop thread to end."""
        with self._cond:
            self.closed, self._accepting = True, False
            self._cond.notify_all()

    def take_all(self) -> list[Request]:
        with self._cond:
            out, self._reqs = list(self._reqs), deque()
        return out

    def wait(self, busy: Callable[[], bool]) -> bool:
        """Block until a request waits or `busy()` (requests running); False once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self.closed or self._reqs or busy())
            return not self.closed
