"""Stored Responses in the fuzz campaign: /v1/responses continuing an earlier answer
(`previous_response_id`), chains of them whose items carry up to 7.5 MB of fields no
prompt renders, and GET / DELETE /v1/responses/{id} and
GET /v1/responses/{id}/input_items with junk `after`, `limit` and `order`.

A case is generated before any answer exists, so it names a stored id by a placeholder,
`@stored-N@` (the Nth most recent id the campaign has seen answered); `fill` puts the id
in just before the case is sent and `harvest` keeps the ids of answers as they come. With
no id seen yet, the placeholder goes as it is: one more junk id.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
from typing import Any
from urllib.parse import quote, urlencode

from hypothesis import strategies as st

from edge_testkit.fuzz.strategies import (
    BOOLEAN,
    MODEL,
    RESPONSES,
    SPECIAL_TEXT,
    Case,
    dumps,
    small_text,
    weird,
)

STORED = RESPONSES + "/{response_id}"
INPUT_ITEMS = STORED + "/input_items"
_PLACEHOLDER = re.compile(rb"@stored-(\d+)@")
_ANSWERED_ID = re.compile(rb'"id":\s*"(resp_[0-9A-Za-z_-]{1,100})"')


class StoredIds:
    """The ids of the latest stored responses, shared by the campaign's senders."""

    def __init__(self, keep: int = 64) -> None:
        self.ids: collections.deque[bytes] = collections.deque(maxlen=keep)
        self.lock = threading.Lock()

    def fill(self, case: Case) -> Case:
        with self.lock:
            ids = list(self.ids)
        if not ids or b"@stored-" not in case.body + case.path.encode():
            return case

        def pick(match: re.Match[bytes]) -> bytes:
            return ids[-1 - int(match.group(1)) % len(ids)]

        path = _PLACEHOLDER.sub(pick, case.path.encode()).decode()
        return dataclasses.replace(case, path=path, body=_PLACEHOLDER.sub(pick, case.body))

    def harvest(self, case: Case, status: int, body: bytes) -> None:
        if case.method == "POST" and case.path == RESPONSES and status == 200:
            found = _ANSWERED_ID.search(body)
            if found is not None:
                with self.lock:
                    self.ids.append(found.group(1))


STORED_IDS = StoredIds()

stored_ids = st.integers(0, 7).map(lambda n: f"@stored-{n}@")
# Short: ids go into paths, and a URL past 64 KiB is no request at all.
short_text = st.one_of(st.text(max_size=24), st.sampled_from(SPECIAL_TEXT))
junk_ids = st.one_of(short_text, st.sampled_from(
    ["resp_", "resp_0", "resp_" + "a" * 5000, "../../etc/passwd", "resp_%00", "..",
     "resp_\u0000", "msg_1", "RESP_1", " resp_1"]))
response_ids = st.one_of(stored_ids, stored_ids, junk_ids)


@st.composite
def continued_cases(draw: st.DrawFn) -> Case:
    """POST /v1/responses continuing a stored response (or a junk id); some start a
    conversation, so that there are stored ids to continue."""
    body: dict[str, Any] = {"model": MODEL, "input": draw(st.one_of(st.just("Go on"),
                                                                    small_text)),
                            "max_output_tokens": draw(st.integers(1, 4))}
    if draw(st.integers(0, 3)):
        body["previous_response_id"] = draw(st.one_of(response_ids, weird))
    optional = {"stream": BOOLEAN, "store": BOOLEAN, "instructions": small_text,
                "tools": st.just([{"type": "function", "name": "f"}])}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        body[name] = draw(optional[name])
    return Case(RESPONSES, dumps(body).encode("utf-8", "surrogatepass"), "stored-continue")


# Sizes of the fields no prompt renders, up to a body just under the 8 MiB limit.
EXTRA_SIZES = (0, 1_000, 100_000, 1_000_000, 4_000_000, 7_500_000)


def _extra(size: int, shape: str) -> Any:
    """`size` bytes of JSON: one string, many short strings, or objects (as many as a
    body may hold) with the rest as a string."""
    if shape == "string":
        return "x" * size
    if shape == "strings":
        return ["ab"] * (size // 5)
    objects = [{"k": i} for i in range(min(size // 12, 15_000))]
    return {"objects": objects, "pad": "y" * max(0, size - 12 * len(objects))}


@st.composite
def chained_extras_cases(draw: st.DrawFn) -> Case:
    """POST /v1/responses continuing the latest stored responses, its item and content
    part carrying large fields the server does not know: dropped before anything is
    stored, so the chain's records stay as small as what the model renders."""
    size = draw(st.sampled_from(EXTRA_SIZES))
    where = draw(st.sampled_from(["item", "part", "both"]))
    shape = draw(st.sampled_from(["string", "strings", "objects"]))
    share = size // 2 if where == "both" else size
    part: dict[str, Any] = {"type": "input_text", "text": draw(st.one_of(
        st.just("Go on"), small_text))}
    item: dict[str, Any] = {"type": "message", "role": "user", "content": [part]}
    if where in ("part", "both"):
        part[draw(st.sampled_from(["cache", "annotations", "logprobs"]))] = _extra(share,
                                                                                    shape)
    if where in ("item", "both"):
        item[draw(st.sampled_from(["trace", "summary", "encrypted_content"]))] = _extra(
            share, shape)
    body: dict[str, Any] = {"model": MODEL, "input": [item],
                            "max_output_tokens": draw(st.integers(1, 3))}
    if draw(st.integers(0, 4)):  # most continue the newest, so that chains grow long
        body["previous_response_id"] = f"@stored-{draw(st.sampled_from([0, 0, 0, 1]))}@"
    if draw(st.booleans()):
        body["stream"] = True
    return Case(RESPONSES, dumps(body).encode("utf-8", "surrogatepass"),
                "stored-chained-extras")


def _segment(text: str) -> str:
    # quote() takes no lone surrogates: they go as the replacement character's bytes.
    return quote(text.encode("utf-8", "replace"), safe="@")


query_values = st.one_of(short_text, st.sampled_from(
    ["", "0", "1", "20", "100", "101", "-1", "1e3", "1.5", "\u0663", "9" * 30, "asc", "desc",
     "ASC", "msg_0", "@stored-0@"]))


@st.composite
def lookup_cases(draw: st.DrawFn) -> Case:
    """GET or DELETE of a stored response, or a page of its input items."""
    response_id = _segment(draw(response_ids))
    kind = draw(st.sampled_from(["GET", "DELETE", "items"]))
    if kind != "items":
        return Case(f"{RESPONSES}/{response_id}", b"", "stored-lookup", method=kind,
                    route=STORED)
    query = {name: draw(query_values).encode("utf-8", "replace") for name in draw(
        st.lists(st.sampled_from(["after", "limit", "order", "bogus"]), max_size=3,
                 unique=True))}
    path = f"{RESPONSES}/{response_id}/input_items" + (f"?{urlencode(query)}" if query else "")
    return Case(path, b"", "stored-items", method="GET", route=INPUT_ITEMS)


def stored_cases() -> st.SearchStrategy[Case]:
    return st.one_of(continued_cases(), lookup_cases(), chained_extras_cases())
