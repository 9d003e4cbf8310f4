"""A model's multimodal projector (llama.cpp's mtmd): images and audio into embedding
tokens.

Media arrive here already decoded and bounded in Python (RGB pixels, mono float samples
at the projector's rate; never raw file bytes: llama.cpp's decoders never see what a
client sent). `image_prompt` and `audio_prompt` turn one image or clip into the tokens
mtmd wraps it in plus its chunks (an ImageChunk each, whichever the medium); `encode`
runs the encoder on the engine thread (llama.cpp's OpenMP keeps a worker team per
calling thread, so all graph compute stays on that one thread).

A medium's tokens stand in prompts as placeholder ids: negative numbers derived from
its digest, the projector file, the chunk's index within it (projectors such as
SmolVLM's split one image into an overview and tiles, Whisper-style encoders a clip
into 30-second windows, each a chunk of its own) and the token's index. Equal media
give equal ids, so the KV prefix cache, the RAM store and the saved prompt caches all
recognise a repeated image or clip with no code of their own, and a different one, tile
or projector never matches.

Prepared chunks hold C memory until the engine is done with them, or until whoever
prepared them frees them (see image_scope.py); a finalizer frees a forgotten one, and
the count of live chunks needs no lock, so a collection on any thread (the engine's,
inside `encode`) can never block on one.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.backend.runtime import forward_llama_log
from edge_server.engine.multimodal.audio import PcmAudio
from edge_server.engine.multimodal.image_scope import note_prepared
from edge_server.engine.multimodal.projector_check import ProjectorError, check_projector

log = logging.getLogger(__name__)

_EMBEDDING_CACHE_BYTES = 64 << 20  # encoded images kept for repeats whose KV was evicted
# Prepared image chunks (resized and normalised by mtmd: megabytes each for large
# encoders; a tiling projector makes several per image) held by requests not yet done:
# more wait for room (ProjectorBusy), so a full queue of image requests cannot exhaust
# memory.
MAX_PREPARED_IMAGES = 64


class ProjectorBusy(RuntimeError):
    """Too many prepared images wait for the engine; the request may retry shortly."""


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = 8  # per request
    max_bytes: int = 20 << 20  # one image's file, after base64 decoding
    max_pixels: int = 25_000_000  # width x height of one image
    max_side: int = 2048  # larger images are scaled down before llama.cpp
    fetch_urls: bool = False  # http(s) image URLs: fetched (on) or refused (off)
    fetch_timeout: float = 10.0  # seconds for one fetch in all (redirects, body)
    # Networks (CIDR) fetches may reach although private, loopback or link-local.
    fetch_networks: tuple[str, ...] = ()


@dataclass(frozen=True)
class RgbImage:
    width: int
    height: int
    pixels: bytes  # width * height * 3, row-major RGB
    digest: str  # sha256 of the bytes the client sent


# What a prompt may hold besides text.
Media = RgbImage | PcmAudio


class ImageChunk:
    """One chunk of an image (resized, normalised) or of a clip (a log-mel window) as
    mtmd prepared it, waiting to be encoded; `kind` says which ("image", "audio").

    Owned by whoever prepared it until the engine takes it (`taken`, set when a request
    is queued); then the engine frees it when the request ends."""

    def __init__(self, ptr: int, n_tokens: int, key: bytes, placeholders: list[int],
                 on_free: Callable[[], None], kind: str = "image") -> None:
        self._ptr: int | None = ptr
        self.kind = kind
        self.n_tokens = n_tokens
        self.key = key
        self.placeholders = placeholders
        self.taken = False
        self._on_free = on_free

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise RuntimeError("image chunk already freed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Frees the chunk (once). Takes no lock: it runs from finalizers too."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            mtmd.mtmd_input_chunk_free(ptr)
            self._on_free()

    def __del__(self) -> None:
        self.close()


def chunk_key(identity: bytes, image_digest: str, index: int) -> bytes:
    """What identifies one image chunk: the projector file, the image's bytes and the
    chunk's index within the image (an overview and its tiles share the image)."""
    return hashlib.sha256(identity + bytes.fromhex(image_digest)
                          + index.to_bytes(4, "little")).digest()


def placeholder_ids(key: bytes, n_tokens: int) -> list[int]:
    """Negative ids, one per image token, each an independent hash of (key, index): a
    prefix match can only end inside an image if it matched that whole image."""
    ids = []
    for i in range(n_tokens):
        digest = hashlib.blake2b(key + i.to_bytes(4, "little"), digest_size=4).digest()
        ids.append(-1 - (int.from_bytes(digest, "little") & 0x7FFFFFFE))
    return ids


class Projector:
    def __init__(self, path: Path, model: LlamaModel, *, use_gpu: bool) -> None:
        info = check_projector(path, model.n_embd)
        self.path = path
        self.info = info
        mtmd.mtmd_log_set(forward_llama_log, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = model.n_threads
        params.print_timings = False
        params.warmup = False  # a warm-up encode here would start a second OpenMP team
        ctx = mtmd.mtmd_init_from_file(str(path).encode(), model.model, params)
        if not ctx:
            raise ProjectorError("llama.cpp could not load it (see the log above)")
        self._ctx: int | None = ctx
        if mtmd.mtmd_decode_use_mrope(ctx):
            self.close()
            raise ProjectorError("M-RoPE vision models (Qwen2-VL family) are not supported")
        self.vision = bool(mtmd.mtmd_support_vision(ctx))
        self.audio = bool(mtmd.mtmd_support_audio(ctx))
        # Hz the audio encoder reads (16 kHz for Whisper-style ones); 0 without one.
        self.sample_rate = int(mtmd.mtmd_get_audio_sample_rate(ctx)) if self.audio else 0
        if self.audio and not 8_000 <= self.sample_rate <= 48_000:
            self.close()
            raise ProjectorError(f"the audio encoder reads {self.sample_rate} Hz audio, "
                                 "outside 8-48 kHz")
        self.n_embd = model.n_embd
        self.n_batch = model.n_batch
        self._identity = hashlib.sha256(
            f"{path.name}|{path.stat().st_size}|{path.stat().st_mtime_ns}".encode()).digest()
        self._marker = mtmd.mtmd_default_marker()
        # By (partition, chunk key): a tenant never gets (or times) another's encoding.
        self._embeddings: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the embedding cache is read off the engine thread
        self.images_encoded = 0
        self.encodes_skipped = 0
        # Ids of the ImageChunks alive (see MAX_PREPARED_IMAGES). A set of ints: adding
        # and discarding are atomic under the GIL, so freeing a chunk takes no lock.
        self._live: set[int] = set()
        self._chunk_ids = itertools.count()

    @property
    def prepared(self) -> int:
        """Image chunks alive: prepared and not yet freed."""
        return len(self._live)

    @property
    def cached_bytes(self) -> int:
        """Embeddings of recently encoded images kept for repeats."""
        with self._lock:
            return sum(e.nbytes for e in self._embeddings.values())

    @property
    def modalities(self) -> tuple[str, ...]:
        return (("image",) if self.vision else ()) + (("audio",) if self.audio else ())

    def image_prompt(self, image: RgbImage) -> list[list[int] | ImageChunk]:
        """The tokens mtmd puts around an image (begin/end markers, model-specific) and
        the image's chunks, in prompt order. CPU-bound (resizing): call off the loop.
        Raises ProjectorBusy while MAX_PREPARED_IMAGES chunks wait for the engine; on any
        error the chunks made so far are freed."""
        if not self.vision:
            raise ProjectorError("this projector reads no images")
        self._check_room()
        pixels = (ctypes.c_uint8 * len(image.pixels)).from_buffer_copy(image.pixels)
        bitmap = mtmd.mtmd_bitmap_init(image.width, image.height, pixels)
        if not bitmap:
            raise ProjectorError("llama.cpp refused the image")
        return self._media_prompt(bitmap, image.digest, "image")

    def audio_prompt(self, audio: PcmAudio) -> list[list[int] | ImageChunk]:
        """image_prompt for a clip: the markers mtmd puts around audio and the clip's
        chunks (one per 30 s window for Whisper-style encoders). CPU-bound (the log-mel
        spectrogram): call off the loop."""
        if not self.audio:
            raise ProjectorError("this projector reads no audio")
        if audio.sample_rate != self.sample_rate or audio.n_samples < 2:
            raise ProjectorError(f"audio must be at least 2 samples at {self.sample_rate} Hz")
        self._check_room()
        samples = (ctypes.c_float * audio.n_samples).from_buffer_copy(audio.samples)
        bitmap = mtmd.mtmd_bitmap_init_from_audio(audio.n_samples, samples)
        if not bitmap:
            raise ProjectorError("llama.cpp refused the audio")
        return self._media_prompt(bitmap, audio.digest, "audio")

    def media_prompt(self, medium: Media) -> list[list[int] | ImageChunk]:
        return (self.audio_prompt(medium) if isinstance(medium, PcmAudio)
                else self.image_prompt(medium))

    def _check_room(self) -> None:
        if self.prepared >= MAX_PREPARED_IMAGES:
            raise ProjectorBusy(f"{self.prepared} media chunks wait for the model; "
                                "retry shortly")

    def _media_prompt(self, bitmap: int, digest: str, kind: str
                      ) -> list[list[int] | ImageChunk]:
        """mtmd's chunks of one bitmap (freed here) as prompt pieces."""
        chunks = mtmd.mtmd_input_chunks_init()
        pieces: list[list[int] | ImageChunk] = []
        try:
            text = mtmd.mtmd_input_text()
            text.text = self._marker
            text.text_len = len(self._marker)
            text.add_special = False
            text.parse_special = True
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            status = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if status != 0:
                raise ProjectorError(f"llama.cpp could not prepare the {kind} ({status})")
            media = 0
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                piece = self._piece(mtmd.mtmd_input_chunks_get(chunks, i), digest, media,
                                    kind)
                media += isinstance(piece, ImageChunk)
                pieces.append(piece)
            return pieces
        except BaseException:
            for piece in pieces:
                if isinstance(piece, ImageChunk):
                    piece.close()
            raise
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _piece(self, chunk: int, digest: str, index: int, kind: str
               ) -> list[int] | ImageChunk:
        """One mtmd chunk: text tokens, or the media chunk `index` (0, 1, ...: the
        overview and tiles of a tiling projector, a clip's windows) of the image or
        clip whose bytes have `digest`."""
        chunk_type = mtmd.mtmd_input_chunk_get_type(chunk)
        if chunk_type == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t(0)
            tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            # mtmd writes LLAMA_TOKEN_NULL for a marker token the text model lacks (a
            # projector paired with another text model): no token to decode, so none.
            return [int(tokens[i]) for i in range(count.value) if tokens[i] >= 0]
        want = (mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO if kind == "audio"
                else mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE)
        if chunk_type != want:
            raise ProjectorError(f"llama.cpp made a chunk of another kind of an {kind}")
        n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        if mtmd.mtmd_input_chunk_get_n_pos(chunk) != n_tokens:
            raise ProjectorError(f"this projector places {kind} tokens in a way not "
                                 "supported")
        key = chunk_key(self._identity, digest, index)
        # The cap counts chunks: reserve this one first, so that threads preparing at
        # once can never hold more than MAX_PREPARED_IMAGES together.
        chunk_id = next(self._chunk_ids)
        self._live.add(chunk_id)
        if len(self._live) > MAX_PREPARED_IMAGES:
            self._live.discard(chunk_id)
            raise ProjectorBusy(f"{MAX_PREPARED_IMAGES} media chunks wait for the model; "
                                "retry shortly")
        copy = mtmd.mtmd_input_chunk_copy(chunk)
        if not copy:
            self._live.discard(chunk_id)
            raise ProjectorError(f"llama.cpp could not keep the {kind}")
        chunk_obj = ImageChunk(copy, n_tokens, key, placeholder_ids(key, n_tokens),
                               lambda: self._live.discard(chunk_id), kind)
        note_prepared(chunk_obj)
        return chunk_obj

    def non_causal(self, chunk: ImageChunk) -> bool:
        """Whether the model attends over this image's tokens in both directions (Gemma 3
        does): then they must be decoded in one batch with causal attention off."""
        return bool(mtmd.mtmd_decode_use_non_causal(self.ctx, chunk.ptr))

    @staticmethod
    def set_causal(model: LlamaModel, causal: bool) -> None:
        lc.llama_set_causal_attn(model.ctx, causal)

    def encode(self, chunk: ImageChunk, partition: str = "") -> np.ndarray | None:
        """The image's embeddings, (n_tokens, n_embd) float32; None if encoding failed.
        Engine thread only. A repeat of a recently encoded image is not encoded again
        within one partition (a tenant: an API key); across partitions it is, so that
        no key learns from the time an encode takes what another key sent."""
        key = (partition, chunk.key)
        with self._lock:
            cached = self._embeddings.get(key)
            if cached is not None:
                self._embeddings.move_to_end(key)
                self.encodes_skipped += 1
                return cached
        if mtmd.mtmd_encode_chunk(self.ctx, chunk.ptr) != 0:
            return None
        out = mtmd.mtmd_get_output_embd(self.ctx)
        embd = np.ctypeslib.as_array(out, shape=(chunk.n_tokens * self.n_embd,)).reshape(
            chunk.n_tokens, self.n_embd).copy()
        self.images_encoded += 1
        with self._lock:
            self._embeddings[key] = embd
            total = sum(e.nbytes for e in self._embeddings.values())
            while total > _EMBEDDING_CACHE_BYTES and len(self._embeddings) > 1:
                _, dropped = self._embeddings.popitem(last=False)
                total -= dropped.nbytes
        return embd

    @property
    def ctx(self) -> int:
        if self._ctx is None:
            raise RuntimeError("projector closed")
        return self._ctx

    def close(self) -> None:
        if self._ctx is not None:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None
