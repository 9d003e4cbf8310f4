"""Embeddings: a second llama.cpp context on a loaded model's weights, with pooled
outputs, and one worker thread that packs the inputs of every waiting request into each
`llama_decode`.

The context is created on the first embeddings request, so a model that only chats
never pays for it. Pooling is what the GGUF file declares (mean, CLS or last token);
a model that declares none (a causal chat model) is mean-pooled. A reranker (rank
pooling) gets the same context: its pooled output is the classifier's scores of each
sequence (a query-document pair), not a vector. Every batch is a single
ubatch with one KV stream: llama.cpp pools per ubatch, so a sequence split over two
would be pooled over its last part only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass

import llama_cpp as lc
import numpy as np

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.context_size import bytes_per_cell
from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.backend.runtime import recording_buffers
from edge_server.engine.errors import EngineError, EngineOverloaded

log = logging.getLogger(__name__)

POOLING_NAMES = {
    lc.LLAMA_POOLING_TYPE_MEAN: "mean",
    lc.LLAMA_POOLING_TYPE_CLS: "cls",
    lc.LLAMA_POOLING_TYPE_LAST: "last",
}
_MiB = 1 << 20


@dataclass(frozen=True)
class EmbeddingSettings:
    max_ctx: int = 2048  # tokens of one batch, and so the most one input may have
    n_seq_max: int = 16  # inputs decoded together in one batch
    # llama.cpp computes logits for every token of a pooled batch and keeps them twice
    # (compute and output buffers), 8 bytes per token per vocabulary entry: large
    # vocabularies get smaller batches to stay within this.
    output_budget_mb: int = 1024
    max_waiting: int = 256  # queued requests before 429


class EmbeddingsUnsupported(EngineError):
    """The model cannot serve the request's kind of pooled output: embeddings from a
    reranker (whose pooled output is a score), scores from an embedding model."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400, code="model_not_supported")


@dataclass(frozen=True)
class EmbeddingPlan:
    """What the embedding context will be, known before it exists (validation needs it)."""

    n_ctx: int  # tokens per batch; the most one input may have
    n_seq_max: int
    n_embd: int  # width of the vectors (a reranker's: its classifier's outputs)
    pooling: int  # asked of llama.cpp: UNSPECIFIED takes the model's declared pooling
    pooling_name: str
    bytes: int  # estimated memory of the context at its largest
    rank: bool = False  # a reranker: raw scores, not L2-normalized vectors


def _declared_pooling(model: LlamaModel) -> int | None:
    arch = model.metadata.get("general.architecture", "")
    value = model.metadata.get(f"{arch}.pooling_type")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def is_reranker(model: LlamaModel) -> bool:
    """The GGUF file declares rank pooling: a classifier scores each sequence."""
    return _declared_pooling(model) == lc.LLAMA_POOLING_TYPE_RANK


def plan_embeddings(model: LlamaModel, settings: EmbeddingSettings) -> EmbeddingPlan:
    declared = _declared_pooling(model)
    if declared == lc.LLAMA_POOLING_TYPE_RANK:
        raise EmbeddingsUnsupported(
            "this model is a reranker (rank pooling); it does not produce embeddings: "
            "use /v1/rerank")
    if declared in POOLING_NAMES:
        pooling, name = lc.LLAMA_POOLING_TYPE_UNSPECIFIED, POOLING_NAMES[declared]
    else:  # none declared (or "none"): a causal model, mean-pooled
        pooling, name = lc.LLAMA_POOLING_TYPE_MEAN, "mean"
    return _plan(model, settings, pooling, name,
                 n_out=int(lc.llama_model_n_embd_out(model.model)))


def plan_reranking(model: LlamaModel, settings: EmbeddingSettings) -> EmbeddingPlan:
    if not is_reranker(model):
        raise EmbeddingsUnsupported(
            "this model is not a reranker (its GGUF file declares no rank pooling)")
    plan = _plan(model, settings, lc.LLAMA_POOLING_TYPE_UNSPECIFIED, "rank",
                 n_out=max(1, int(lc.llama_model_n_cls_out(model.model))))
    return dataclasses.replace(plan, rank=True)


def _plan(model: LlamaModel, settings: EmbeddingSettings, pooling: int, name: str,
          n_out: int) -> EmbeddingPlan:
    n_vocab = model.vocab.n_tokens
    by_budget = settings.output_budget_mb * _MiB // (8 * max(1, n_vocab))
    n_ctx = min(settings.max_ctx, model.n_ctx_train or settings.max_ctx,
                max(512, by_budget // 256 * 256))
    n_embd = int(lc.llama_model_n_embd_out(model.model))  # of the hidden states
    n_head = max(1, int(lc.llama_model_n_head(model.model)))
    kv_cell = bytes_per_cell(model.model, model.metadata, "f16", "f16")
    # Logits (twice), f16 K and V, activations; then the attention scores of a full batch.
    per_token = 8 * n_vocab + kv_cell + 64 * n_embd
    scores = n_ctx * n_ctx * n_head * 4
    return EmbeddingPlan(
        n_ctx=n_ctx,
        n_seq_max=max(1, min(settings.n_seq_max, lc.llama_max_parallel_sequences())),
        n_embd=n_out,
        pooling=pooling,
        pooling_name=name,
        bytes=n_ctx * per_token + scores + 32 * _MiB,
    )


class EmbeddingJob:
    """One request: its inputs (token lists), and a future of their L2-normalized vectors
    in input order. Cancelling the future drops the inputs not yet decoded."""

    def __init__(self, inputs: list[list[int]]) -> None:
        self.inputs = inputs
        self.vectors: list[np.ndarray | None] = [None] * len(inputs)
        self.next = 0  # first input not yet put into a batch
        self.missing = len(inputs)
        self.future: concurrent.futures.Future[list[np.ndarray]] = concurrent.futures.Future()

    def _fail(self, error: EngineError) -> None:
        # The caller may cancel at any moment (its client left): then nobody listens.
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.future.set_exception(error)

    def _store(self, index: int, vector: np.ndarray) -> None:
        self.vectors[index] = vector
        self.missing -= 1
        if self.missing == 0:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.future.set_result(self.vectors)  # type: ignore[arg-type]


class Embedder:
    def __init__(self, model: LlamaModel, plan: EmbeddingPlan, max_waiting: int) -> None:
        self.model = model
        self.plan = plan
        self.max_waiting = max_waiting
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = plan.n_ctx
        # One ubatch per batch and one KV stream: see the module's docstring.
        cparams.n_batch = cparams.n_ubatch = plan.n_ctx
        cparams.n_seq_max = plan.n_seq_max
        cparams.kv_unified = True
        cparams.embeddings = True
        cparams.pooling_type = plan.pooling
        # One thread: llama.cpp's OpenMP keeps a team of workers per calling thread, and
        # a second team (this worker's) left idle slows every generation step after it by
        # a third. A single-threaded decode starts no team.
        cparams.n_threads = cparams.n_threads_batch = 1
        cparams.no_perf = True
        # Flash attention's CPU kernel changes precision with the batch's size (a tiled
        # F32 path from 64 tokens, F16 below), so a text's vector would depend on what it
        # was batched with. Without it, it does not, at some speed on large batches.
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        with recording_buffers() as buffers:
            ctx = lc.llama_init_from_model(model.model, cparams)
        if not ctx:
            raise EngineError("llama.cpp could not create the embedding context")
        # Its buffers as llama.cpp allocated them (the memory account). Its output buffer
        # grows later with the batches it sees, up to the plan's estimate.
        self.bytes = sum(buffers.values()) or plan.bytes
        served = {lc.LLAMA_POOLING_TYPE_RANK} if plan.rank else POOLING_NAMES.keys()
        if lc.llama_pooling_type(ctx) not in served:
            lc.llama_free(ctx)
            raise EmbeddingsUnsupported("this model's pooling gives no embedding vectors")
        self.ctx = ctx
        self.memory = lc.llama_get_memory(ctx)  # None for encoder-only models: no KV
        self.n_batch = int(lc.llama_n_batch(ctx))
        self._batch = DecodeBatch(self.n_batch)
        self._queue: collections.deque[EmbeddingJob] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.step_started: float | None = None  # watchdog, as the scheduler's
        self.counts = {"embedding_requests": 0, "embedding_inputs": 0,
                       "embedding_tokens": 0, "embedding_batches": 0,
                       "embedding_shared_batches": 0}
        self._thread = threading.Thread(target=self._run, name="edge-embed", daemon=True)
        self._thread.start()
        log.info("embedding context: %d tokens per batch, %d sequences, %s pooling",
                 self.n_batch, plan.n_seq_max, plan.pooling_name)

    # --- caller side --------------------------------------------------------------------

    def submit(self, inputs: list[list[int]]) -> EmbeddingJob:
        # Last guard before C code: what the HTTP layer missed would abort llama.cpp.
        n_vocab = self.model.vocab.n_tokens
        if not inputs:
            raise EngineError("no inputs", status=400, code="invalid_value")
        for tokens in inputs:
            if not 0 < len(tokens) <= self.n_batch:
                raise EngineError(f"an input must have 1 to {self.n_batch} tokens",
                                  status=400, code="context_length_exceeded")
            if min(tokens) < 0 or max(tokens) >= n_vocab:
                raise EngineError("a token id is outside the vocabulary", status=400,
                                  code="invalid_value")
        job = EmbeddingJob(inputs)
        with self._cond:
            if self._closed:
                raise EngineError("the model is shutting down; retry shortly")
            if len(self._queue) >= self.max_waiting:
                raise EngineOverloaded("too many embedding requests are waiting")
            self._queue.append(job)
            self.counts["embedding_requests"] += 1
            self._cond.notify()
        return job

    def stats(self) -> dict[str, int]:
        return {**self.counts, "embedding_waiting": len(self._queue)}

    def stalled_for(self) -> float:
        started = self.step_started
        return 0.0 if started is None else time.monotonic() - started

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting, self._queue = list(self._queue), collections.deque()
            self._cond.notify_all()
        for job in waiting:
            job._fail(EngineError("the model is shutting down; retry shortly"))
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            # Freeing a context a decode still runs on would crash: leak it instead.
            log.error("embedding worker did not stop; its context is left allocated")
            return
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None

    # --- worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                rows = self._take_rows()
            if not rows:
                continue
            self.step_started = time.monotonic()
            try:
                self._decode(rows)
            except Exception:  # keep serving: fail this batch's requests, not the process
                log.exception("embedding batch failed")
                for job, _ in rows:
                    job._fail(EngineError("internal engine error", status=500))
            finally:
                self.step_started = None

    def _take_rows(self) -> list[tuple[EmbeddingJob, int]]:
        """Inputs for the next batch, one per waiting request in turn (so a request of
        thousands of inputs does not hold back the ones behind it), while they fit. The
        first request always gets its next input in: every batch makes progress."""
        rows: list[tuple[EmbeddingJob, int]] = []
        tokens = 0
        progress = True
        while progress and len(rows) < self.plan.n_seq_max:
            progress = False
            for job in list(self._queue):
                if len(rows) == self.plan.n_seq_max:
                    break
                if job.future.done():  # cancelled, or failed: the rest is not wanted
                    self._queue.remove(job)
                    continue
                size = len(job.inputs[job.next])
                if tokens + size > self.n_batch:
                    continue
                rows.append((job, job.next))
                tokens += size
                job.next += 1
                progress = True
                if job.next == len(job.inputs):
                    self._queue.remove(job)
        return rows

    def _decode(self, rows: list[tuple[EmbeddingJob, int]]) -> None:
        batch = self._batch
        batch.clear()
        for seq_id, (job, index) in enumerate(rows):
            batch.add_span(job.inputs[index], 0, seq_id, logits_last=False)
        batch.want_logits[: batch.size] = 1  # pooling needs every token as an output
        # Each batch starts from empty memory: the sequence ids are reused.
        lc.llama_memory_clear(self.memory, True)
        status = batch.decode(self.ctx)
        self.counts["embedding_batches"] += 1
        self.counts["embedding_inputs"] += len(rows)
        self.counts["embedding_tokens"] += batch.size
        if len({id(job) for job, _ in rows}) > 1:
            self.counts["embedding_shared_batches"] += 1
        if status != 0:
            for job, _ in rows:
                job._fail(EngineError(f"llama_decode failed ({status})", status=500))
            return
        for seq_id, (job, index) in enumerate(rows):
            ptr = lc.llama_get_embeddings_seq(self.ctx, seq_id)
            if not ptr:
                job._fail(EngineError("llama.cpp returned no embedding", status=500))
                continue
            raw = np.ctypeslib.as_array(ptr, shape=(self.plan.n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(raw))
            if not np.isfinite(norm):
                job._fail(EngineError("the model produced a non-finite embedding",
                                      status=500))
                continue
            # L2-normalized, as OpenAI's vectors are (a zero vector stays zero); a
            # reranker's scores as its classifier gives them.
            vector = raw / norm if norm > 0 and not self.plan.rank else raw
            job._store(index, vector.astype(np.float32))
