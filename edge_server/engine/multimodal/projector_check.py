"""Reads a multimodal projector's GGUF file in Python before llama.cpp's mtmd sees it.

mtmd refuses some broken files cleanly (NULL from mtmd_init_from_file), but others take
the whole process down: a metadata key of the wrong type (INT32 where UINT32 is read)
aborts in a GGML_ASSERT, a head count that does not divide the width aborts in a
reshape, a missing patch/position embedding, attention or projection tensor segfaults,
and a file with its tail cut off loads silently. Each of those is refused here with a
message that says what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

# Projector types this server runs, with the tensors their graphs use unconditionally
# (clip.cpp looks them up as optional and then dereferences them).
_PROJECTOR_TENSORS: dict[str, tuple[str, ...]] = {
    "mlp": ("mm.0.weight", "mm.2.weight"),
    "mlp_norm": ("mm.0.weight", "mm.2.weight"),
    "idefics3": ("mm.model.fc.weight",),  # SmolVLM
    "gemma3": ("mm.input_projection.weight", "mm.soft_emb_norm.weight"),
}
# Audio projector types (Whisper-style encoders, 16 kHz log-mel input), with the
# projection tensors their graphs use unconditionally.
_AUDIO_PROJECTOR_TENSORS: dict[str, tuple[str, ...]] = {
    "qwen2a": ("mm.a.fc.weight", "mm.a.fc.bias"),  # Qwen2-Audio
    "ultravox": ("mm.a.mlp.1.weight", "mm.a.mlp.2.weight", "mm.a.norm_pre.weight",
                 "mm.a.norm_mid.weight"),
    "voxtral": ("mm.a.mlp.1.weight", "mm.a.mlp.2.weight"),
}
# One Whisper window (30 s, 3000 mel frames) is 1500 positions after the encoder's
# stride-2 convolution: the graph asserts the position table covers them.
_AUDIO_POSITIONS = 1500
_STACKING_AUDIO = ("ultravox", "voxtral")
_BOOL_KEYS = {"clip.has_vision_encoder", "clip.has_audio_encoder",
              "clip.has_gen_audio_encoder", "clip.use_gelu", "clip.use_silu"}
_STRING_SUFFIXES = ("projector_type", "mm_patch_merge_type", "model_variant")
_FLOAT_SUFFIXES = ("layer_norm_epsilon", "swiglu_clamp")
_INT32_KEYS = {"clip.minicpmv_version"}
_MAX_BLOCKS = 256


class ProjectorError(ValueError):
    """The projector file cannot be used with this model; the message says why."""


@dataclass(frozen=True)
class ProjectorInfo:
    projector_type: str
    vision: bool
    audio: bool
    output_width: int  # embedding width of its output tokens: must equal the model's


def _scalar(reader: GGUFReader, key: str) -> object:
    field = reader.fields[key]
    return field.contents()


def _check_types(reader: GGUFReader) -> None:
    for key, field in reader.fields.items():
        if not key.startswith("clip."):
            continue
        kind = field.types[0] if field.types else None
        if key in _BOOL_KEYS:
            want = GGUFValueType.BOOL
        elif key.endswith(_STRING_SUFFIXES):
            want = GGUFValueType.STRING
        elif key.endswith(_FLOAT_SUFFIXES):
            want = GGUFValueType.FLOAT32
        elif key in _INT32_KEYS:
            want = GGUFValueType.INT32
        elif kind == GGUFValueType.ARRAY:
            if key.endswith(("image_mean", "image_std")) and (
                    len(field.types) < 2 or field.types[1] != GGUFValueType.FLOAT32
                    or len(field.data) != 3):
                raise ProjectorError(f"metadata {key} must be an array of 3 floats")
            continue
        else:
            want = GGUFValueType.UINT32
        if kind != want:
            got = kind.name if kind is not None else "nothing"
            raise ProjectorError(f"metadata {key} has type {got}; llama.cpp reads {want.name}")


def _u32(reader: GGUFReader, key: str, *, required: bool = True) -> int:
    if key not in reader.fields:
        if required:
            raise ProjectorError(f"metadata {key} is missing")
        return 0
    value = _scalar(reader, key)
    assert isinstance(value, int)
    return value


def _check_encoder(reader: GGUFReader, names: set[str], prefix: str, modality: str) -> None:
    key = f"clip.{modality}"
    width = _u32(reader, f"{key}.embedding_length")
    heads = _u32(reader, f"{key}.attention.head_count")
    blocks = _u32(reader, f"{key}.block_count")
    if width <= 0 or heads <= 0 or width % heads:
        raise ProjectorError(f"{key}: {heads} attention heads do not divide the width {width}")
    if not 0 < blocks <= _MAX_BLOCKS:
        raise ProjectorError(f"{key}.block_count {blocks} is outside 1..{_MAX_BLOCKS}")
    if modality == "vision":
        image, patch = _u32(reader, f"{key}.image_size"), _u32(reader, f"{key}.patch_size")
        if not 0 < patch <= image <= 8192:
            raise ProjectorError(f"{key}: patch size {patch} and image size {image} do not fit")
        for tensor in ("v.patch_embd.weight", "v.position_embd.weight"):
            if tensor not in names:
                raise ProjectorError(f"tensor {tensor} is missing")
    for block in range(blocks):
        base = f"{prefix}.blk.{block}"
        attention = ({f"{base}.attn_q.weight", f"{base}.attn_k.weight", f"{base}.attn_v.weight"}
                     if f"{base}.attn_qkv.weight" not in names else set())
        for tensor in sorted(attention | {f"{base}.attn_out.weight", f"{base}.ffn_down.weight"}):
            if tensor not in names:
                raise ProjectorError(f"tensor {tensor} is missing")


def _check_audio_encoder(reader: GGUFReader, names: set[str], projector_type: str) -> None:
    """What the Whisper encoder graph asserts or dereferences without a check."""
    _check_encoder(reader, names, "a", "audio")
    by_name = {t.name: t for t in reader.tensors}
    mel_bins = _u32(reader, "clip.audio.num_mel_bins")
    if not 0 < mel_bins <= 256:
        raise ProjectorError(f"clip.audio.num_mel_bins {mel_bins} is outside 1..256")
    for tensor in ("a.conv1d.1.weight", "a.conv1d.1.bias", "a.conv1d.2.weight",
                   "a.conv1d.2.bias", "a.position_embd.weight"):
        if tensor not in names:
            raise ProjectorError(f"tensor {tensor} is missing")
    conv = [int(d) for d in by_name["a.conv1d.1.weight"].shape]  # (kernel, in, out)
    if len(conv) < 2 or conv[1] != mel_bins:
        raise ProjectorError(f"tensor a.conv1d.1.weight does not read {mel_bins} mel bins")
    positions = [int(d) for d in by_name["a.position_embd.weight"].shape]
    if len(positions) < 2 or positions[1] < _AUDIO_POSITIONS:
        raise ProjectorError(f"tensor a.position_embd.weight has fewer than "
                             f"{_AUDIO_POSITIONS} positions (one 30 s window)")
    for block in range(_u32(reader, "clip.audio.block_count")):
        base = f"a.blk.{block}"
        for tensor in (f"{base}.ln1.weight", f"{base}.ln1.bias", f"{base}.ln2.weight",
                       f"{base}.ln2.bias", f"{base}.attn_q.bias", f"{base}.attn_v.bias"):
            if tensor not in names:
                raise ProjectorError(f"tensor {tensor} is missing")
        if f"{base}.attn_k.bias" in names:
            raise ProjectorError(f"tensor {base}.attn_k.bias: a Whisper encoder's key "
                                 "projection has no bias")
    if projector_type in _STACKING_AUDIO:
        stack = _u32(reader, "clip.audio.projector.stack_factor")
        if not 0 < stack <= 64:
            raise ProjectorError(f"clip.audio.projector.stack_factor {stack} is outside 1..64")


def _projector_type(reader: GGUFReader, modality: str) -> str:
    key = f"clip.{modality}.projector_type"
    if key not in reader.fields:
        key = "clip.projector_type"
    if key not in reader.fields:
        raise ProjectorError("metadata clip.projector_type is missing")
    return str(_scalar(reader, key))


def _check_extent(reader: GGUFReader, path: Path) -> None:
    size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size:
            raise ProjectorError(f"the file ends inside tensor {tensor.name} (truncated?)")


def _output_width(reader: GGUFReader, projector_type: str) -> int:
    """The width of the projector's output tokens, from its last projection tensor
    (numpy shape: output rows first)."""
    by_name = {t.name: t for t in reader.tensors}
    last = {"mlp": "mm.2.weight", "mlp_norm": "mm.2.weight", "idefics3": "mm.model.fc.weight",
            "gemma3": "mm.input_projection.weight", "qwen2a": "mm.a.fc.weight",
            "ultravox": "mm.a.mlp.2.weight", "voxtral": "mm.a.mlp.2.weight"}[projector_type]
    shape = [int(d) for d in by_name[last].shape]  # ggml order: input first
    return shape[0] if projector_type == "gemma3" else shape[-1]


def check_projector(path: Path, model_width: int) -> ProjectorInfo:
    """Refuses, with a ProjectorError that says why, a projector file mtmd would crash on
    or that does not fit a text model of embedding width `model_width`."""
    if not path.is_file():
        raise ProjectorError("the projector file does not exist")
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises whatever a broken file makes numpy raise
        raise ProjectorError(f"not a readable GGUF file ({type(exc).__name__})") from exc
    _check_extent(reader, path)
    _check_types(reader)
    names = {t.name for t in reader.tensors}
    vision = bool(_scalar(reader, "clip.has_vision_encoder")) if (
        "clip.has_vision_encoder" in reader.fields) else False
    audio = bool(_scalar(reader, "clip.has_audio_encoder")) if (
        "clip.has_audio_encoder" in reader.fields) else False
    if not vision and not audio:
        raise ProjectorError("the file has neither a vision nor an audio encoder")
    kinds = []
    for modality, wanted, supported in (("vision", vision, _PROJECTOR_TENSORS),
                                        ("audio", audio, _AUDIO_PROJECTOR_TENSORS)):
        if not wanted:
            continue
        kind = _projector_type(reader, modality)
        if kind not in supported:
            raise ProjectorError(f"{modality} projector type {kind!r} is not supported "
                                 f"here (supported: {', '.join(sorted(supported))})")
        _check_tensors(names, supported[kind])
        if modality == "vision":
            _check_encoder(reader, names, "v", "vision")
        else:
            _check_audio_encoder(reader, names, kind)
        kinds.append(kind)
    for kind in kinds:
        width = _output_width(reader, kind)
        if width != model_width:
            raise ProjectorError(f"the projector's output width {width} does not match the "
                                 f"model's embedding width {model_width}")
    return ProjectorInfo("+".join(kinds), vision, audio, model_width)


def _check_tensors(names: set[str], required: tuple[str, ...]) -> None:
    for tensor in required:
        if tensor not in names:
            raise ProjectorError(f"tensor {tensor} is missing")


def projector_modalities(path: Path) -> tuple[str, ...]:
    """Input kinds a projector file declares, read from its metadata only (for listings):
    ("image",), ("image", "audio"), or () when the file is unreadable."""
    try:
        reader = GGUFReader(str(path))
        kinds = []
        if "clip.has_vision_encoder" in reader.fields and _scalar(
                reader, "clip.has_vision_encoder"):
            kinds.append("image")
        if "clip.has_audio_encoder" in reader.fields and _scalar(
                reader, "clip.has_audio_encoder"):
            kinds.append("audio")
        return tuple(kinds)
    except Exception:
        return ()
