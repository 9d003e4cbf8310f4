"""The thread tuner: per step size, the faster thread count wins, and a change of load
moves the choice (timings fed in: the tuner only compares them); and switching thread
counts between steps leaves llama.cpp's numbers as they are (the real model)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from conftest import DEFAULT_MODEL, start_server, stop_server

from edge_server.catalogue.default_model import default_model_path
from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
from edge_server.engine.backend.measure.thread_tuner import (
    EXPLORE_EVERY,
    ThreadTuner,
    candidate_counts,
    same_numbers_on,
)


def run(tuner: ThreadTuner, n_tokens: int, seconds_for: dict[int, float], steps: int) -> Counter:
    used: Counter[int] = Counter()
    for _ in range(steps):
        threads = tuner.choose(n_tokens)
        used[threads] += 1
        tuner.record(n_tokens, threads, seconds_for[threads] * n_tokens)
    return used


def test_candidates() -> None:
    assert candidate_counts(1) == (1,)
    assert candidate_counts(2) == (2, 1)
    assert candidate_counts(8) == (8, 7)


def test_the_faster_count_serves_most_steps() -> None:
    tuner = ThreadTuner(2)
    used = run(tuner, 1, {2: 0.020, 1: 0.012}, 400)
    assert tuner.best(1) == 1
    assert used[1] > 0.85 * 400
    assert used[2] >= 400 // EXPLORE_EVERY - 4  # still re-timed now and then


def test_step_sizes_are_tuned_apart() -> None:
    tuner = ThreadTuner(2)
    run(tuner, 1, {2: 0.020, 1: 0.012}, 100)
    run(tuner, 16, {2: 0.002, 1: 0.004}, 100)
    assert tuner.best(1) == 1
    assert tuner.best(16) == 2
    assert tuner.best(4) == 2  # never measured: all cores


def test_prompt_steps_use_every_core() -> None:
    tuner = ThreadTuner(2)
    assert run(tuner, 200, {2: 0.002, 1: 0.001}, 50) == Counter({2: 50})


def test_a_change_of_load_moves_the_choice() -> None:
    tuner = ThreadTuner(4)
    run(tuner, 8, {4: 0.010, 3: 0.014}, 200)
    assert tuner.best(8) == 4
    run(tuner, 8, {4: 0.030, 3: 0.014}, 400)
    assert tuner.best(8) == 3


def test_off_means_all_threads() -> None:
    tuner = ThreadTuner(2, adaptive=False)
    assert run(tuner, 1, {2: 0.020, 1: 0.001}, 50) == Counter({2: 50})


def test_thread_counts_are_checked_for_equal_numbers() -> None:
    """The load-time check agrees with a decode on each count compared here (the tuner
    adapts only where the numbers are equal: on this kind of CPU they are)."""
    model = LlamaModel(default_model_path(), ContextSettings(n_ctx=512, n_seq_max=1,
                                                             n_threads=2))
    try:
        verdict = same_numbers_on(model, (2, 1))
        tokens = model.vocab.tokenize("Counting threads changes nothing:", add_special=True,
                                      parse_special=False)
        batch = DecodeBatch(64)
        rows: dict[int, list[np.ndarray]] = {}
        for threads in (2, 1, 2, 1):
            model.set_threads(threads)
            model.seq_remove(0)
            batch.clear()
            batch.add_span(tokens, 0, 0, logits_last=True)
            assert batch.decode(model.ctx) == 0
            prompt_row = model.logits_row(len(tokens) - 1).copy()
            batch.clear()
            batch.add(int(prompt_row.argmax()), len(tokens), 0, logits=True)
            assert batch.decode(model.ctx) == 0
            rows.setdefault(threads, []).extend([prompt_row, model.logits_row(0).copy()])
        for runs in rows.values():  # each count repeats itself exactly
            assert all(np.array_equal(a, b) for a, b in zip(runs[:2], runs[2:], strict=True))
        equal = all(np.array_equal(a, b) for a, b in zip(rows[1], rows[2], strict=True))
        assert verdict == equal
    finally:
        model.close()


def test_server_with_adaptive_threads_repeats_itself(tmp_path: Path) -> None:
    """With the tuner on, steps switch thread counts (each count is timed within the
    first steps, then re-timed now and then), and a greedy request still gives the same
    tokens every time."""
    server = start_server(tmp_path, "--adaptive-threads", "on", "--threads", "2",
                          "--parallel", "4", "--ctx-size", "2048")
    try:
        body = {"model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 48,
                "temperature": 0, "ignore_eos": True}
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            # One at a time: the same batch make-up each time, only the threads change.
            answers = [http.post("/v1/completions", json=body).json() for _ in range(6)]
            assert {a["choices"][0]["text"] for a in answers} == {answers[0]["choices"][0]["text"]}
            assert all(a["usage"]["completion_tokens"] == 48 for a in answers)
            stats = http.get("/health").json()["models"][DEFAULT_MODEL]
            assert stats["decode_threads"] in (1, 2)
    finally:
        stop_server(server)
