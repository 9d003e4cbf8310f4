"""What a decode step costs on this machine, measured once and kept on disk.

Lookup drafting adds rows to a step; whether that pays depends on how a step's time
grows with its rows, which differs between CPUs (a fixed share of a step on one 2-core
box is a small one on a wider CPU), builds and models. It is not a straight line: on a
2-core AVX-512 box one SmolLM2 sequence took 6.0 ms for 1 row, 12.1 ms for 2 (llama.cpp
leaves its one-row kernels), 14.5 for 3, 21.2 for 5 and 29.4 for 9, so a single draft
never pays there and four or eight do. So the engine times steps of 1 and of several
sequences with 1, 2, 3, 5 and 9 rows each (the fastest of four timings per shape, in CPU
time of the engine thread: other processes only add time, and their time slices are not
counted) and keeps the table in a small JSON file next to the saved prompt caches, keyed
by the model file, the llama.cpp build, the CPU and the thread count. Between the rows
timed, and between 1 and several sequences, a step's time is interpolated.

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
from itertools import pairwise
from pathlib import Path

from .batch import DecodeBatch
from .llama_model import LlamaModel

log = logging.getLogger(__name__)

_PREFIX_TOKENS = 32  # context each timed sequence already holds
_ROWS_PER_SEQUENCE = (1, 2, 3, 5, 9)  # a step without drafts, and with 1, 2, 4 and 8
_REPEATS = 4  # timings of each shape; the fastest is kept (noise only adds time)
_BUDGET_SECONDS = 20.0  # a machine too busy to finish by then does not draft this run
_MANY = 8  # the "several sequences" point, or fewer where the model has fewer slots
_FORMAT = 2  # of the stored file: 1 held a straight line, which misled (see above)


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise linear through (xs, ys); beyond the ends, the nearest segment extended."""
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class StepCost:
    """Seconds of a decode step with `rows_per_sequence[i]` rows for each sequence: `one`
    at one sequence, `several` at `many` sequences (linear in the sequences between)."""

    rows_per_sequence: tuple[int, ...]
    one: tuple[float, ...]
    several: tuple[float, ...]
    many: int

    def __post_init__(self) -> None:
        """A stored file that does not hold a usable table is measured again."""
        xs = self.rows_per_sequence
        if not (len(xs) >= 2 and len(self.one) == len(self.several) == len(xs)
                and all(b > a for a, b in pairwise(xs))
                and all(t > 0 for t in (*self.one, *self.several)) and self.many >= 1):
            raise ValueError("not a step cost table")

    def seconds(self, sequences: int, rows: int) -> float:
        per_sequence = rows / max(sequences, 1)
        at_one = _interpolate(self.rows_per_sequence, self.one, per_sequence)
        if self.many <= 1:
            return at_one
        at_many = _interpolate(self.rows_per_sequence, self.several, per_sequence)
        share = (sequences - 1) / (self.many - 1)
        return at_one + max(share, 0.0) * (at_many - at_one)

    @classmethod
    def fixed_model(cls, step_cost_in_rows: float) -> StepCost:
        """A step costing `step_cost_in_rows` rows' worth plus its rows, in units of a row."""
        c, many = step_cost_in_rows, _MANY
        return cls((1, 2), (c + 1, c + 2), (c + many, c + 2 * many), many)


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
    identity = (f"{build_and_model}|{cpu_identity()}|threads={threads}|seqs={sequences}"
                f"|format={_FORMAT}")
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return directory / f"step-cost-{key}.json"


def load_or_measure(model: LlamaModel, path: Path | None) -> StepCost | None:
    """The stored cost at `path`, else a fresh measurement (stored there when a path is
    given); None when the model cannot be timed (too few cells per sequence, or the
    machine too busy to finish in _BUDGET_SECONDS)."""
    if path is not None:
        try:
            stored = json.loads(path.read_text())
            cost = StepCost(tuple(stored["rows_per_sequence"]), tuple(stored["one"]),
                            tuple(stored["several"]), int(stored["many"]))
            log.info("decode step cost from %s", path.name)
            return cost
        except (OSError, ValueError, TypeError, KeyError):
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
        one = _time_steps(model, 1, deadline)
        several = _time_steps(model, many, deadline) if many > 1 else one
    finally:
        for seq in range(many):
            model.seq_remove(seq)
    if one is None or several is None:
        return None
    cost = StepCost(_ROWS_PER_SEQUENCE, one, several, many)
    log.info("decode step cost measured in %.1f s: %s ms (1 sequence), %s ms (%d), for %s "
             "rows each", time.monotonic() - started, _ms(one), _ms(several), many,
             "/".join(map(str, _ROWS_PER_SEQUENCE)))
    return cost


def _ms(seconds: tuple[float, ...]) -> str:
    return "/".join(f"{1e3 * s:.1f}" for s in seconds)


def _time_steps(model: LlamaModel, sequences: int, deadline: float
                ) -> tuple[float, ...] | None:
    """Seconds of a step of `sequences` sequences with each of _ROWS_PER_SEQUENCE rows
    per sequence; None past `deadline`."""
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
    seconds = tuple(min(timings[rows]) for rows in _ROWS_PER_SEQUENCE)
    # More rows never cost less: a noisy timing must not make a deeper draft look free.
    return tuple(max(seconds[: i + 1]) for i in range(len(seconds)))
