"""Which requests a step decodes when they asked for different LoRA adapter sets.

A llama.cpp context decodes every row of a step under one adapter set
(backend/lora.py), so requests under different sets never share a step: each step takes
the jobs of one set, the sets in turn, and the context is switched to it before the
step's decodes (an image's, the batch's). Requests under the same set batch as always;
with one set in use (the common case: no adapters at all) every step takes every job.
Each switch costs llama.cpp a graph rebuild on the next decode, and each set's requests
advance a token per round of sets: llama-server does the same ("requests with different
LoRA configurations will not be batched together").
"""

from __future__ import annotations

from edge_server.engine.backend.lora import NO_ADAPTERS, AdapterSet
from edge_server.engine.sched.jobs import Job


class AdapterTurns:
    def __init__(self) -> None:
        self._last: AdapterSet = NO_ADAPTERS  # the set the previous step decoded
        self.switches = 0  # steps that decoded another set than the step before

    def pick(self, jobs: list[Job]) -> tuple[AdapterSet, list[Job]]:
        """The set this step decodes and its jobs (in their order): the set after the
        previous step's, among the sets of the jobs given."""
        sets: list[AdapterSet] = []
        for job in jobs:
            if job.request.adapters not in sets:
                sets.append(job.request.adapters)
        if len(sets) <= 1:
            chosen = sets[0] if sets else self._last
        else:
            ordered = sorted(sets, key=lambda s: s.key)
            later = [s for s in ordered if s.key > self._last.key]
            chosen = later[0] if later else ordered[0]
        if chosen != self._last:
            self.switches += 1
        self._last = chosen
        return chosen, [job for job in jobs if job.request.adapters == chosen]
