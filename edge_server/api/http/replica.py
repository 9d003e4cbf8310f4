"""The X-Edge-Replica header: which replica answered, on every response."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Edge-Replica"
# Visible ASCII only: the name goes verbatim into a header line.
_NAME = re.compile(r"[\x21-\x7e]{1,128}")


def check_replica_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"replica name {name[:40]!r}: 1 to 128 visible ASCII characters, "
                         "no spaces")
    return name


class ReplicaHeader:
    """ASGI middleware, outermost: errors and streams carry the header too."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self.header = (HEADER.lower().encode(), check_replica_name(name).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, named_send)
