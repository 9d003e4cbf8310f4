"""The graph runs llama.cpp cuts a batch into (llama_batch_allocr::split_equal, in
llama.cpp's src/llama-batch.cpp), as the step planner predicts them, and the row order
that keeps a burst's prompt chunks in one run."""

from __future__ import annotations

from edge_server.engine.backend.ubatch_split import small_rows, ubatch_shapes

# A burst: sequence 0 has its first token to decode, 1-7 their prompts (52-60 tokens).
_PROMPTS = [(1, 53), (2, 56), (3, 53), (4, 55), (5, 60), (6, 52), (7, 54)]


def test_ascending_rows_cut_the_prompts_to_one_row_first() -> None:
    shapes = ubatch_shapes([(0, 1), *_PROMPTS], 512)
    assert shapes[:2] == [(8, 1), (7, 51)]
    assert sum(n * rows for n, rows in shapes) == 1 + sum(r for _, r in _PROMPTS)


def test_chunks_first_run_as_one_graph_and_the_token_alone() -> None:
    shapes = ubatch_shapes([*_PROMPTS, (0, 1)], 512)
    assert shapes[0] == (7, 52)
    assert (1, 1) in shapes
    ascending = ubatch_shapes([(0, 1), *_PROMPTS], 512)
    assert small_rows(shapes) < small_rows(ascending)


def test_only_consecutive_ids_share_a_run() -> None:
    # Decoding 0, 1 and 3 with a prompt on 2: chunks first would split the tokens.
    assert ubatch_shapes([(0, 1), (1, 1), (2, 40), (3, 1)], 512) == [(4, 1), (1, 39)]
    assert len(ubatch_shapes([(2, 40), (0, 1), (1, 1), (3, 1)], 512)) == 3
    # Out of order, a decode step of 8 takes two runs (see step_batch.py).
    assert ubatch_shapes([(s, 1) for s in (4, 5, 6, 7, 0, 1, 2, 3)], 512) == [(4, 1)] * 2


def test_a_run_holds_at_most_n_ubatch_rows() -> None:
    assert ubatch_shapes([(0, 300), (1, 300)], 512) == [(2, 256), (2, 44)]
