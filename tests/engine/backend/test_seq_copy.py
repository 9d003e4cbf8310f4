"""A prefix copied from one sequence's KV stream into another's: only the cells in use
move (llama.cpp's own cross-stream copy moves every cell of the stream), and the copy
decodes exactly as the prefix evaluated in place does."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import llama_cpp as lc
import numpy as np
import pytest

from edge_server.catalogue.default_model import default_model_path
from edge_server.engine.backend import runtime
from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel

PROMPT = list(range(1000, 1300))  # 300 tokens
PREFIX = 200


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    loaded = LlamaModel(default_model_path(),
                        ContextSettings(n_ctx=2048, n_seq_max=3, n_threads=2, repack="off"))
    yield loaded
    loaded.close()


@pytest.fixture()
def llama_log() -> Iterator[list[bytes]]:
    """llama.cpp's log lines meanwhile, its debug lines included."""
    lines: list[bytes] = []

    @lc.llama_log_callback
    def record(_level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        lines.append(text)

    lc.llama_log_set(record, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        lc.llama_log_set(runtime.forward_llama_log, ctypes.c_void_p(0))


def next_logits(model: LlamaModel, seq: int, token: int, position: int) -> np.ndarray:
    batch = DecodeBatch(8)
    row = batch.add(token, position, seq, logits=True)
    assert batch.decode(model.ctx) == 0
    return model.logits_row(row).copy()


def evaluate(model: LlamaModel, seq: int, tokens: list[int]) -> None:
    batch = DecodeBatch(model.n_batch)
    batch.add_span(tokens, 0, seq, logits_last=True)
    assert batch.decode(model.ctx) == 0


def test_a_copied_prefix_moves_only_its_cells_and_decodes_as_evaluated(
        model: LlamaModel, llama_log: list[bytes]) -> None:
    for seq in range(3):
        model.seq_remove(seq)
    evaluate(model, 0, PROMPT)
    model.seq_copy_prefix(0, 1, PREFIX)
    copied = next_logits(model, 1, 7, PREFIX)
    assert lc.llama_memory_seq_pos_max(model.memory, 1) == PREFIX  # the prefix, then 7
    assert lc.llama_memory_seq_pos_max(model.memory, 0) == len(PROMPT) - 1  # untouched
    # llama.cpp's whole-stream copy (2,048 cells of 30 layers) never ran.
    assert not [line for line in llama_log if b"copying KV buffer" in line]

    evaluate(model, 2, PROMPT[:PREFIX])
    in_place = next_logits(model, 2, 7, PREFIX)
    np.testing.assert_allclose(copied, in_place, rtol=0, atol=1e-4)
