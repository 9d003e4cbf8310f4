"""The tiny random test models, built once into a cache outside the checkout (beside the
llama.cpp sources), keyed by everything that goes into them, the makers' code included;
and the projector and reranker writers, which are quick enough to run per test."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from edge_testkit.models import (
    gguf_test_weights,
    make_test_arch_model,
    make_test_audio_projector,
    make_test_projector,
    make_test_reranker,
    make_test_vocab_model,
)
from edge_testkit.models.llama_sources import vendor_dir


def llama_sources() -> Path:
    """`vendor/llama.cpp` of the installed llama-cpp-python's sdist (real chat templates,
    test-chat.cpp, real tokenizers), downloaded once into a cache by
    edge_testkit.models.llama_sources."""
    return vendor_dir()


def _code(*modules: Any) -> list[str]:
    return [Path(module.__file__).read_text() for module in modules]


def vocab_model(vocab: str, *, add_control: tuple[str, ...] = (),
                add_user: tuple[str, ...] = (), template: str | None = None,
                template_fix: tuple[str, str] | None = None) -> Path:
    """A tiny random model with the real tokenizer `models/ggml-vocab-<vocab>.gguf` of
    llama.cpp's sources (edge_testkit.models.make_test_vocab_model), its markers added as
    control (or user-defined) tokens and `template` (a name under models/templates) as its
    chat template, with `template_fix` (old, new) replaced in it."""
    sources = llama_sources()
    template_text = (sources / "models" / "templates" / template).read_text() \
        if template is not None else None
    if template_text is not None and template_fix is not None:
        assert template_fix[0] in template_text, template_fix
        template_text = template_text.replace(*template_fix)
    key = hashlib.sha256(json.dumps(
        [vocab, add_control, add_user, template_text, *_code(make_test_vocab_model)]).encode()
    ).hexdigest()[:16]
    out = sources.parent / "test-models" / f"{vocab}-{key}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.part")  # test processes may race
        make_test_vocab_model.write_model(
            sources / "models" / f"ggml-vocab-{vocab}.gguf", partial,
            add_control=add_control, add_user=add_user, chat_template=template_text)
        partial.replace(out)
    return out


def arch_model(arch: str, vocab: str = "phi-3") -> Path:
    """A tiny random model of llama.cpp architecture `arch` (qwen35, lfm2, nemotron_h,
    granitehybrid, mamba2, qwen3moe, gemma3: edge_testkit.models.make_test_arch_model) with
    the real tokenizer and chat template of `models/ggml-vocab-<vocab>.gguf`, built once
    into the same cache as vocab_model's."""
    sources = llama_sources()
    code = _code(make_test_arch_model, make_test_vocab_model, gguf_test_weights)
    key = hashlib.sha256(json.dumps([arch, vocab, *code]).encode()).hexdigest()[:16]
    out = sources.parent / "test-models" / f"{arch}-{vocab}-{key}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.part")  # test processes may race
        make_test_arch_model.write_model(
            arch, sources / "models" / f"ggml-vocab-{vocab}.gguf", partial)
        partial.replace(out)
    return out


def write_test_projector(path: Path, **kwargs: Any) -> Path:
    """The tiny random multimodal projector of edge_testkit.models.make_test_projector
    (test-only; its keyword arguments write broken files on purpose)."""
    return make_test_projector.write_projector(path, **kwargs)


def write_test_audio_projector(path: Path, **kwargs: Any) -> Path:
    """The tiny random Whisper-style audio projector of
    edge_testkit.models.make_test_audio_projector (test-only; its keyword arguments
    write broken files on purpose)."""
    return make_test_audio_projector.write_audio_projector(path, **kwargs)


def write_test_reranker(path: Path, **kwargs: Any) -> Path:
    """The tiny random BERT reranker of edge_testkit.models.make_test_reranker (test-only)."""
    return make_test_reranker.write_reranker(path, **kwargs)
