"""Requests submitted but not yet admitted, shared by the event loop and the engine thread.

The condition variable is also how the engine thread sleeps while there is no work.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from edge_server.engine.errors import EngineError, EngineOverloaded
from edge_server.engine.request import RequestHandle


class WaitingQueue:
    def __init__(self, max_waiting: int, max_wait_seconds: float) -> None:
        self.max_waiting = max_waiting
        self.max_wait_seconds = max_wait_seconds
        self._handles: deque[RequestHandle] = deque()
        self._cond = threading.Condition()
        self.open = False

    def __len__(self) -> int:
        return len(self._handles)

    def push(self, handle: RequestHandle) -> None:
        """From the event loop: queue a request, or refuse it at the door."""
        with self._cond:
            if not self.open:
                raise EngineError("the model is shutting down; retry shortly")
            if len(self._handles) >= self.max_waiting:
                raise EngineOverloaded("too many requests are waiting; retry shortly")
            self._handles.append(handle)
            self._cond.notify()

    def snapshot(self) -> list[RequestHandle]:
        with self._cond:
            return list(self._handles)

    def remove(self, handle: RequestHandle) -> None:
        with self._cond:
            self._handles.remove(handle)

    def wait_for_work(self, has_jobs: bool) -> bool:
        """Engine thread: sleeps while there is nothing to do; False once closed."""
        with self._cond:
            while self.open and not has_jobs and not self._handles:
                self._cond.wait()
            return self.open

    def close(self) -> list[RequestHandle]:
        """Stops taking requests; returns those still waiting, for a last answer."""
        with self._cond:
            self.open = False
            left, self._handles = list(self._handles), deque()
            self._cond.notify_all()
        return left

    def expire(self) -> None:
        """Drops requests whose client left; those that waited too long for a slot get
        a clear error instead of a hang."""
        if not self._handles:
            return
        deadline = time.monotonic() - self.max_wait_seconds
        with self._cond:
            gone = [h for h in self._handles if h.cancelled or h.submitted_at < deadline]
            for handle in gone:
                self._handles.remove(handle)
        for handle in gone:
            handle.request.close()  # its prepared images: it never reached a slot
            if not handle.cancelled:
                handle.post([EngineOverloaded(
                    f"no slot became free within {self.max_wait_seconds:g}s; retry later",
                    status=503,
                )])
