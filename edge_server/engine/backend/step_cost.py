"""What a decode step costs on this machine, measured once and kept on disk.

Lookup drafting adds rows to a step; whether that pays depends on how a step's time
grows with its rows, which differs between CPUs (a fixed share of a step on one 2-core
box is a small one on a wider CPU), builds and models. So the engine times steps of 1
and of several sequences with 1, 2, 3 and 5 rows each, fits time = fixed + per_row * rows
for each (the fastest of four timings per shape, in CPU time of the engine thread:
other processes only add time, and their time slices are not counted), and
keeps the four numbers in a small JSON file next to the saved prompt
caches, keyed by the model file, the llama.cpp build, the CPU and the thread count.

The file, not a fresh timing, is what later starts read: the draft depth shapes each
batch, the shape moves llama.cpp's numerics in the last bits, and a cost that changed
from start to start would let the same seed write another text on the next run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .batch import DecodeBatch
from .llama_model import LlamaModel

log = logging.getLogger(__name__)

_PREFIX_TOKENS = 32  # context each timed sequence already holds
_ROWS_PER_SEQUENCE = (1, 2, 3, 5)  # a step without drafts, and with 1, 2 and 4
_REPEATS = 4  # timings of each shape; the fastest is kept (noise only adds time)
_BUDGET_SECONDS = 20.0  # a machine too busy to finish by then does not draft this run
_MANY = 8  # the "several sequences" point, or fewer where the model has fewer slots


@dataclass(frozen=True)
class StepCost:
    """Seconds of a decode step: fixed + per_row * rows, at one sequence and at `many`
    (linear between the two, as at `many` beyond)."""

    fixed_one: float
    row_one: float
    fixed_many: float
    row_many: float
    many: int

    def seconds(self, sequences: int, rows: int) -> float:
        if self.many <= 1:
            return self.fixed_one + self.row_one * rows
        share = min(max((sequences - 1) / (self.many - 1), 0.0), 1.0)
        fixed = self.fixed_one + share * (self.fixed_many - self.fixed_one)
        per_row = self.row_one + share * (self.row_many - self.row_one)
        return fixed + per_row * rows

    @classmethod
    def fixed_model(cls, step_cost_in_rows: float) -> StepCost:
        """The cost model of `step_cost_in_rows` rows' worth a step, in units of a row."""
        return cls(step_cost_in_rows, 1.0, step_cost_in_rows, 1.0, 1)


def cpu_identity() -> str:
    """The CPU's model name and feature flags (the kernels llama.cpp picks follow them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return os.uname().machine
    wanted = ("model name", "flags", "Features", "CPU part")
    first = {}
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in wanted and key not in first:
            first[key] = value.strip()
    return "|".join(f"{k}={first[k]}" for k in sorted(first)) or os.uname().machine


def cost_file(directory: Path, build_and_model: str, threads: int, sequences: int) -> Path:
    identity = f"{build_and_model}|{cpu_identity()}|threads={threads}|seqs={sequences}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return directory / f"step-cost-{key}.json"


def load_or_measure(model: LlamaModel, path: Path | None) -> StepCost | None:
    """The stored cost at `path`, else a fresh measurement (stored there when a path is
    given); None when the model cannot be timed (too few cells per sequence, or the
    machine too busy to finish in _BUDGET_SECONDS)."""
    if path is not None:
        try:
            cost = StepCost(**json.loads(path.read_text()))
            log.info("decode step cost from %s", path.name)
            return cost
        except (OSError, ValueError, TypeError):
            pass  # absent or unreadable: measure again
    measured = measure(model)
    if measured is not None and path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(measured)))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not keep the decode step cost: %s", exc)
    return measured


def measure(model: LlamaModel) -> StepCost | None:
    """Times steps on empty sequences 0..many-1 and leaves them empty again."""
    many = min(_MANY, model.n_seq_max)
    if model.n_ctx_seq < _PREFIX_TOKENS + max(_ROWS_PER_SEQUENCE) + 1:
        return None
    started = time.monotonic()
    deadline = started + _BUDGET_SECONDS
    try:
        one = _fit(model, 1, deadline)
        several = _fit(model, many, deadline) if many > 1 else one
    finally:
        for seq in range(many):
            model.seq_remove(seq)
    if one is None or several is None:
        return None
    cost = StepCost(one[0], one[1], several[0], several[1], many)
    log.info("decode step cost measured in %.1f s: %.2f ms + %.2f ms a row (1 sequence), "
             "%.2f ms + %.2f ms a row (%d)", time.monotonic() - started, 1e3 * one[0],
             1e3 * one[1], 1e3 * several[0], 1e3 * several[1], many)
    return cost


def _fit(model: LlamaModel, sequences: int, deadline: float) -> tuple[float, float] | None:
    """(fixed, per_row) seconds for steps of `sequences` sequences; None past `deadline`."""
    batch = DecodeBatch(max(_PREFIX_TOKENS, max(_ROWS_PER_SEQUENCE)) * sequences)
    prefix = [model.vocab.bos if model.vocab.bos >= 0 else 0] * _PREFIX_TOKENS
    for seq in range(sequences):
        model.seq_remove(seq)
        batch.add_span(prefix, 0, seq, logits_last=True)
    if batch.decode(model.ctx) != 0:
        return None
    timings: dict[int, list[float]] = {rows: [] for rows in _ROWS_PER_SEQUENCE}
    for repeat in range(_REPEATS + 1):  # the first round warms up, untimed
        for rows in _ROWS_PER_SEQUENCE:  # interleaved, so a burst of noise hits all
            batch.clear()
            for seq in range(sequences):
                for i in range(rows):
                    batch.add(prefix[0], _PREFIX_TOKENS + i, seq, logits=True)
            start = time.thread_time()
            status = batch.decode(model.ctx)
            if repeat:
                timings[rows].append(time.thread_time() - start)
            for seq in range(sequences):
                model.seq_remove(seq, _PREFIX_TOKENS)
            if status != 0 or time.monotonic() > deadline:
                return None
    x = np.array([rows * sequences for rows in _ROWS_PER_SEQUENCE], dtype=np.float64)
    y = np.array([min(timings[rows]) for rows in _ROWS_PER_SEQUENCE])
    per_row, fixed = np.polyfit(x, y, 1)
    if not per_row > 0:
        return None
    return max(float(fixed), 0.0), float(per_row)
