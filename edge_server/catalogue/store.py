"""The model registry (TOML) and the models directory: what may be served, what is on
disk, and pulls from the Hugging Face Hub (hub_download.py) into the models directory.

Registry file, one table per model:

    [[models]]
    id = "gemma3-270m-it"                   # what clients pass as `model`
    aliases = ["gemma3", "claude-*"]        # glob aliases match names clients hard-code
    repo = "ggml-org/gemma-3-270m-it-GGUF"  # Hugging Face repo + file (+ revision) ...
    file = "gemma-3-270m-it-Q4_K_M.gguf"
    revision = "main"
    sha256 = "…"                            # optional; else the Hub's own checksum
    # path = "/srv/models/x.gguf"           # ... or a local file instead
    ctx_size = 4096
    chat_template_file = "templates/gemma3.jinja"  # relative to the registry file
    mmproj = "mmproj-model-f16.gguf"        # multimodal projector: a file of the same repo
                                            # (pulled with the model), or with `path` a
                                            # local file (relative to the registry file)
    keep_alive = 600                        # seconds; overrides the server default
    cache_type_k = "q8_0"                   # KV cache types; override --cache-type-k/-v
    cache_type_v = "q8_0"
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_server.catalogue.default_conversion import AUTO, served_default_model_path
from edge_server.catalogue.default_model import (
    DEFAULT_ALIAS,
    DEFAULT_MODEL_ALIASES,
    DEFAULT_MODEL_ID,
)
from edge_server.catalogue.hub_download import HubDownload, PullError
from edge_server.config import KV_CACHE_TYPE_NAMES
from edge_server.engine.backend.lora import LoraSpec, parse_lora_spec

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An alias holding one of these is a glob pattern (`claude-*`): it answers for every name
# it matches, for clients that hard-code a model name of their own.
_PATTERN_CHARS = frozenset("*?[")


def is_name_pattern(name: str) -> bool:
    return not _PATTERN_CHARS.isdisjoint(name)


class RegistryError(ValueError):
    pass


@dataclass(frozen=True)
class RegistryEntry:
    id: str
    aliases: tuple[str, ...] = ()
    path: Path | None = None
    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    sha256: str | None = None
    ctx_size: int = 0
    chat_template_file: Path | None = None
    mmproj: str | None = None
    keep_alive: float | None = None
    cache_type_k: str | None = None  # None: --cache-type-k
    cache_type_v: str | None = None
    lora: tuple[LoraSpec, ...] = ()  # adapters loaded with it (paths made absolute)
    draft: Path | None = None  # a draft model of its vocabulary (model_draft.py)
    embedded: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


def embedded_entry() -> RegistryEntry:
    return RegistryEntry(DEFAULT_MODEL_ID, DEFAULT_MODEL_ALIASES, embedded=True)


_KNOWN_KEYS = {"id", "aliases", "path", "repo", "file", "revision", "sha256", "ctx_size",
               "chat_template_file", "mmproj", "keep_alive", "embedded", "cache_type_k",
               "cache_type_v", "lora", "draft"}


def load_registry(path: Path | None) -> list[RegistryEntry]:
    """Entries of a registry file, the embedded default model always first."""
    entries = [embedded_entry()]
    if path is None or not path.is_file():
        return entries
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    for i, raw in enumerate(data.get("models", [])):
        where = f"{path.name}: models[{i}]"
        unknown = set(raw) - _KNOWN_KEYS
        if unknown:
            raise RegistryError(f"{where}: unknown keys {sorted(unknown)}")
        if "id" not in raw:
            raise RegistryError(f"{where}: needs an id")
        if raw.get("embedded"):
            continue  # the embedded model is always present
        aliases = raw.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise RegistryError(f"{where}: aliases must be a list of strings")
        if is_name_pattern(str(raw["id"])):
            raise RegistryError(f"{where}: an id cannot hold *, ? or [ (aliases may: "
                                "glob patterns)")
        if DEFAULT_ALIAS in (str(raw["id"]), *aliases):
            raise RegistryError(f"{where}: `{DEFAULT_ALIAS}` is reserved for the model the "
                                "server serves by default (serve --model)")
        if bool(raw.get("path")) == bool(raw.get("repo")):
            raise RegistryError(f"{where}: give either path or repo + file")
        if raw.get("repo") and not raw.get("file"):
            raise RegistryError(f"{where}: repo needs file")
        sha = raw.get("sha256")
        if sha is not None and not _SHA256.match(str(sha).lower()):
            raise RegistryError(f"{where}: sha256 must be 64 hex digits")
        template = raw.get("chat_template_file")
        for key in ("cache_type_k", "cache_type_v"):
            if key in raw and raw[key] not in KV_CACHE_TYPE_NAMES:
                raise RegistryError(
                    f"{where}: {key} must be one of {', '.join(KV_CACHE_TYPE_NAMES)}")
        entries.append(RegistryEntry(
            id=str(raw["id"]),
            aliases=tuple(aliases),
            path=Path(raw["path"]).expanduser() if raw.get("path") else None,
            repo=raw.get("repo"),
            file=raw.get("file"),
            revision=str(raw.get("revision", "main")),
            sha256=str(sha).lower() if sha else None,
            ctx_size=int(raw.get("ctx_size", 0)),
            chat_template_file=(path.parent / template) if template else None,
            mmproj=_mmproj(raw, path),
            keep_alive=float(raw["keep_alive"]) if "keep_alive" in raw else None,
            cache_type_k=raw.get("cache_type_k"),
            cache_type_v=raw.get("cache_type_v"),
            lora=_lora(raw, path),
            draft=_local_file(raw, "draft", path),
        ))
    names = [n for e in entries for n in e.names]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise RegistryError(f"{path.name}: names used twice: {sorted(duplicates)}")
    return entries


def _local_file(raw: dict[str, Any], key: str, registry: Path) -> Path | None:
    """A local file's path (relative ones relative to the registry file)."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RegistryError(f"{registry.name}: {key} must be a file path")
    return registry.parent / Path(value).expanduser()


def _lora(raw: dict[str, Any], registry: Path) -> tuple[LoraSpec, ...]:
    """`lora = ["adapter.gguf", "other.gguf:0.5"]`: files (relative ones relative to the
    registry file), each with its default scale."""
    value = raw.get("lora", [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RegistryError(f"{registry.name}: lora must be a list of FILE or FILE:SCALE")
    try:
        specs = [parse_lora_spec(v) for v in value]
    except ValueError as exc:
        raise RegistryError(f"{registry.name}: lora: {exc}") from exc
    return tuple(LoraSpec(registry.parent / s.path, s.scale) for s in specs)


def _mmproj(raw: dict[str, Any], registry: Path) -> str | None:
    """A repo model's projector is a file name in its repo; a local model's is a path,
    made absolute here (relative ones are relative to the registry file)."""
    value = raw.get("mmproj")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise RegistryError(f"{registry.name}: mmproj must be a file name or path")
    if raw.get("repo"):
        return value
    return str(registry.parent / Path(value).expanduser())


class ModelStore:
    def __init__(self, models_dir: Path, entries: list[RegistryEntry],
                 min_free_bytes: int = 0, default_model_quant: str = AUTO,
                 repack: str = "auto") -> None:
        """`min_free_bytes`: free disk a pull must leave in the models directory.
        `default_model_quant`: what the embedded model is served from (--default-model-quant),
        on the CPU kernels `repack` (--repack) gives it."""
        self.models_dir = models_dir
        self.entries = entries
        self.min_free_bytes = min_free_bytes
        self.default_model_quant = default_model_quant
        self.repack = repack

    def find(self, name: str) -> RegistryEntry | None:
        return next((e for e in self.entries if name in e.names), None)

    def hub_path(self, repo: str, file: str) -> Path:
        return self.models_dir / repo / file

    def local_path(self, entry: RegistryEntry) -> Path | None:
        """Where the entry's GGUF file is on disk, or None when it is not there yet."""
        if entry.embedded:  # converted on first use (default_conversion.py)
            return served_default_model_path(self.default_model_quant, self.repack)
        path = entry.path if entry.path is not None else self.hub_path(entry.repo or "",
                                                                       entry.file or "")
        return path if path.is_file() else None

    def mmproj_path(self, entry: RegistryEntry) -> Path | None:
        """Where the entry's projector file should be (None: the model has none)."""
        if entry.mmproj is None:
            return None
        if entry.repo is not None:
            return self.hub_path(entry.repo, entry.mmproj)
        return Path(entry.mmproj)

    def missing_reason(self, entry: RegistryEntry) -> str:
        if entry.path is not None:
            return f"the file of model `{entry.id}` is missing on this server"
        return (f"model `{entry.id}` is not downloaded; run `edge-server pull {entry.id}` "
                "on the server")

    def download(self, repo: str, file: str, *, revision: str = "main",
                 sha256: str | None = None) -> HubDownload:
        """A download of a hub file into the models directory (not started): resumed,
        bounded by free disk, checked against `sha256` or else the Hub's own checksum."""
        return HubDownload(self.models_dir, repo, file, revision=revision, sha256=sha256,
                           min_free_bytes=self.min_free_bytes)

    def downloads_of(self, entry: RegistryEntry) -> list[HubDownload]:
        """A registry model's downloads: its file, then its projector (pulled with it)."""
        if entry.repo is None or entry.file is None:
            raise PullError(f"model `{entry.id}` is a local file, nothing to pull")
        downloads = [self.download(entry.repo, entry.file, revision=entry.revision,
                                   sha256=entry.sha256)]
        if entry.mmproj is not None:
            downloads.append(self.download(entry.repo, entry.mmproj, revision=entry.revision))
        return downloads

    def present_files(self) -> list[Path]:
        """GGUF files under the models directory, whether or not the registry names them."""
        if not self.models_dir.is_dir():
            return []
        return sorted(p for p in self.models_dir.rglob("*.gguf")
                      if ".cache" not in p.parts)
