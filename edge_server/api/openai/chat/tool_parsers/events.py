"""What a tool-call parser tells: content, the start of a call, its arguments."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArguments:
    index: int
    text: str


Event = Content | CallStart | CallArguments


def marker_at(text: str, markers: Collection[str]) -> str | None:
    """The marker `text` begins with; "" where text is only the start of one."""
    for marker in markers:
        if text.startswith(marker):
            return marker
    return "" if any(marker.startswith(text) for marker in markers) else None


def partial_marker(text: str, markers: Collection[str]) -> int:
    """Length of the longest end of `text` that begins one of the markers."""
    longest = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:k]):
                longest = k
                break
    return longest


def add_content(out: list[Event], text: str) -> None:
    """`text` told as content, joined to the content event just before it if any (one
    event per run of text, however it arrived)."""
    if not text:
        return
    if out and isinstance(out[-1], Content):
        out[-1].text += text
    else:
        out.append(Content(text))
