"""How llama.cpp will cut a batch into graph runs, worked out before the batch is sent.

With a KV stream per sequence, llama_decode splits a batch with
llama_batch_allocr::split_equal(sequential): each ubatch takes, from the first row not
yet used in batch order, a run of sequences with consecutive increasing ids, and the same
number of rows from each (as many as the shortest of them has left). Each ubatch is one
pass over the weights. So where prompt chunks and one-row decode tokens share a step, the
order of the rows decides whether the chunks run as one large graph or are first cut down
to one row each (see step_batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def ubatch_shapes(runs: Sequence[tuple[int, int]], n_ubatch: int) -> list[tuple[int, int]]:
    """(sequences, rows each) of every ubatch, in order, for a batch laid out as `runs`:
    (sequence id, rows) in batch order, one run per sequence."""
    left = {seq: rows for seq, rows in runs}
    order = [seq for seq, _ in runs]
    shapes: list[tuple[int, int]] = []
    while True:
        chosen: list[int] = []
        for seq in order:
            if left[seq] and (not chosen or seq == chosen[-1] + 1):
                chosen.append(seq)
        if not chosen:
            return shapes
        each = min(min(left[s] for s in chosen), max(n_ubatch // len(chosen), 1))
        for seq in chosen:
            left[seq] -= each
        shapes.append((len(chosen), each))


def small_rows(shapes: list[tuple[int, int]]) -> int:
    """Rows outside the largest ubatch: those that pay a weight pass for few rows."""
    sizes = [n * rows for n, rows in shapes]
    return sum(sizes) - max(sizes, default=0)
