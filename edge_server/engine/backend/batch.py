"""A reusable llama_batch whose arrays are numpy buffers owned by Python.

Owning the buffers lets the scheduler fill a whole prompt chunk with one numpy slice
assignment instead of thousands of ctypes item writes.
"""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import numpy as np


class DecodeBatch:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.positions = np.zeros(capacity, dtype=np.int32)
        self.n_seq_ids = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.want_logits = np.zeros(capacity, dtype=np.int8)
        # Each token belongs to exactly one sequence: row i's seq-id list is seq_ids[i].
        self._seq_id_rows = (ctypes.POINTER(lc.llama_seq_id) * capacity)()
        base = self.seq_ids.ctypes.data
        for i in range(capacity):
            self._seq_id_rows[i] = ctypes.cast(base + 4 * i, ctypes.POINTER(lc.llama_seq_id))
        self.struct = lc.llama_batch()
        self.struct.token = self.tokens.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        self.struct.embd = None
        self.struct.pos = self.positions.ctypes.data_as(ctypes.POINTER(lc.llama_pos))
        self.struct.n_seq_id = self.n_seq_ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_id_rows
        self.struct.logits = self.want_logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.size = 0

    @property
    def free(self) -> int:
        return self.capacity - self.size

    def clear(self) -> None:
        self.size = 0

    def add(self, token: int, position: int, seq_id: int, *, logits: bool) -> int:
        """Append one token; returns its row, the index its logits are read back with."""
        i = self.size
        self.tokens[i] = token
        self.positions[i] = position
        self.seq_ids[i] = seq_id
        self.want_logits[i] = logits
        self.size = i + 1
        return i

    def add_span(
        self, tokens: list[int], first_position: int, seq_id: int, *, logits_last: bool
    ) -> int:
        """Append consecutive tokens of one sequence; returns the row of the last one."""
        start, end = self.size, self.size + len(tokens)
        self.tokens[start:end] = tokens
        self.positions[start:end] = np.arange(first_position, first_position + len(tokens))
        self.seq_ids[start:end] = seq_id
        self.want_logits[start:end] = 0
        if logits_last:
            self.want_logits[end - 1] = 1
        self.size = end
        return end - 1

    def output_rows(self) -> int:
        """Rows that ask for logits."""
        return int(np.count_nonzero(self.want_logits[:self.size]))

    def rows_per_sequence(self) -> dict[int, int]:
        """How many rows of the batch each sequence has."""
        seqs, counts = np.unique(self.seq_ids[: self.size], return_counts=True)
        return {int(s): int(c) for s, c in zip(seqs, counts, strict=True)}

    def decode(self, ctx: lc.llama_context_p) -> int:
        """Run llama_decode over the batch: 0 ok, 1 no room in the KV cache, <0 error."""
        self.struct.n_tokens = self.size
        return int(lc.llama_decode(ctx, self.struct))


def decode_embeddings(ctx: lc.llama_context_p, embd: np.ndarray, first_position: int,
                      seq_id: int, n_batch: int) -> int:
    """llama_decode over rows of input embeddings (an image's tokens) of one sequence,
    `n_batch` rows per call; returns 0 or llama_decode's first non-zero status."""
    n_rows = embd.shape[0]
    embd = np.ascontiguousarray(embd, dtype=np.float32)
    positions = np.arange(first_position, first_position + n_rows, dtype=np.int32)
    n_seq_ids = np.ones(n_rows, dtype=np.int32)
    seq_ids = np.full(n_rows, seq_id, dtype=np.int32)
    want_logits = np.zeros(n_rows, dtype=np.int8)
    rows = (ctypes.POINTER(lc.llama_seq_id) * n_rows)()
    base = seq_ids.ctypes.data
    for i in range(n_rows):
        rows[i] = ctypes.cast(base + 4 * i, ctypes.POINTER(lc.llama_seq_id))
    for start in range(0, n_rows, n_batch):
        count = min(n_batch, n_rows - start)
        batch = lc.llama_batch()
        batch.n_tokens = count
        batch.token = None
        batch.embd = ctypes.cast(embd.ctypes.data + 4 * embd.shape[1] * start,
                                 ctypes.POINTER(ctypes.c_float))
        batch.pos = ctypes.cast(positions.ctypes.data + 4 * start, ctypes.POINTER(lc.llama_pos))
        batch.n_seq_id = ctypes.cast(n_seq_ids.ctypes.data + 4 * start,
                                     ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(ctypes.addressof(rows) + ctypes.sizeof(rows[0]) * start,
                                   ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id)))
        batch.logits = ctypes.cast(want_logits.ctypes.data + start,
                                   ctypes.POINTER(ctypes.c_int8))
        status = int(lc.llama_decode(ctx, batch))
        if status != 0:
            return status
    return 0
