"""Answers waiting for their readers: one bound on their bytes across all connections,
and how long a connection may stay behind.

A connection's waiting bytes are those of its stream read ahead (read_ahead.py) and
those its transport holds while writing is paused (the server's protocol reports both:
process/send_timeout.py). A connection is *behind* from when it first holds any until it holds
none again: its reader has then taken everything the server wrote (its transport
resumes only once empty). Behind connections are kept in the order they fell behind,
so the oldest, the slowest readers, come first:

- over --send-buffer-mb in all, the oldest behind are closed until the rest fits;
- one behind for --send-timeout is closed, however it drains meanwhile (a reader taking
  a little now and then stays behind, and no longer restarts the clock).

Closing aborts the connection: the application sees the client leave, its request is
cancelled and everything its answer held is freed, as for any disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# The ASGI scope extension under which the server gives each request its connection's
# Account (absent under other servers and in-process test clients).
EXTENSION = "edge_server.send_buffer"


class Account:
    """One connection's waiting bytes: `queued` by its read-ahead, `paused` in its
    transport while writing is paused."""

    __slots__ = ("_buffers", "_close", "closed", "paused", "peer", "queued")

    def __init__(self, buffers: SendBuffers, close: Callable[[], None], peer: object) -> None:
        self._buffers = buffers
        self._close = close
        self.queued = 0
        self.paused = 0
        self.closed = False
        self.peer = peer

    @property
    def held(self) -> int:
        return self.queued + self.paused

    def queue(self, n: int) -> None:
        self._change(queued=self.queued + n)

    def sent(self, n: int) -> None:
        self._change(queued=max(self.queued - n, 0))

    def writing_paused(self, n: int) -> None:
        self._change(paused=n)

    def writing_resumed(self) -> None:
        self._change(paused=0)

    def _change(self, *, queued: int | None = None, paused: int | None = None) -> None:
        if self.closed:  # what a closed connection frees is counted as freed already
            return
        before = self.held
        self.queued = self.queued if queued is None else queued
        self.paused = self.paused if paused is None else paused
        self._buffers._changed(self, before)

    def close(self, why: str) -> None:
        if not self.closed:
            self._buffers._drop(self)
            self.closed = True
            log.info("closing the connection of %s: %s", self.peer, why)
            self._close()


class SendBuffers:
    """The bound on all connections' waiting bytes, and the send timeout."""

    def __init__(self, limit_bytes: int, send_timeout: float) -> None:
        self.limit = limit_bytes
        self.send_timeout = send_timeout
        self.held = 0
        self.closed_over_limit = 0
        self.closed_behind = 0
        self._behind: dict[Account, float] = {}  # by when each fell behind, oldest first
        self._sweep: asyncio.TimerHandle | None = None

    def account(self, close: Callable[[], None], peer: object = None) -> Account:
        return Account(self, close, peer)

    @property
    def behind(self) -> int:
        return len(self._behind)

    def _changed(self, account: Account, before: int) -> None:
        now = account.held
        self.held += now - before
        if now and not before:
            self._behind[account] = time.monotonic()
            if self._sweep is None:
                self._schedule()
        elif before and not now:
            del self._behind[account]
        if now > before and self.held > self.limit:
            self._shed()

    def _drop(self, account: Account) -> None:
        self.held -= account.held
        self._behind.pop(account, None)

    def _shed(self) -> None:
        while self.held > self.limit and self._behind:
            oldest = next(iter(self._behind))
            self.closed_over_limit += 1
            oldest.close(f"answers waiting for their readers hold {self.held} bytes, over "
                         f"--send-buffer-mb; this reader is the longest behind")

    def _schedule(self) -> None:
        # A tick a tenth of the timeout (20 ms to 1 s): a connection is closed within
        # that much past its timeout. Ticks stop while no connection is behind.
        tick = min(max(self.send_timeout / 10, 0.02), 1.0)
        self._sweep = asyncio.get_running_loop().call_later(tick, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        deadline = time.monotonic() - self.send_timeout
        for account, since in list(self._behind.items()):
            if since > deadline:
                break
            self.closed_behind += 1
            account.close(f"it has been behind for {self.send_timeout:g} s (its reader "
                          f"has not taken what was written to it)")
        if self._behind:
            self._schedule()
