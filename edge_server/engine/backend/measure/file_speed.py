"""Which of several GGUF files of one model runs a fixed mix of work fastest here.

Which quantization runs fastest depends on the kernels llama.cpp has for it on this CPU:
on x86 Q8_0 has sgemm kernels for prompts and Q4_1 none, while with plain kernels a
Q4_1 token reads half the bytes of a Q8_0 one, which counts most when one sequence
decodes. So the files are timed, once, each on the kernel path it loads with
(cpu_probe.py), on the work of the benchmarks' load mode: 1, 4 and 8 clients at once,
each with a 64-token prompt and 128 tokens to decode.

Each shape (a 64-token prompt chunk; a step of 1, 4 and 8 sequences, one row each) is
timed in CPU time on one thread: other processes only add time, and their time slices
are not counted, where on two threads a thread waiting at a barrier for its descheduled
partner spins, and counts. The files alternate, and the fastest of a few timings of each
shape is kept (noise only adds time). A machine too busy to finish within the budget
gets no verdict (the caller serves its default and times again at the next start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel

_CHUNK = 64  # prompt tokens of a client, and of a timed chunk
_DECODED = 128  # tokens each client decodes
CLIENTS = (1, 4, 8)
_REPEATS = 3
_PREFIX = 8  # context each decoding sequence holds
_CHUNK_SEQ = max(CLIENTS)  # the sequence prompt chunks are timed on
_BUDGET_SECONDS = 20.0  # of wall time, after the files have loaded


@dataclass(frozen=True)
class FileTimes:
    """CPU seconds of a 64-token prompt chunk and of a step of each of CLIENTS sequences."""

    chunk: float
    steps: tuple[float, ...]

    @property
    def mix(self) -> float:
        """Seconds of the mix: at each client count, the clients' prompts and the steps
        that decode their tokens."""
        return sum(n * self.chunk + _DECODED * step
                   for n, step in zip(CLIENTS, self.steps, strict=True))


def _timed(model: LlamaModel, batch: DecodeBatch) -> float:
    started = time.thread_time()
    if batch.decode(model.ctx) != 0:
        raise RuntimeError("a timed batch failed to decode")
    return time.thread_time() - started


def _chunk_seconds(model: LlamaModel, batch: DecodeBatch) -> float:
    model.seq_remove(_CHUNK_SEQ)
    batch.clear()
    batch.add_span([(t * 7) % 1000 + 100 for t in range(_CHUNK)], 0, _CHUNK_SEQ,
                   logits_last=True)
    return _timed(model, batch)


def _step_seconds(model: LlamaModel, batch: DecodeBatch, sequences: int) -> float:
    """A step of one row on each of sequences 0.., which hold _PREFIX tokens (and hold
    only those again afterwards)."""
    batch.clear()
    for seq in range(sequences):
        batch.add(200 + seq, _PREFIX, seq, logits=True)
    seconds = _timed(model, batch)
    for seq in range(sequences):
        model.seq_remove(seq, _PREFIX, -1)
    return seconds


def time_files(paths: list[Path], repack: str) -> list[FileTimes] | None:
    """The shapes' times for each file (all loaded at once); None past the budget."""
    settings = ContextSettings(n_ctx=256, n_seq_max=_CHUNK_SEQ + 1, n_batch=_CHUNK,
                               n_threads=1, repack=repack)
    models: list[LlamaModel] = []
    try:
        for path in paths:
            models.append(LlamaModel(path, settings))
        batch = DecodeBatch(_CHUNK)
        for model in models:
            batch.clear()
            for seq in range(max(CLIENTS)):
                batch.add_span([100 + seq] * _PREFIX, 0, seq, logits_last=True)
            _timed(model, batch)
        best = [[float("inf")] * (1 + len(CLIENTS)) for _ in models]
        deadline = time.monotonic() + _BUDGET_SECONDS
        for _ in range(_REPEATS):
            for i, model in enumerate(models):  # alternating: noise hits every file
                shapes = [_chunk_seconds(model, batch),
                          *(_step_seconds(model, batch, n) for n in CLIENTS)]
                best[i] = [min(a, b) for a, b in zip(best[i], shapes, strict=True)]
            if time.monotonic() > deadline:
                return None
        return [FileTimes(b[0], tuple(b[1:])) for b in best]
    finally:
        for model in models:
            model.close()
