"""Audio projectors before and inside llama.cpp's mtmd: broken files refused by name
before mtmd sees them (its encoder graph asserts what these break, which would take the
process down), and clips of the tiny test projector laid out as 30-second windows."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import write_test_audio_projector

from edge_testkit.audio import AUDIO_TOKENS_PER_WINDOW

BROKEN = {
    "wrong output width": ({"width": 512}, "output width 512"),
    "missing projection tensor": ({"skip_tensors": ("mm.a.fc.weight",)}, "mm.a.fc.weight"),
    "missing convolution": ({"skip_tensors": ("a.conv1d.2.bias",)}, "a.conv1d.2.bias"),
    "missing query bias": ({"skip_tensors": ("a.blk.0.attn_q.bias",)}, "attn_q.bias"),
    "a key bias": ({"extra_tensors": ("a.blk.0.attn_k.bias",)}, "no bias"),
    "missing layer norm": ({"skip_tensors": ("a.blk.0.ln2.bias",)}, "ln2.bias"),
    "mel bins the convolution does not read": (
        {"override_u32": {"clip.audio.num_mel_bins": 128}}, "128 mel bins"),
    "heads not dividing the width": (
        {"override_u32": {"clip.audio.attention.head_count": 3}}, "do not divide"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_audio_projectors_are_refused_before_llama_cpp(tmp_path: Path,
                                                              name: str) -> None:
    from edge_server.engine.multimodal.projector_check import ProjectorError, check_projector

    kwargs, message = BROKEN[name]
    path = write_test_audio_projector(tmp_path / "broken.gguf", **kwargs)
    with pytest.raises(ProjectorError, match=message):
        check_projector(path, 576)


def test_the_test_projector_passes_as_audio_only(tmp_path: Path) -> None:
    from edge_server.engine.multimodal.projector_check import check_projector

    info = check_projector(write_test_audio_projector(tmp_path / "a.gguf"), 576)
    assert (info.vision, info.audio, info.projector_type) == (False, True, "qwen2a")


@pytest.fixture(scope="module")
def hearing_projector(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from edge_server.catalogue.default_model import default_model_path
    from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
    from edge_server.engine.multimodal.projector import Projector

    path = write_test_audio_projector(tmp_path_factory.mktemp("ap") / "a.gguf")
    model = LlamaModel(default_model_path(), ContextSettings(n_ctx=512, n_seq_max=1,
                                                             n_threads=1))
    loaded = Projector(path, model, use_gpu=False)
    yield loaded
    loaded.close()
    model.close()


def clip(seconds: float, seed: int = 0):  # type: ignore[no-untyped-def]
    from edge_server.engine.multimodal.audio import PcmAudio

    samples = (np.random.default_rng(seed).standard_normal(int(16_000 * seconds)) * 0.1
               ).astype(np.float32).tobytes()
    return PcmAudio(samples, 16_000, hashlib.sha256(samples).hexdigest())


def test_clips_are_laid_out_in_30_second_windows(hearing_projector) -> None:  # type: ignore[no-untyped-def]
    from edge_server.engine.multimodal.projector import ImageChunk
    from edge_server.engine.multimodal.projector_check import ProjectorError

    assert hearing_projector.modalities == ("audio",)
    assert hearing_projector.sample_rate == 16_000
    for seconds, windows in ((1.0, 1), (29.0, 1), (31.0, 2), (61.0, 3)):
        pieces = hearing_projector.audio_prompt(clip(seconds))
        chunks = [p for p in pieces if isinstance(p, ImageChunk)]
        assert [c.n_tokens for c in chunks] == [AUDIO_TOKENS_PER_WINDOW] * windows
        assert {c.kind for c in chunks} == {"audio"}
        assert len({c.key for c in chunks}) == windows  # each window keyed apart
        embd = hearing_projector.encode(chunks[0])
        assert embd is not None and embd.shape == (AUDIO_TOKENS_PER_WINDOW, 576)
        assert np.isfinite(embd).all()
        for chunk in chunks:
            chunk.close()
    assert hearing_projector.prepared == 0
    with pytest.raises(ProjectorError):  # another sample rate than the encoder's
        from edge_server.engine.multimodal.audio import PcmAudio

        hearing_projector.audio_prompt(PcmAudio(b"\0" * 4000, 8_000, "00"))
    with pytest.raises(ProjectorError):  # images, on a projector that reads none
        from edge_server.engine.multimodal.projector import RgbImage

        hearing_projector.image_prompt(RgbImage(2, 2, b"\0" * 12, "00"))
