"""Small helpers that the benchmark and soak scripts share for fair measurements."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def round_order(r: int, items: list[T]) -> list[T]:
    """What runs in round r: in order on even rounds, reversed on odd ones, so a drift
    of the machine's speed over a run hits every side alike."""
    return items if r % 2 == 0 else list(reversed(items))


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
