"""When the tokens of a step go to the callers' event loops.

Every post wakes an event loop, and the loop's work on it takes the GIL that the engine
thread needs for its next step (on asyncio's loop the wake-up itself, a socket write, let
the loop take it at once; the server runs on uvloop, whose wake-up keeps it: cli/serve.py).
On a 2-core CPU, posting every step cost about 5-10% of the tokens/s (SmolLM2, 1 to 8
streaming clients, against the same server holding tokens; docs/performance.md, Streaming delivery).
So once a request has had its first token, its tokens wait until `interval` has passed
since its last post and then go together, each still its own delta (and its own event on
the wire). The first token, a finished request's last ones, and everything pending before
a step while a prompt is being evaluated (its chunks and images make long steps) go at
once. Where one step outlasts the interval (8 busy sequences on a small CPU), every
step's tokens go as they did before.
"""

from __future__ import annotations

import time

from edge_server.engine.request import RequestHandle
from edge_server.engine.sched.jobs import Job


def post_outboxes(live: list[Job], finished: list[Job], interval: float, *,
                  hold: bool = True) -> None:
    """Posts the outboxes of `finished` jobs, and of `live` ones that are due (all of
    them when `hold` is False), one wake-up per event loop."""
    now = time.monotonic()
    due = [job for job in live if job.outbox and not (
        hold and job.posted_at is not None and now - job.posted_at < interval)]
    ready = [(job.handle, job.outbox) for job in [*due, *finished] if job.outbox]
    for job in [*due, *finished]:
        job.outbox = []
        if job.first_token_at is not None:
            job.posted_at = now
    if ready:
        RequestHandle.post_many(ready)
