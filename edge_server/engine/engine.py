"""A served model: its llama.cpp context, scheduler and chat template, behind one object."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc

from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel, ModelLoadError
from edge_server.engine.backend.lora import LoraAdapters, LoraSpec
from edge_server.engine.backend.measure.step_cost import cost_file
from edge_server.engine.backend.rpc import rpc_guard
from edge_server.engine.chat_template import CHATML_TEMPLATE, ChatTemplate, RenderedChat
from edge_server.engine.embeddings.embedder import (
    Embedder,
    EmbeddingPlan,
    EmbeddingSettings,
    is_reranker,
    plan_embeddings,
    plan_reranking,
)
from edge_server.engine.embeddings.rerank import PairLayout
from edge_server.engine.errors import EngineError
from edge_server.engine.kv.prompt_store import PromptStore, StoredPrefix, load_entries, save_entries
from edge_server.engine.multimodal.audio import AudioLimits
from edge_server.engine.multimodal.projector import ImageLimits, Media, Projector, RgbImage
from edge_server.engine.multimodal.projector_check import ProjectorError
from edge_server.engine.prompt_tokens import PromptTokens, chat_text_tokens
from edge_server.engine.request import GenerationRequest, RequestHandle
from edge_server.engine.request_choices import resolve_choices
from edge_server.engine.sched.model_draft import DraftModel
from edge_server.engine.sched.scheduler import STOP_TIMEOUT, Scheduler
from edge_server.engine.sched.settings import SchedulerSettings
from edge_server.engine.sched.slot_view import SlotView, engine_counts, slot_views

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSettings:
    context: ContextSettings = field(default_factory=ContextSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    chat_template: str | None = None  # overrides the GGUF file's template
    prompt_cache_dir: Path | None = None  # where prompt caches outlive the process
    prompt_cache_mb: int = 256  # host RAM (and disk) for prefixes evicted from the KV cache
    embeddings: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    mmproj: Path | None = None  # multimodal projector: the model then reads images
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    audio_limits: AudioLimits = field(default_factory=AudioLimits)
    # A prompt that outgrows the context: "disabled" (refused) or "auto" (cut to fit by
    # the API layer, api/common/bounds/truncation.py); requests may choose otherwise.
    truncation: str = "disabled"
    # An answer whose request set no bound: at most this many tokens (-1: the room the
    # context leaves) and seconds after it arrived (0: no ceiling); api/common applies them.
    default_max_tokens: int = -1
    max_answer_seconds: float = 0.0
    lora: tuple[LoraSpec, ...] = ()  # LoRA adapters loaded with the model (backend/lora.py)
    draft_model: Path | None = None  # a small model of its vocabulary that drafts tokens
    draft_cost_share: float | None = None  # its decode's cost per the model's (None: bytes)


def _rpc_error(reason: str) -> EngineError:
    return EngineError(f"the model's RPC server is unavailable: {reason}", status=503,
                       code="rpc_unavailable")


class Engine:
    def __init__(self, model_id: str, path: Path, settings: EngineSettings) -> None:
        self.model_id = model_id
        self.path = path
        self.settings = settings
        # The embedding context: created by the first embeddings request, under the lock.
        self._embedder: Embedder | None = None
        self._embedder_lock = threading.Lock()
        self._closed = False
        self.model = LlamaModel(path, settings.context)
        try:
            self._set_up(settings)
        except BaseException:
            # A broken template (or anything else) must not leak the loaded weights.
            self.model.close()
            raise

    def _set_up(self, settings: EngineSettings) -> None:
        self.vocab = self.model.vocab
        # A reranker's weights only score pairs (its pooled output); it generates nothing.
        self.is_reranker = is_reranker(self.model)
        self._pair_layout: PairLayout | None = None
        template = settings.chat_template or self.model.chat_template
        if template is None:
            log.warning("%s has no chat template; using ChatML", self.path.name)
            template = CHATML_TEMPLATE
        controls = self.vocab.control_texts
        self.chat_template = ChatTemplate(
            template,
            bos_token=self.vocab.token_text(self.vocab.bos) if self.vocab.bos >= 0 else "",
            eos_token=self.vocab.token_text(self.vocab.eos) if self.vocab.eos >= 0 else "",
            control_texts=controls,
        )
        # The most bytes one token can stand for: bounds the text that can fit n_ctx.
        self.max_token_bytes = max(
            [len(p) for p in self.vocab.pieces] + [len(t.encode()) for t in controls] + [1]
        )
        self.fingerprint = self._fingerprint()
        store = PromptStore(settings.prompt_cache_mb * 1024 * 1024,
                            recurrent=self.model.memory_kind.recurrent)
        for entry in self._saved_prompts():
            store.put(entry)
        self.projector: Projector | None = None
        if settings.mmproj is not None:
            try:
                self.projector = Projector(settings.mmproj, self.model,
                                           use_gpu=settings.context.n_gpu_layers != 0
                                           and bool(lc.llama_supports_gpu_offload()))
            except ProjectorError as exc:
                raise ModelLoadError(f"multimodal projector {settings.mmproj.name}: {exc}"
                                     ) from exc
        # The projector's weights (its file: mtmd reads it into buffers of that size).
        self._projector_bytes = (settings.mmproj.stat().st_size
                                 if settings.mmproj is not None and self.projector else 0)
        self.lora = LoraAdapters(self.model.model, settings.lora)
        self.drafter = (DraftModel(settings.draft_model, self.model, settings.context,
                                   settings.draft_cost_share)
                        if settings.draft_model is not None else None)
        try:
            self.scheduler = Scheduler(self.model, settings.scheduler, store, self.projector,
                                       step_cost_file=self._step_cost_file(), lora=self.lora,
                                       drafter=self.drafter,
                                       draft_cost_file=self._draft_cost_file())
            self.scheduler.start()
        except BaseException:
            if self.drafter is not None:
                self.drafter.close()
            raise
        if self.model.rpc:
            rpc_guard.add_listener(self._on_rpc_lost)

    @property
    def modalities(self) -> tuple[str, ...]:
        """What the model reads besides text: ("image",), ("image", "audio") or ()."""
        return self.projector.modalities if self.projector is not None else ()

    @property
    def n_slots(self) -> int:
        """Requests (choices) generated at once; the rest wait."""
        return self.scheduler.n_slots

    def slots(self) -> list[SlotView]:
        """What each slot is doing now (GET /slots)."""
        return slot_views(self.scheduler)

    @property
    def n_ctx(self) -> int:
        """Tokens one request may use: prompt plus completion, in its own KV stream."""
        return self.model.n_ctx_seq

    def memory_info(self) -> dict[str, object]:
        """The model's kind of memory, what it allows, and whether drafting is on."""
        return {**self.model.memory_kind.describe(),
                "drafting": self.scheduler.draft_max > 0,
                "draft_max": self.scheduler.draft_max,
                # False where the step cost was not measured: only forced drafts then.
                "drafts_by_cost": self.scheduler.drafts_by_cost}

    @property
    def cpu_kernels(self) -> str:
        """The CPU kernel path the weights run on: amx+repack, repack or plain."""
        return self.model.cpu_kernels

    def kv_cache_info(self) -> dict[str, str | bool]:
        type_k, type_v = self.model.cache_types
        return {"type_k": type_k, "type_v": type_v, "flash_attn": self.model.flash_attn}

    def _cache_dir(self) -> Path | None:
        if self.settings.prompt_cache_dir is None:
            return None
        # Saved KV is only valid for this file, llama.cpp build and KV layout.
        try:
            stat = self.path.stat()
        except OSError:  # the file was deleted or replaced while loaded: nothing to key by
            log.info("%s: its file is gone; its prompt caches are not kept", self.model_id)
            return None
        identity = f"{self.fingerprint}|{stat.st_mtime_ns}|{self.model.kv_layout}"
        key = hashlib.sha256(identity.encode()).hexdigest()[:16]
        return self.settings.prompt_cache_dir / f"{self.path.stem}-{key}"

    def _step_cost_file(self) -> Path | None:
        """Where this machine's decode step cost is kept, beside the prompt caches."""
        if self.settings.prompt_cache_dir is None:
            return None
        return cost_file(self.settings.prompt_cache_dir,
                         f"{self.fingerprint}|{self.model.kv_layout}|{self.model.n_ctx}",
                         self.model.n_threads, self.model.n_seq_max)

    def _draft_cost_file(self) -> Path | None:
        """Where the draft model's step cost is kept: keyed by its file too."""
        draft = self.settings.draft_model
        if self.settings.prompt_cache_dir is None or draft is None or self.drafter is None:
            return None
        stat = draft.stat()
        return cost_file(self.settings.prompt_cache_dir,
                         f"draft|{self.fingerprint}|{draft.name}|{stat.st_size}|"
                         f"{stat.st_mtime_ns}|{self.drafter.model.n_ctx}",
                         self.drafter.model.n_threads, self.drafter.model.n_seq_max)

    def _saved_prompts(self) -> list[StoredPrefix]:
        directory = self._cache_dir()
        if directory is None:
            return []
        entries = load_entries(directory, directory.name, self.settings.prompt_cache_mb << 20,
                               max_tokens=self.model.n_ctx_seq)
        if entries:
            log.info("%s: %d saved prompt prefixes loaded", self.model_id, len(entries))
        return entries

    def _save_prompts(self) -> None:
        directory = self._cache_dir()
        if directory is None:
            return
        self.scheduler.kv.spill_all()
        saved = save_entries(directory, directory.name, self.scheduler.kv.store.entries(),
                             self.settings.prompt_cache_mb << 20)
        if saved:
            log.info("%s: %d prompt prefixes saved", self.model_id, saved)

    def _fingerprint(self) -> str:
        """Identifies the llama.cpp build and the model file, as system_fingerprint."""
        stat = self.path.stat()
        identity = f"{lc.__version__}|{self.path.name}|{stat.st_size}|{self.model.description}"
        return "fp_" + hashlib.sha256(identity.encode()).hexdigest()[:12]

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        add = add_special and self.vocab.add_bos
        return self.vocab.tokenize(text, add_special=add, parse_special=parse_special)

    def tokenize_chat(self, rendered: RenderedChat) -> list[int]:
        """Tokens of a rendered chat prompt: the template's markup with special tokens
        parsed, control texts from caller strings (the sentinels) as plain text."""
        text = rendered.text
        # Templates that write the BOS text themselves must not get a second one.
        bos_text = self.chat_template.bos_token
        add_bos = not (bos_text and text.startswith(bos_text))
        if not rendered.literals:
            return self.tokenize(text, add_special=add_bos)
        tokens = [self.vocab.bos] if add_bos and self.vocab.add_bos and self.vocab.bos >= 0 else []
        return tokens + self._chat_text_tokens(text, rendered.literals)

    def tokenize_chat_tail(self, rendered: RenderedChat) -> list[int]:
        """tokenize_chat for text that continues a prompt already tokenized: no BOS."""
        return self._chat_text_tokens(rendered.text, rendered.literals)

    def _chat_text_tokens(self, text: str, literals: dict[str, str]) -> list[int]:
        return chat_text_tokens(self.vocab, text, literals)

    def tokenize_chat_images(self, rendered: RenderedChat,
                             images: dict[str, Media]) -> PromptTokens:
        """tokenize_chat for a prompt whose text holds media sentinels (keys of
        `images`: images and audio clips): each becomes the medium's tokens as the
        projector lays them out."""
        assert self.projector is not None
        prompt = PromptTokens()
        pattern = "(" + "|".join(re.escape(k) for k in images) + ")"
        for i, piece in enumerate(re.split(pattern, rendered.text)):
            if piece in images:
                prompt.add_image(self.projector.media_prompt(images[piece]))
            elif i == 0:
                prompt.add_text(self.tokenize_chat(RenderedChat(piece, rendered.literals)))
            elif piece:
                prompt.add_text(self._chat_text_tokens(piece, rendered.literals))
        return prompt

    def tokenize_images(self, texts: list[str], images: list[RgbImage]) -> PromptTokens:
        """A raw prompt of text (special tokens parsed, as raw prompts are) with
        images[k] between texts[k] and texts[k + 1]; the model's BOS, if it wants one,
        first."""
        assert self.projector is not None and len(texts) == len(images) + 1
        prompt = PromptTokens()
        prompt.add_text(self.tokenize(texts[0], add_special=True))
        for image, text in zip(images, texts[1:], strict=True):
            prompt.add_image(self.projector.image_prompt(image))
            prompt.add_text(self.tokenize(text, add_special=False))
        return prompt

    def submit(self, request: GenerationRequest) -> RequestHandle:
        if self.is_reranker:
            raise EngineError(f"{self.model_id} is a reranker (rank pooling); it does not "
                              "generate text: use /v1/rerank", status=400,
                              code="model_not_supported")
        if self.model.rpc and rpc_guard.failure():
            raise _rpc_error(rpc_guard.failure() or "")
        resolve_choices(request, self.lora, self.drafter, self.model_id)
        return self.scheduler.submit(request)

    def _on_rpc_lost(self, reason: str) -> None:
        """Any thread. The engine thread is, or is about to be, blocked in llama.cpp for
        good (see rpc_guard): answer everything it holds or queued now, with the reason."""
        self.scheduler.fail_all(_rpc_error(reason))

    # --- embeddings ----------------------------------------------------------------------

    def embedding_plan(self) -> EmbeddingPlan:
        """The embedding context's shape (raises EmbeddingsUnsupported for rerankers);
        cheap, and known before the context exists."""
        return plan_embeddings(self.model, self.settings.embeddings)

    def rerank_plan(self) -> EmbeddingPlan:
        """embedding_plan for a reranker (raises EmbeddingsUnsupported for other models,
        and for rerankers whose pairs cannot be laid out)."""
        plan = plan_reranking(self.model, self.settings.embeddings)
        self.pair_layout()
        return plan

    def pair_layout(self) -> PairLayout:
        """How this reranker reads a query-document pair."""
        if self._pair_layout is None:
            self._pair_layout = PairLayout(self.model)
        return self._pair_layout

    def embedder(self) -> Embedder:
        """The embedding context and its worker, created on first use (blocking: call
        it off the event loop)."""
        if self.model.rpc and rpc_guard.failure():
            raise _rpc_error(rpc_guard.failure() or "")
        with self._embedder_lock:
            if self._closed:
                raise EngineError("the model is shutting down; retry shortly")
            if self._embedder is None:
                plan = self.rerank_plan() if self.is_reranker else self.embedding_plan()
                self._embedder = Embedder(self.model, plan,
                                          self.settings.embeddings.max_waiting)
            return self._embedder

    @property
    def embedding_bytes(self) -> int:
        """Memory of the embedding context (0 until an embeddings request made it)."""
        embedder = self._embedder
        return embedder.plan.bytes if embedder is not None else 0

    def memory(self) -> dict[str, int]:
        """Bytes this model holds, by part: the engine's share of the memory account.
        Weights, KV cache and compute buffers are what llama.cpp allocated; the KV cache
        is resident whole from load (llama.cpp clears it), the compute buffers as steps
        touch them."""
        buffers = self.model.buffer_bytes
        embedder, projector = self._embedder, self.projector
        return {
            "weights": buffers.get("weights", 0),
            "weights_mapped": buffers.get("weights_mapped", 0),
            "kv_cache": buffers.get("kv_cache", 0),
            "compute_buffers": buffers.get("compute", 0),
            "prompt_store": self.scheduler.kv.store.used_bytes,
            "checkpoints": self.scheduler.kv.checkpoint_bytes(),
            "embedding_context": embedder.bytes if embedder is not None else 0,
            "projector": self._projector_bytes,
            "lora_adapters": self.lora.n_bytes,
            "draft_model": self.drafter.anonymous_bytes if self.drafter is not None else 0,
            "image_cache": projector.cached_bytes if projector is not None else 0,
        }

    def held_bytes(self) -> int:
        """What the model pool charges this model in its memory budget: its weights, KV
        cache, compute buffers and projector as allocated, and its embedding context
        once made."""
        drafter = self.drafter.held_bytes if self.drafter is not None else 0
        return (self.model.held_bytes() + self._projector_bytes + self.lora.n_bytes
                + drafter + self.embedding_bytes)

    def stats(self) -> dict[str, int]:
        embedder = self._embedder
        extra = embedder.stats() if embedder is not None else {}
        if self.projector is not None:
            extra["images_encoded"] = self.projector.images_encoded
            extra["image_encodes_skipped"] = self.projector.encodes_skipped
            extra["images_prepared"] = self.projector.prepared  # held by unfinished requests
        return {**engine_counts(self.scheduler), **extra}

    def stalled_for(self) -> float:
        """Seconds the current engine step (generation or embedding) has run."""
        embedder = self._embedder
        embedding = embedder.stalled_for() if embedder is not None else 0.0
        return max(self.scheduler.stalled_for(), embedding)

    def close(self, stop_timeout: float = STOP_TIMEOUT) -> None:
        """Stops the engine, saves its prompt caches and frees it. If the engine thread
        is still inside a step after `stop_timeout` seconds, nothing is saved or freed:
        a snapshot of KV being written would be a torn entry with a valid checksum, and
        freeing the context under a running step crashes (the memory is reclaimed when
        the process exits)."""
        rpc_guard.remove_listener(self._on_rpc_lost)
        if self.model.rpc and rpc_guard.failure():
            # Its threads are parked in llama.cpp: nothing here can be freed or saved.
            self._on_rpc_lost(rpc_guard.failure() or "")
            self.model.close()
            return
        with self._embedder_lock:
            self._closed = True
            embedder, self._embedder = self._embedder, None
        if embedder is not None:
            embedder.close()  # before the weights it runs on are freed
        if not self.scheduler.stop(stop_timeout):
            log.error("%s: the engine thread is still in a step after %.0f s; its prompt "
                      "caches are not saved and its memory is not freed", self.model_id,
                      stop_timeout)
            return
        try:
            self._save_prompts()
        except Exception:  # a full disk must not keep the model from unloading
            log.exception("could not save prompt caches")
        if self.projector is not None:
            self.projector.close()
        if self.drafter is not None:
            self.drafter.close()
        self.model.close()
