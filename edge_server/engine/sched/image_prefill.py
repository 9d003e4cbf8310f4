"""Images inside the step loop: where a prompt's text chunks must stop, and the decode
of one image's embeddings into its sequence.

Text chunks of a prompt go into the step's shared token batch; an image goes through
a llama_decode of its own (a batch of embeddings cannot hold tokens), one image per step
so that the other sequences get their next token between images.
"""

from __future__ import annotations

from edge_server.engine.backend.batch import decode_embeddings
from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.errors import EngineError
from edge_server.engine.kv.slots import SlotTable
from edge_server.engine.multimodal.projector import Projector
from edge_server.engine.request import GenerationRequest, ImageSpan
from edge_server.engine.sched.jobs import Job


def image_at(request: GenerationRequest, position: int) -> ImageSpan | None:
    """The image whose tokens include prompt position `position`, if any."""
    for span in request.images:
        if span.start <= position < span.end:
            return span
    return None


def text_end(request: GenerationRequest, start: int, end: int) -> int:
    """Where a text chunk from `start` must stop: `end`, or the next image before it."""
    for span in request.images:
        if start <= span.start < end:
            return span.start
    return end


def decode_image(model: LlamaModel, projector: Projector, span: ImageSpan,
                 seq_id: int, partition: str = "") -> EngineError | None:
    """Encodes the image (or takes its recent encoding for `partition`) and decodes its
    embeddings at positions span.start.. of `seq_id`; an EngineError says why it failed."""
    chunk = span.chunk
    non_causal = projector.non_causal(chunk)
    if non_causal and chunk.n_tokens > model.n_batch:
        return EngineError(f"an image of {chunk.n_tokens} tokens needs a batch of that "
                           f"size; this model's batch is {model.n_batch}", status=400,
                           code="image_too_large")
    embd = projector.encode(chunk, partition)
    if embd is None:
        return EngineError("the image could not be encoded", status=400, code="invalid_image")
    if non_causal:
        projector.set_causal(model, False)
    try:
        status = decode_embeddings(model.ctx, embd, span.start, seq_id, model.n_batch)
    finally:
        if non_causal:
            projector.set_causal(model, True)
    if status != 0:
        return EngineError(f"llama_decode failed on an image ({status})")
    return None


def decode_next_image(jobs: list[Job], model: LlamaModel, projector: Projector | None,
                      kv: SlotTable) -> tuple[Job, EngineError] | None:
    """Decodes the first image a prefilling job has reached: one per step, so other
    sequences keep getting tokens while a long prompt's images are encoded. Returns the
    job and its error when the image could not be decoded (the caller aborts it)."""
    for job in jobs:
        if not job.prefilling or job.wait_for is not None or not job.request.images:
            continue
        span = image_at(job.request, job.prefill_at)
        if span is None:
            continue
        if span.start < job.prefill_at:  # never expected: restart the image whole
            kv.trim(job.slot, span.start)
            job.prefill_at = len(job.slot.cached)
            continue
        assert projector is not None
        error = decode_image(model, projector, span, job.slot.seq_id,
                             job.request.partition)
        kv.decoded({job.slot.seq_id: 0})  # no rollback into an image
        if error is not None:
            return job, error
        job.slot.cached.extend(span.chunk.placeholders)
        job.prefill_at = span.end
        return None
    return None
