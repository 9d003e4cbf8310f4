"""Output items built from the chat layer's deltas, at length: a function call's
arguments in many fragments cost time linear in their length (the stream's events run
on the event loop), and come out whole in the `.done` event and the item."""

from __future__ import annotations

import time

from edge_server.api.openai.responses.streaming import OutputItems

FRAGMENTS = 40_000
FRAGMENT = '"abcdefghijklmnopqrstuvwxyz0123456789",'  # 2 MB of arguments in all


def test_long_call_arguments_build_in_linear_time() -> None:
    items = OutputItems()
    started = time.perf_counter()
    events = items.push([{"tool_calls": [{"index": 0, "id": "call_1", "function": {
        "name": "f", "arguments": "["}}]}])
    for _ in range(FRAGMENTS):
        events += items.push([{"tool_calls": [{"index": 0, "function": {
            "arguments": FRAGMENT}}]}])
    events += items.push([{"tool_calls": [{"index": 0, "function": {"arguments": "0]"}}]}])
    events += items.finish(incomplete=False)
    elapsed = time.perf_counter() - started
    whole = "[" + FRAGMENT * FRAGMENTS + "0]"
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == whole
    assert items.items[0]["arguments"] == whole and items.items[0]["status"] == "completed"
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) == FRAGMENTS + 2 and all(e["output_index"] == 0 for e in deltas)
    # Adding each fragment to a string copies all before it: 40 GB here, minutes.
    assert elapsed < 2.0, f"{elapsed:.1f} s for {len(whole) / 1e6:.0f} MB of arguments"


def test_fragments_of_an_earlier_call_after_the_next_began() -> None:
    """A parser may add to a call after the next one began: the earlier item still ends
    with all of its arguments."""
    items = OutputItems()
    items.push([{"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f",
                                                                       "arguments": "{"}}]}])
    items.push([{"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g",
                                                                       "arguments": "{}"}}]}])
    items.push([{"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}])
    items.finish(incomplete=False)
    assert [item["arguments"] for item in items.items] == ["{}", "{}"]
