"""What a decode step costs on this machine, measured once and kept on disk.

Lookup drafting adds rows to a step; whether that pays depends on how a step's time
grows with its rows, which differs between CPUs (a fixed share of a step on one 2-core
box is a small one on a wider CPU), builds and models. It is not a straight line: on a
2-core AVX-512 box one SmolLM2 sequence took 6.0 ms for 1 row, 12.1 ms for 2 (llama.cpp
leaves its one-row kernels), 14.5 for 3, 21.2 for 5 and 29.4 for 9, so a single draft
never pays there and four or eight do. Nor does it rise steadily: llama.cpp's AVX-512
kernel for repacked Q4_K weights takes rows 16 at a time, then in fours, then singly, so
one sequence of a Qwen2.5-1.5B-shaped model took 208 ms for 8 rows, 226 for 9, 298 for
15 and 241 for 16. So the engine times steps of 1 and of several sequences with 1, 2, 4,
8 and 16 rows each (depths 0, 1, 3, 7 and 15, which fill those blocks; drafts are only
ever that deep, see draft_depths), the fastest of four timings per shape, in CPU
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

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import LlamaModel

log = logging.getLogger(__name__)

_PREFIX_TOKENS = 32  # context each timed sequence already holds
_ROWS_PER_SEQUENCE = (1, 2, 4, 8, 16)  # a step without drafts, and with 1, 3, 7 and 15
_REPEATS = 4  # timings of each shape; the fastest is kept (noise only adds time)
# Where one row takes longer than this, two timings a shape: noise is a smaller share of
# a long step, and four would not fit the budget on a 1.5B model.
_LONG_STEP_SECONDS = 0.010
_BUDGET_SECONDS = 20.0  # a machine too busy to finish by then does not draft this run
# The budget grows with the model's step (a 1.5B model's one-row step is 30 ms here, five
# times SmolLM2's), up to this: the model is not served while it is timed.
_MAX_BUDGET_SECONDS = 50.0
_MANY = 8  # the "several sequences" point, or fewer where the model has fewer slots
# A timed step asks for logits on at most this many rows (one sequence drafting 15 deep):
# llama.cpp keeps its output buffer at the most rows any step asked for, a vocabulary of
# floats each (1 MiB on Gemma 3's 262k), and 8 sequences x 16 rows would leave 128 MiB
# there for good in a server that may never batch as much. What the other rows' logits
# would have cost is added from the cost of a row's logits, measured on the deepest shape.
_MAX_OUTPUT_ROWS = max(_ROWS_PER_SEQUENCE)
# Of the stored file: 1 held a straight line, which misled (see above); 2 had no widths;
# 3 timed 1, 2, 3, 5 and 9 rows (9 rows cost nearly 16 rows' time on a 1.5B model).
_FORMAT = 4


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
    at one sequence, `several` at `many` sequences (linear in the sequences between).
    `widths[n - 1]`: a step of n sequences, one row each (decode_groups.py; empty where
    not measured)."""

    rows_per_sequence: tuple[int, ...]
    one: tuple[float, ...]
    several: tuple[float, ...]
    many: int
    widths: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        """A stored file that does not hold a usable table is measured again."""
        xs = self.rows_per_sequence
        if not (len(xs) >= 2 and len(self.one) == len(self.several) == len(xs)
                and all(b > a for a, b in pairwise(xs))
                and all(t > 0 for t in (*self.one, *self.several, *self.widths))
                and self.many >= 1):
            raise ValueError("not a step cost table")

    def seconds(self, sequences: int, rows: int) -> float:
        per_sequence = rows / max(sequences, 1)
        at_one = _interpolate(self.rows_per_sequence, self.one, per_sequence)
        if self.many <= 1:
            return at_one
        at_many = _interpolate(self.rows_per_sequence, self.several, per_sequence)
        share = (sequences - 1) / (self.many - 1)
        return at_one + max(share, 0.0) * (at_many - at_one)

    def draft_depths(self, most: int) -> list[int]:
        """The depths a step may draft, up to `most`: those whose rows were timed (between
        them a step's time is a guess, and the kernels' row blocks make it a poor one:
        15 rows of one sequence cost more than 16), and `most` itself where a lower cap
        (--draft-max, the batch, the context) stops short of the next one."""
        timed = [rows - 1 for rows in self.rows_per_sequence if 1 <= rows - 1 < most]
        return [*timed, most] if most >= 1 else []

    @classmethod
    def fixed_model(cls, step_cost_in_rows: float) -> StepCost:
        """A step costing `step_cost_in_rows` rows' worth plus its rows, in units of a row
        (a straight line: every depth up to 16 rows a sequence is one of its points)."""
        c, many, rows = step_cost_in_rows, _MANY, tuple(range(1, 17))
        return cls(rows, tuple(c + r for r in rows), tuple(c + many * r for r in rows), many)


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
                            tuple(stored["several"]), int(stored["many"]),
                            tuple(stored["widths"]))
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


def unmeasured_reason(model: LlamaModel) -> str:
    """Why `measure` gave no cost, in words for the log."""
    needed = _PREFIX_TOKENS + (
        max(_ROWS_PER_SEQUENCE) + 1 if not model.memory_kind.recurrent
        else (_REPEATS + 1) * sum(_ROWS_PER_SEQUENCE))
    if model.n_ctx_seq < needed:
        return f"a sequence's {model.n_ctx_seq} cells are too few to time it ({needed})"
    return (f"the machine was too busy to time it within {_BUDGET_SECONDS:.0f} s, or a "
            "decode failed")


def measure(model: LlamaModel) -> StepCost | None:
    """Times steps on empty sequences 0..many-1 and leaves them empty again."""
    many = min(_MANY, model.n_seq_max)
    if model.n_ctx_seq < _PREFIX_TOKENS + max(_ROWS_PER_SEQUENCE) + 1:
        return None
    started = time.monotonic()
    try:
        widths = _time_widths(model, many, started)
        if widths is None:
            return None
        repeats = 2 if widths[0] > _LONG_STEP_SECONDS else _REPEATS
        deadline = started + min(_MAX_BUDGET_SECONDS,
                                 _BUDGET_SECONDS * max(1.0, widths[0] / _LONG_STEP_SECONDS))
        one = _time_steps(model, 1, deadline, repeats)
        several = _time_steps(model, many, deadline, repeats) if many > 1 else one
    finally:
        for seq in range(many):
            model.seq_remove(seq)
    if one is None or several is None:
        return None
    cost = StepCost(_ROWS_PER_SEQUENCE, one, several, many, widths)
    log.info("decode step cost measured in %.1f s: %s ms (1 sequence), %s ms (%d), for %s "
             "rows each; %s ms for 1..%d sequences of one row", time.monotonic() - started,
             _ms(one), _ms(several), many, "/".join(map(str, _ROWS_PER_SEQUENCE)),
             _ms(widths), many)
    return cost


def _ms(seconds: tuple[float, ...]) -> str:
    return "/".join(f"{1e3 * s:.1f}" for s in seconds)


def _time_widths(model: LlamaModel, many: int, started: float) -> tuple[float, ...] | None:
    """Seconds of a step of 1..many sequences with one row each; None past the base
    budget."""
    return _time_shapes(model, many, [(n, 1, n) for n in range(1, many + 1)],
                        started + _BUDGET_SECONDS, _REPEATS)


def _time_steps(model: LlamaModel, sequences: int, deadline: float, repeats: int
                ) -> tuple[float, ...] | None:
    """Seconds of a step of `sequences` sequences with each of _ROWS_PER_SEQUENCE rows
    per sequence, all rows with logits (past _MAX_OUTPUT_ROWS, the rest's logits at the
    measured cost of a row's); None past `deadline`. More rows never cost less: a noisy
    timing must not make a deeper draft look free."""
    wanted = [sequences * rows for rows in _ROWS_PER_SEQUENCE]
    asked = [min(n, _MAX_OUTPUT_ROWS) for n in wanted]
    shapes = [(sequences, rows, n) for rows, n in zip(_ROWS_PER_SEQUENCE, asked, strict=True)]
    capped = wanted != asked
    if capped:
        # The deepest shape again with one row of logits a sequence: the difference is
        # what the other rows' logits cost (the vocabulary's projection of each).
        shapes.append((sequences, _ROWS_PER_SEQUENCE[-1], sequences))
    seconds = _time_shapes(model, sequences, shapes, deadline, repeats)
    if seconds is None:
        return None
    per_row = 0.0
    if capped:
        fewer = asked[-1] - sequences
        per_row = max(0.0, (seconds[len(asked) - 1] - seconds[-1]) / fewer) if fewer else 0.0
    full = [t + (w - a) * per_row
            for t, w, a in zip(seconds[:len(asked)], wanted, asked, strict=True)]
    return tuple(max(full[: i + 1]) for i in range(len(full)))


def _time_shapes(model: LlamaModel, sequences: int, shapes: list[tuple[int, int, int]],
                 deadline: float, repeats: int) -> tuple[float, ...] | None:
    """The fastest of `repeats` timings of each (sequences, rows each, rows with logits)
    shape, after `sequences` sequences got a prefix; None past `deadline`. The rows with
    logits are each sequence's last ones, spread over the sequences."""
    batch = DecodeBatch(max(_PREFIX_TOKENS, max(r for _, r, _ in shapes)) * sequences)
    prefix = [model.vocab.bos if model.vocab.bos >= 0 else 0] * _PREFIX_TOKENS
    # A recurrent state cannot cut the timed rows again: there each step goes on from the
    # one before (its cost does not grow with the context; that of a hybrid model's
    # attention layers grows by a few hundred cells, which a step hardly notices).
    cut = not model.memory_kind.recurrent
    if not cut and model.n_ctx_seq < _PREFIX_TOKENS + (repeats + 1) * sum(
            r for _, r, _ in shapes):
        return None
    next_pos = [_PREFIX_TOKENS] * sequences
    for seq in range(sequences):
        model.seq_remove(seq)
        batch.add_span(prefix, 0, seq, logits_last=True)
    if model.decode(batch) != 0:
        return None
    timings: list[list[float]] = [[] for _ in shapes]
    for repeat in range(repeats + 1):  # the first round warms up, untimed
        for shape, (n_seqs, rows, outputs) in enumerate(shapes):  # interleaved: noise hits all
            batch.clear()
            for seq in range(n_seqs):
                with_logits = outputs // n_seqs + (seq < outputs % n_seqs)
                for i in range(rows):
                    batch.add(prefix[0], next_pos[seq] + i, seq,
                              logits=i >= rows - with_logits)
            start = time.thread_time()
            status = model.decode(batch)
            if repeat:
                timings[shape].append(time.thread_time() - start)
            for seq in range(n_seqs):
                if cut:
                    model.seq_remove(seq, _PREFIX_TOKENS)
                else:
                    next_pos[seq] += rows
            if status != 0 or time.monotonic() > deadline:
                return None
    return tuple(min(t) for t in timings)
