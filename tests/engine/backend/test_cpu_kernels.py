"""Repacked CPU kernels: which weights CPU_REPACK takes, a model loaded on the path the
probe found safe (AVX repacked layouts without AMX where only AMX faults) computing what
the plain kernels compute, and the verdict cached per model."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp as lc
import numpy as np
import pytest

from edge_server.catalogue.default_model import default_model_path
from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.cpu import cpu_probe
from edge_server.engine.backend.cpu.cpu_kernels import (
    AMX_REPACK,
    PATHS,
    PLAIN,
    REPACK,
    extra_buffer_types,
    patterns,
    placement,
    repackable,
)
from edge_server.engine.backend.cpu.cpu_probe import kernel_path
from edge_server.engine.backend.gguf_tensors import TensorInfo, read_tensors
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
from edge_server.engine.backend.runtime import init_backend

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
Q4_0, Q4_K, Q6_K = 2, 12, 14


def system_info() -> str:
    init_backend()
    return lc.llama_print_system_info().decode(errors="replace")


@pytest.fixture(scope="module")
def q4_0_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model requantized to Q4_0, a type CPU_REPACK has x86 kernels for."""
    init_backend()
    out = tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf"
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 2
    code = lc.llama_model_quantize(str(default_model_path()).encode(), str(out).encode(),
                                  ctypes.byref(params))
    assert code == 0
    return out


def test_the_projections_are_named_and_the_embeddings_are_not(q4_0_model: Path) -> None:
    tensors = read_tensors(q4_0_model)
    assert len(tensors) == 272  # SmolLM2: 30 layers of 9 tensors, the embeddings, a norm
    names = repackable(tensors, system_info())
    if "AVX2 = 1" not in system_info():
        assert names == []  # no x86 kernel to repack for
        return
    assert len(names) == 30 * len(PROJECTIONS)
    assert "token_embd.weight" not in names  # read by GET_ROWS, and the tied head
    assert patterns(names, tensors) == [rf"^blk\.\d+\.{kind}\.weight$"
                                        for kind in sorted(PROJECTIONS)]


def test_layers_of_a_kind_that_differ_in_type_are_listed() -> None:
    """Q4_K_M files keep some layers' ffn_down in Q6_K, which CPU_REPACK leaves alone."""
    tensors = [TensorInfo(f"blk.{i}.ffn_down.weight", Q4_K if i % 2 else Q6_K, (2048, 640))
               for i in range(4)]
    tensors += [TensorInfo(f"blk.{i}.attn_output.weight", Q4_K, (1024, 640)) for i in range(4)]
    tensors.append(TensorInfo("blk.0.attn_k.weight", Q4_K, (640, 100)))  # rows not 8-aligned
    names = repackable(tensors, "AVX2 = 1 | AVX512 = 1")
    assert sorted(names) == ["blk.0.attn_output.weight", "blk.1.attn_output.weight",
                             "blk.1.ffn_down.weight", "blk.2.attn_output.weight",
                             "blk.3.attn_output.weight", "blk.3.ffn_down.weight"]
    assert patterns(names, tensors) == [r"^blk\.\d+\.attn_output\.weight$",
                                        r"^blk\.(1|3)\.ffn_down\.weight$"]


def last_logits(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    batch = DecodeBatch(model.n_batch)
    row = batch.add_span(tokens, 0, 0, logits_last=True)
    assert batch.decode(model.ctx) == 0
    return model.logits_row(row).copy()


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = np.exp(p_logits - p_logits.max())
    q = np.exp(q_logits - q_logits.max())
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30))))


def test_repacked_weights_compute_what_plain_kernels_compute(q4_0_model: Path) -> None:
    """The path the probe finds safe here (amx+repack where AMX works, repack where only
    AMX faults or the CPU has none) puts the projections in a repacked layout, and a
    prompt's next-token logits agree with the plain kernels'."""
    settings = dict(n_ctx=256, n_seq_max=1, n_threads=2, n_batch=64)
    plain = LlamaModel(q4_0_model, ContextSettings(repack="off", **settings))  # type: ignore[arg-type]
    try:
        assert plain.cpu_kernels == PLAIN and plain.repacked_bytes == 0
        tokens = plain.vocab.tokenize("The capital of France is", add_special=True,
                                      parse_special=False)
        expected = last_logits(plain, tokens)
    finally:
        plain.close()
    if "AVX2 = 1" not in system_info():
        pytest.skip("no x86 repacked kernels on this CPU")
    repacked = LlamaModel(q4_0_model, ContextSettings(repack="auto", **settings))  # type: ignore[arg-type]
    try:
        assert repacked.cpu_kernels in (AMX_REPACK, REPACK)
        assert repacked.repacked_bytes > 30 * 2**20  # the projections: ~40 MiB of Q4_0
        got = last_logits(repacked, tokens)
    finally:
        repacked.close()
    assert int(np.argmax(got)) == int(np.argmax(expected))
    # Not bit for bit: the repacked GEMM sums in another order. Measured here: a KL
    # divergence of 0.004-0.014 (Q4_0) and 0.005-0.010 (Gemma 3's Q4_K_M), against
    # 0.25-2.9 between this Q4_0 file and the Q8_0 one.
    assert kl_divergence(expected, got) < 0.05


def test_repack_without_amx_names_the_weights_only_where_amx_is_there(
        q4_0_model: Path) -> None:
    where = placement(REPACK, q4_0_model, system_info(), cpu_only=True)
    if "AMX" in extra_buffer_types():
        assert not where.use_extra_bufts and where.named == 30 * len(PROJECTIONS)
    else:  # llama.cpp's own choice is CPU_REPACK already
        assert where.use_extra_bufts and where.overrides is None
    # Layers on a GPU must not be pinned to the CPU by the names: plain instead.
    assert not placement(REPACK, q4_0_model, system_info(), cpu_only=False).overrides


def test_the_verdict_is_cached_per_model(q4_0_model: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_probe, "_verdicts", {})  # this process's memo of verdicts
    info = system_info()
    verdict = kernel_path(q4_0_model, "auto", info)
    assert verdict in PATHS and verdict != PLAIN  # Q4_0 has repacked kernels on x86 and ARM
    if "AMX" in info:  # probed in a child process, the verdict written down
        cached = json.loads((tmp_path / "edge-server" / "cpu-probe.json").read_text())
        assert list(cached.values()) == [verdict]
    assert kernel_path(q4_0_model, "off", info) == PLAIN
