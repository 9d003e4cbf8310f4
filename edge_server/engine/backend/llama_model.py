"""One GGUF model loaded into one llama.cpp context (its vocabulary: vocab.py).

Everything that touches llama.cpp's model, vocabulary or context objects directly lives
here or in `batch.py` / `sampling.py`; the scheduler only calls these wrappers.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import llama_cpp as lc
import numpy as np

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.context_settings import (
    KV_CACHE_TYPES,
    ContextSettings,
    ModelLoadError,
    kv_flash_attn,
)
from edge_server.engine.backend.context_size import bytes_per_cell, request_context
from edge_server.engine.backend.cpu.cpu_kernels import PLAIN, placement
from edge_server.engine.backend.cpu.cpu_probe import kernel_path
from edge_server.engine.backend.memory_kind import MemoryKind, memory_kind
from edge_server.engine.backend.rpc import rpc_guard
from edge_server.engine.backend.rpc.rpc_devices import (
    DeviceList,
    Endpoint,
    RpcError,
    local_accelerators,
)
from edge_server.engine.backend.runtime import init_backend, log_buffer_sizes, recording_buffers
from edge_server.engine.backend.vocab import Vocab

log = logging.getLogger(__name__)

# The settings are defined beside their checks (context_settings.py); callers import them
# with the model they configure.
__all__ = ["KV_CACHE_TYPES", "ContextSettings", "LlamaModel", "ModelLoadError", "default_threads"]


def _has_gpu() -> bool:
    """A local GPU llama.cpp would offload to (unknown: assume one where it could)."""
    try:
        return bool(local_accelerators())
    except (OSError, AttributeError):
        return bool(lc.llama_supports_gpu_offload())


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


class LlamaModel:
    """A GGUF file loaded with one context; each sequence has a KV stream of its own of
    the context one request may use, so decoding a token attends over its own sequence
    only, however many are busy. Every stream is resident from load, used or not."""

    def __init__(self, path: Path, settings: ContextSettings) -> None:
        init_backend()
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        self.path = path
        mparams = lc.llama_model_default_params()
        if settings.n_gpu_layers >= 0:
            mparams.n_gpu_layers = settings.n_gpu_layers
        else:
            mparams.n_gpu_layers = 999
        self.rpc = settings.rpc
        # Every layer on this machine's CPU: what lookup drafting's default depends on.
        self.cpu_only = not settings.rpc and (settings.n_gpu_layers == 0 or not _has_gpu())
        system_info = lc.llama_print_system_info().decode(errors="replace")
        kernels = kernel_path(path, settings.repack, system_info)
        weights_at = placement(kernels, path, system_info, cpu_only=self.cpu_only)
        weights_at.apply(mparams)
        self._devices = self._rpc_devices(settings.rpc)
        if self._devices is not None:
            mparams.devices = self._devices.address
        with recording_buffers() as buffers:
            model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            rpc_guard.unwatch(settings.rpc)
            raise ModelLoadError(f"llama.cpp could not load {path.name}")
        self.model = model
        # The path the weights took: `plain` where none landed in a repacked layout.
        self.cpu_kernels = kernels if buffers.get("repacked") else PLAIN
        self.repacked_bytes = buffers.get("repacked", 0)
        log.info("%s: cpu_kernels=%s, %.1f MiB of weights repacked", path.name,
                 self.cpu_kernels, self.repacked_bytes / 2**20)
        self.vocab = Vocab(lc.llama_model_get_vocab(model))
        self.n_ctx_train: int = lc.llama_model_n_ctx_train(model)
        self.metadata = self._read_metadata()
        # What a cut, a copy and a draft may do here (made exact below, with the context).
        self.memory_kind: MemoryKind = memory_kind(model, self.metadata)

        n_seq = max(1, min(settings.n_seq_max, lc.llama_max_parallel_sequences()))
        n_ctx = request_context(
            settings.n_ctx, self.n_ctx_train,
            bytes_per_cell(model, self.metadata, settings.cache_type_k, settings.cache_type_v)
            if settings.cache_type_k in KV_CACHE_TYPES and settings.cache_type_v in KV_CACHE_TYPES
            else 1,
            settings.kv_budget_bytes, n_seq)
        threads = settings.n_threads or default_threads()
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx * n_seq  # llama.cpp gives each stream n_ctx / n_seq_max
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = n_seq
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # A stream per sequence, not llama-server's one unified buffer: with that, every
        # token attends over all sequences' cells (masked out, but computed), and the
        # CPU attention kernels' rounding follows where a sequence's cells happen to lie,
        # so the same seeded request gave other text from one run to the next. llama.cpp
        # clears every stream as it makes them: all are resident from here on, which is
        # why the default context is sized to a share of the budget (context_size.py).
        cparams.kv_unified = False
        try:
            cparams.flash_attn_type = kv_flash_attn(settings)
        except ModelLoadError:
            rpc_guard.unwatch(settings.rpc)
            lc.llama_model_free(model)
            raise
        cparams.type_k = KV_CACHE_TYPES[settings.cache_type_k]
        cparams.type_v = KV_CACHE_TYPES[settings.cache_type_v]
        cparams.no_perf = True
        cparams.n_rs_seq = settings.rollback if self.memory_kind.can_roll_back else 0
        # Sliding-window layers keep their window (and a ubatch) of cells per stream, not
        # the whole context (llama.cpp's default): Gemma 3 270M's 8 streams of 32,768
        # cells were 4.5 GiB. Cells that left the window are dropped as tokens come, which
        # the slot table checks before it reuses a prefix (kv/slots.py, window_floor).
        cparams.swa_full = False
        with recording_buffers() as context_buffers:
            ctx = lc.llama_init_from_model(model, cparams)
        # Bytes of weights (of which the mapped file), KV cache and compute buffers, as
        # llama.cpp allocated them: the memory account and the model pool's budget.
        self.buffer_bytes: dict[str, int] = {**buffers, **context_buffers}
        if not ctx:
            rpc_guard.unwatch(settings.rpc)
            lc.llama_model_free(model)
            raise ModelLoadError(
                f"llama.cpp could not create a context for {path.name} (KV cache types "
                f"{settings.cache_type_k}/{settings.cache_type_v}: a backend may lack them)")
        self.ctx = ctx
        self.memory = lc.llama_get_memory(ctx)
        self.memory_kind = self.memory_kind.with_rollback(lc.llama_n_rs_seq(ctx))
        self.n_ctx: int = lc.llama_n_ctx(ctx)
        self.n_batch: int = lc.llama_n_batch(ctx)
        self.n_embd: int = lc.llama_model_n_embd_inp(model)  # width of input embeddings
        self.n_seq_max: int = lc.llama_n_seq_max(ctx)
        self.n_ctx_seq: int = lc.llama_n_ctx_seq(ctx)  # cells of one sequence's stream
        # llama.cpp's output buffer holds this many rows of logits (at least one a
        # sequence); it grows with the most one decode asks for, and stays (decode).
        self._output_rows = self.n_seq_max
        # What saved sequence states depend on besides the model file.
        self.kv_layout = f"{cparams.type_k}/{cparams.type_v}/{cparams.flash_attn_type}"
        self.cache_types = (settings.cache_type_k, settings.cache_type_v)
        self.flash_attn = cparams.flash_attn_type == lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.n_threads = threads  # the most any step uses
        self._threads_now = threads
        self.description = self._describe()
        log.info(
            "loaded %s: n_ctx=%d (%d per sequence) n_seq_max=%d threads=%d memory=%s "
            "(cuts %s)",
            path.name,
            self.n_ctx,
            self.n_ctx_seq,
            self.n_seq_max,
            threads,
            self.memory_kind.kind,
            self.memory_kind.cuts(),
        )

    @staticmethod
    def _rpc_devices(endpoints: tuple[Endpoint, ...]) -> DeviceList | None:
        """RPC servers plus local GPUs as the model's devices; their connections are
        watched from here on (rpc_guard)."""
        if not endpoints:
            return None
        if rpc_guard.failure():
            raise ModelLoadError(f"RPC split broken: {rpc_guard.failure()}; restart the service")
        try:
            devices = DeviceList(endpoints)
        except RpcError as exc:
            raise ModelLoadError(str(exc)) from exc
        log_buffer_sizes()
        rpc_guard.watch(endpoints)
        return devices

    def _read_metadata(self) -> dict[str, str]:
        meta: dict[str, str] = {}
        buf = ctypes.create_string_buffer(1 << 20)
        for i in range(lc.llama_model_meta_count(self.model)):
            n = lc.llama_model_meta_key_by_index(self.model, i, buf, len(buf))
            if n < 0:
                continue
            key = buf.value.decode("utf-8", errors="replace")
            n = lc.llama_model_meta_val_str_by_index(self.model, i, buf, len(buf))
            if n < 0:
                continue
            meta[key] = buf.value.decode("utf-8", errors="replace")
        return meta

    def _describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    # --- KV cache per sequence -------------------------------------------------------

    def set_threads(self, threads: int) -> None:
        """Threads of the next decode steps (cheap: llama.cpp reads it per step)."""
        if threads != self._threads_now:
            lc.llama_set_n_threads(self.ctx, threads, threads)
            self._threads_now = threads

    def seq_remove(self, seq_id: int, start: int = -1, end: int = -1) -> bool:
        """False where the memory cannot remove that range (memory_kind.py): the stream
        is then as it was."""
        return bool(lc.llama_memory_seq_rm(self.memory, seq_id, start, end))

    def seq_clear(self, seq_id: int) -> None:
        """Empties a sequence (any kind of memory allows it)."""
        if not lc.llama_memory_seq_rm(self.memory, seq_id, -1, -1):
            raise RuntimeError(f"llama.cpp could not clear sequence {seq_id}")

    def seq_copy_prefix(self, src: int, dst: int, length: int) -> bool:
        """dst holds src's first `length` tokens afterwards; where the trim is refused (a
        recurrent state), dst is left empty and False. Across streams llama.cpp's own copy
        (llama_memory_seq_cp) moves whole stream buffers, every cell of every layer whether
        used or not (a partial range aborts the process): 189 MiB a copy on SmolLM2's
        8,192-cell streams, for a 1,000-token prefix of 23 MiB. Where src uses under half
        its stream, its cells are serialised and read into dst instead (two copies of what
        is used against one of everything), then dst is trimmed. A sliding window's
        serialised state leaves out the cells before src's window, which a copy cut short
        of src's end still needs: there the whole buffers are copied."""
        used = lc.llama_memory_seq_pos_max(self.memory, src) + 1
        window = self.memory_kind.n_swa
        whole_window = not window or used <= window or length >= used - 1
        if used > 0 and 2 * used < self.n_ctx_seq and whole_window:
            size = lc.llama_state_seq_get_size(self.ctx, src)
            buf = (ctypes.c_uint8 * size)()
            written = lc.llama_state_seq_get_data(self.ctx, buf, size, src)
            self.seq_clear(dst)
            if written and lc.llama_state_seq_set_data(self.ctx, buf, written, dst) == written:
                if lc.llama_memory_seq_rm(self.memory, dst, length, -1):
                    return True
                self.seq_clear(dst)
                return False
            self.seq_clear(dst)  # half-read: the whole copy below
        lc.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
        if lc.llama_memory_seq_rm(self.memory, dst, length, -1):
            return True
        self.seq_clear(dst)
        return False

    def seq_checkpoint(self, seq_id: int) -> bytes:
        """The recurrent part of one sequence's state (kv/checkpoints.py)."""
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = lc.llama_state_seq_get_size_ext(self.ctx, seq_id, flags)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data_ext(self.ctx, buf, size, seq_id, flags)
        return ctypes.string_at(buf, written)

    def seq_restore_checkpoint(self, seq_id: int, data: bytes, length: int) -> bool:
        """Sets seq_id's recurrent part back to a checkpoint of its first `length` tokens
        and removes its attention cells past them; False where llama.cpp refused either
        or the sequence does not end there afterwards (the caller clears it)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        return (lc.llama_state_seq_set_data_ext(self.ctx, buf, len(data), seq_id, flags)
                == len(data)
                and bool(lc.llama_memory_seq_rm(self.memory, seq_id, length, -1))
                and lc.llama_memory_seq_pos_max(self.memory, seq_id) == length - 1)

    def seq_first_position(self, seq_id: int) -> int:
        """The lowest position whose cell the sequence holds (-1: none). On a sliding
        window, cells before it may have been left out (see memory_kind.py)."""
        return int(lc.llama_memory_seq_pos_min(self.memory, seq_id))

    def seq_state(self, seq_id: int) -> bytes:
        """The KV cells of one sequence, as llama.cpp serialises them."""
        size = lc.llama_state_seq_get_size(self.ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self.ctx, buf, size, seq_id)
        # One copy: slicing a ctypes array would build a list of one int per byte.
        return ctypes.string_at(buf, written)

    def seq_restore(self, seq_id: int, data: bytes, length: int) -> bool:
        """Loads a saved sequence into seq_id, keeping its first `length` tokens; False,
        and the sequence empty, where it did not load or could not be cut there."""
        self.seq_clear(seq_id)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if (lc.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id) != len(data)
                or not lc.llama_memory_seq_rm(self.memory, seq_id, length, -1)):
            self.seq_clear(seq_id)
            return False
        return True

    def decode(self, batch: DecodeBatch) -> int:
        """llama_decode of the batch: 0 ok, 1 no room in the KV cache, <0 error. A batch
        asking for more rows of logits than any before grows llama.cpp's output buffer
        (a vocabulary of floats a row): counted with the compute buffers."""
        rows = batch.output_rows()
        if rows > self._output_rows:
            grown = (rows - self._output_rows) * self.vocab.n_tokens * ctypes.sizeof(
                ctypes.c_float)
            self.buffer_bytes["compute"] = self.buffer_bytes.get("compute", 0) + grown
            self._output_rows = rows
        return batch.decode(self.ctx)

    def held_bytes(self) -> int:
        """Weights, KV cache and compute buffers, as llama.cpp allocated them."""
        return sum(self.buffer_bytes.get(k, 0) for k in ("weights", "kv_cache", "compute"))

    def logits_row(self, batch_index: int) -> np.ndarray:
        """The logits of one output row of the last decode, as a numpy view (no copy)."""
        ptr = lc.llama_get_logits_ith(self.ctx, batch_index)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab.n_tokens,))

    def logits_rows(self, first_batch_index: int, count: int) -> np.ndarray:
        """Logits of `count` consecutive batch rows that all asked for logits: llama.cpp
        stores their outputs next to each other, so this is one (count, vocab) view."""
        ptr = lc.llama_get_logits_ith(self.ctx, first_batch_index)
        return np.ctypeslib.as_array(ptr, shape=(count, self.vocab.n_tokens))

    def close(self) -> None:
        if getattr(self, "rpc", ()) and rpc_guard.failure():
            # Freeing would talk to the lost server and park this thread: leave the
            # memory to the process exit.
            log.warning("%s: not freed, its RPC split is broken", self.path.name)
            self.ctx = self.model = None
            return
        # llama.cpp may close the connections from here on.
        rpc_guard.unwatch(getattr(self, "rpc", ()))
        self.rpc = ()
        if getattr(self, "ctx", None):
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            lc.llama_model_free(self.model)
            self.model = None
