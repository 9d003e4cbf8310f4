"""Decode groups: which generating sequences a step carries, from measured step widths.

The policy is a pure function of a machine's timings, so it is tested on timings
measured here; the engine running it is tested through a real server below."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from edge_server.engine.sched.decode_groups import MIN_GAIN, DecodeGroups
from tests.conftest import DEFAULT_MODEL, start_server, stop_server

# Milliseconds of a step of 1..8 one-row sequences: a Qwen2.5-1.5B-shaped Q4_K_M model
# on a 2-core AVX-512 box, where 8 rows leave the kernels' sweet spot.
QWEN_1_5B = (29.8, 55.7, 78.0, 97.6, 119.4, 140.2, 161.2, 213.3)
# SmolLM2 on the same box: a step grows slowly with its rows, so all go together.
SMOLLM2 = (7.3, 9.1, 10.4, 12.0, 13.9, 15.2, 17.0, 18.1)


def test_a_superlinear_step_is_split_and_every_sequence_gets_its_turn() -> None:
    groups = DecodeGroups(QWEN_1_5B)
    sizes = groups.sizes(8)
    assert len(sizes) > 1 and sum(sizes) == 8
    assert sum(QWEN_1_5B[s - 1] for s in sizes) < (1 - MIN_GAIN) * QWEN_1_5B[7]
    seq_ids = [0, 1, 2, 4, 5, 6, 8, 9]
    turns = [sorted(groups.pick(seq_ids)) for _ in range(len(sizes))]
    # A round decodes every sequence exactly once, in runs of adjacent ids.
    assert sorted(s for turn in turns for s in turn) == seq_ids
    for turn in turns:
        first = seq_ids.index(turn[0])
        assert turn == seq_ids[first:first + len(turn)]
    assert sorted(groups.pick(seq_ids)) == turns[0]  # and the next round starts again


def test_steps_that_grow_slowly_carry_every_sequence() -> None:
    groups = DecodeGroups(SMOLLM2)
    for n in range(1, 9):
        assert groups.sizes(n) == (n,)
        assert groups.pick(list(range(n))) == set(range(n))


def test_a_split_must_gain_enough_to_be_trusted() -> None:
    # Two steps of 4 are 3% cheaper than one of 8: within the timings' noise.
    widths = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 82.5)
    assert DecodeGroups(widths).sizes(8) == (8,)


def test_without_widths_every_sequence_decodes() -> None:
    assert DecodeGroups(()).sizes(5) == (5,)
    assert DecodeGroups((12.0,)).pick([3, 7]) == {3, 7}


def test_more_sequences_than_widths_extend_the_last_segment() -> None:
    sizes = DecodeGroups(QWEN_1_5B).sizes(12)
    assert sum(sizes) == 12 and max(sizes) <= len(QWEN_1_5B)


# --- the engine, through a real server ----------------------------------------------------


def _kept_cost(data: Path) -> Path:
    kept = list(data.rglob("step-cost-*.json"))
    assert len(kept) == 1, kept
    return kept[0]


def test_the_engine_decodes_in_groups_where_the_machine_measured_it_pays(
        tmp_path: Path) -> None:
    """The widths are measured at the first start and kept; where they say 8 rows cost
    far more than two steps of 4, concurrent requests take turns, and each still gets
    exactly the tokens it asked for."""
    server = start_server(tmp_path, "--parallel", "8", "--ctx-size", "1024")
    try:
        cost = json.loads(_kept_cost(tmp_path / "data").read_text())
    finally:
        stop_server(server)
    assert len(cost["widths"]) == cost["many"] and min(cost["widths"]) > 0
    # This machine's SmolLM2 steps may not pay for a split: give the engine a kept
    # table (as another machine could measure) where they do, then start again.
    path = _kept_cost(tmp_path / "data")
    cost["widths"] = [0.01 * n for n in range(1, 8)] + [0.2]
    path.write_text(json.dumps(cost))
    server = start_server(tmp_path, "--parallel", "8", "--ctx-size", "1024")
    try:
        url = f"{server.base_url}/v1/completions"

        def ask(i: int) -> dict:
            return httpx.post(url, timeout=300, json={
                "model": DEFAULT_MODEL, "prompt": f"Story {i}: once upon a time",
                "max_tokens": 24, "ignore_eos": True, "temperature": 0.8, "seed": i,
                # No drafts: a step with drafts carries every sequence.
                "draft": False}).json()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(8)))
        for answer in answers:
            assert answer["usage"]["completion_tokens"] == 24
            assert answer["choices"][0]["finish_reason"] == "length"
        deadline = time.monotonic() + 10
        stats: dict = {}
        while time.monotonic() < deadline:
            stats = httpx.get(f"{server.base_url}/health", timeout=10).json()["models"]
            if stats[DEFAULT_MODEL]["busy_sequences"] == 0:
                break
            time.sleep(0.2)
        assert stats[DEFAULT_MODEL]["grouped_decode_steps"] > 0
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        assert "edge_server_grouped_decode_steps_total" in metrics
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()
