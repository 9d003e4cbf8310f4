"""How many generating sequences one decode step carries, from this machine's step costs.

A step's time does not grow evenly with its rows: llama.cpp's CPU kernels change with
the row count, and caches overflow. On a 2-core AVX-512 box a Qwen2.5-1.5B-shaped Q4_K_M
model took 100 ms for 4 one-row sequences, 168 ms for 7 and 225 ms for 8
(llama-batched-bench agrees), so 8 sequences advance faster as two steps of 4 (200 ms)
than as one step of 8. llama-server's 4 slots get that by accident; here the measured
widths (step_cost.py) decide. With N sequences generating, the engine splits them into
the equal groups whose steps cost least in all, and decodes one group a step, in turn: every
sequence still gains one token per round, and a round is shorter. Where the widths were
not measured, or splitting gains too little to trust, every sequence goes in every step.
"""

from __future__ import annotations

from collections.abc import Sequence

# A split must beat one step of all by this share: the widths are the fastest of a few
# timings, and each extra step pays Python's per-step work besides.
MIN_GAIN = 0.05


class DecodeGroups:
    def __init__(self, widths: Sequence[float]) -> None:
        self._widths = tuple(widths)  # seconds of a step of 1..len sequences, one row each
        self._turn = 0  # which group of the current split decodes next
        self._sizes: dict[int, tuple[int, ...]] = {}

    def _cost(self, n: int) -> float:
        """Seconds of a step of n one-row sequences; past the widths measured, the last
        segment extended."""
        w = self._widths
        if n <= len(w):
            return w[n - 1]
        slope = w[-1] - w[-2] if len(w) >= 2 else w[-1]
        return w[-1] + slope * (n - len(w))

    def sizes(self, n: int) -> tuple[int, ...]:
        """The group sizes for n generating sequences, largest first: (n,) unless a split
        costs at least MIN_GAIN less."""
        if n not in self._sizes:
            self._sizes[n] = self._split(n)
        return self._sizes[n]

    def _split(self, n: int) -> tuple[int, ...]:
        if len(self._widths) < 2 or n < 2:
            return (n,)
        # Groups of equal size (within one): the step times measured alone miss what a
        # step pays in the server (Python's work per step, the previous step's tokens
        # sent meanwhile), which weighs most on the smallest group; 7 + 1 looked 2%
        # cheaper than 4 + 4 on the 1.5B model, and its steps of one took 40 ms, not 30.
        best_cost = self._cost(n)
        best_split: tuple[int, ...] = (n,)
        for k in range(2, n + 1):
            split = tuple(n // k + (i < n % k) for i in range(k))
            cost = sum(self._cost(g) for g in split)
            if cost < best_cost:
                best_cost, best_split = cost, split
        if best_cost > (1 - MIN_GAIN) * self._cost(n):
            return (n,)
        return best_split

    def pick(self, seq_ids: list[int]) -> set[int]:
        """The sequences (of those generating, given in ascending order) this step
        decodes: the next group of their split, in turn. Groups are runs of adjacent
        sequence ids, which llama.cpp runs as one graph (backend/ubatch_split.py)."""
        sizes = self.sizes(len(seq_ids))
        if len(sizes) == 1:
            return set(seq_ids)
        turn = self._turn % len(sizes)
        self._turn = turn + 1
        start = sum(sizes[:turn])
        return set(seq_ids[start : start + sizes[turn]])
