"""How the server stops: the first SIGTERM drains, then uvicorn shuts down.

uvicorn alone closes the listening socket on SIGTERM, so a load balancer's health check
meets a refused connection while streams still run. Here the socket stays open while
the replica drains (/health answers 503, new requests are refused with 503), and uvicorn
is told to exit once nothing is in flight or --drain-timeout has passed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from edge_server.api.http.guards.draining import Drain

log = logging.getLogger("edge_server")


class DrainingServer(uvicorn.Server):
    """A second SIGTERM, or SIGINT, stops at once as uvicorn does."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.drain.draining and not self.should_exit:
            self.drain.start()  # a flag only: a signal handler must not touch the loop
            return
        super().handle_exit(sig, frame)


async def exit_when_drained(server: DrainingServer, timeout: float,
                            announce: Callable[[str], object]) -> None:
    """Waits for a drain to start, then ends serving once it is over."""
    drain = server.drain
    while not drain.draining:
        await asyncio.sleep(0.1)
    started = time.monotonic()
    log.info("draining: /health answers 503, %d request(s) in flight", drain.in_flight)
    announce("STOPPING=1\nSTATUS=draining")  # systemd: the stop has begun
    if not await drain.wait_idle(timeout):
        log.warning("drain timeout: %d request(s) still in flight are cut", drain.in_flight)
    log.info("drained in %.1f s; %d new request(s) refused meanwhile",
             time.monotonic() - started, drain.refused)
    # uvicorn's own graceful wait gets only what is left of --drain-timeout.
    left = timeout - (time.monotonic() - started)
    server.config.timeout_graceful_shutdown = max(1, int(left))
    server.should_exit = True
