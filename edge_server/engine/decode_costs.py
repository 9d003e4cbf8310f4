"""What a decode step costs by its number of rows, learnt from the steps this machine runs.

Lookup drafting (lookup_draft.py) trades more rows for fewer steps, so it needs to know
what rows cost here. On a 2-core CPU a step of one row costs about three rows' worth of
its marginal cost, and from a few rows on every row costs about the same (the work is
compute-bound). On a GPU a row costs next to nothing beside the step. A model's curve has
its own shape too (Gemma 3's 262k-token output layer makes rows dear). So the costs are
measured: the median time of each row count seen recently, read between two measured
counts by interpolation and beyond them along the line of the nearest three. Row counts
vary by themselves (requests come and go), so no step has to be spent exploring.
"""

from __future__ import annotations

import statistics
from collections import deque
from itertools import pairwise

# Until a row count has been timed: a step's cost beyond its rows, in rows' worth, as
# measured on a 2-core x86 CPU (SmolLM2-135M: one sequence 7.3 ms + 4.1 ms a row).
PRIOR_OVERHEAD_IN_ROWS = 2.5
_SAMPLES_PER_COUNT = 9
_MIN_SAMPLES = 3  # timings of a row count before its median is trusted
_REFIT_EVERY = 16


class DecodeCosts:
    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._since_fit = 0
        self._points: list[tuple[int, float]] = []  # (rows, median seconds), ascending

    def record(self, rows: int, seconds: float) -> None:
        """The wall time of a step whose `rows` rows all produced logits."""
        self._recent.setdefault(rows, deque(maxlen=_SAMPLES_PER_COUNT)).append(seconds)
        self._since_fit += 1
        if self._since_fit >= _REFIT_EVERY:
            self._since_fit = 0
            self._points = sorted((n, statistics.median(times))
                                  for n, times in self._recent.items()
                                  if len(times) >= _MIN_SAMPLES)

    def cost(self, rows: int) -> float:
        """A step of `rows` rows, in seconds (in rows' worth until anything is timed)."""
        points = self._points
        if not points:
            return PRIOR_OVERHEAD_IN_ROWS + rows
        if len(points) == 1:
            known, seconds = points[0]
            return seconds * (PRIOR_OVERHEAD_IN_ROWS + rows) / (PRIOR_OVERHEAD_IN_ROWS + known)
        for (low, t_low), (high, t_high) in pairwise(points):
            if low <= rows <= high:
                return t_low + (t_high - t_low) * (rows - low) / (high - low)
        near = points[:3] if rows < points[0][0] else points[-3:]
        slope, intercept = _line(near)
        return max(intercept + max(slope, 0.0) * rows, min(t for _, t in near) * 0.5)


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope, mean_y - slope * mean_x
