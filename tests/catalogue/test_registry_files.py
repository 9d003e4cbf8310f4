"""A registry entry's local files beside the model: LoRA adapters (`lora`) and a draft
model (`draft`), relative to the registry file, checked as the registry is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_server.catalogue.store import RegistryError, load_registry


def registry(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "registry.toml"
    path.write_text(f'[[models]]\nid = "m"\npath = "/models/m.gguf"\n{extra}\n')
    return path


def test_adapters_and_a_draft_are_read_relative_to_the_registry(tmp_path: Path) -> None:
    entries = load_registry(registry(tmp_path, 'lora = ["a.gguf", "sub/b.gguf:0.5"]\n'
                                               'draft = "small.gguf"'))
    entry = entries[-1]
    assert [(s.path, s.scale) for s in entry.lora] == [
        (tmp_path / "a.gguf", 1.0), (tmp_path / "sub" / "b.gguf", 0.5)]
    assert entry.draft == tmp_path / "small.gguf"


@pytest.mark.parametrize(("extra", "words"), [
    ('lora = "a.gguf"', "lora must be a list"),
    ('lora = ["a.gguf:9"]', "at most 4"),
    ('lora = ["a.gguf:nan"]', "finite"),
    ('lora = [""]', "lora must be a list"),
    ("draft = 3", "draft must be a file path"),
])
def test_a_bad_entry_is_refused_with_its_reason(tmp_path: Path, extra: str,
                                                words: str) -> None:
    with pytest.raises(RegistryError, match=words):
        load_registry(registry(tmp_path, extra))
