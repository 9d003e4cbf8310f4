"""The models a server start serves: the registry and models directory (ModelStore), each
entry as a ModelSpec of the pool, and the stored-Responses database."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.catalogue.store import (
    ModelStore,
    RegistryEntry,
    RegistryError,
    load_registry,
)
from edge_server.config import (
    ServeOptions,
    default_models_dir,
)

if TYPE_CHECKING:
    from edge_server.api.openai.responses.store import ResponseStore
    from edge_server.engine.backend.lora import LoraSpec


log = logging.getLogger("edge_server")


_PROJECT_REGISTRY = Path(__file__).resolve().parents[2] / "models" / "registry.toml"


def registry_path(opts: ServeOptions, models_dir: Path) -> Path | None:
    if opts.registry is not None:
        return opts.registry
    for candidate in (models_dir / "registry.toml", _PROJECT_REGISTRY):
        if candidate.is_file():
            return candidate
    return None


def model_store(opts: ServeOptions) -> ModelStore:
    models_dir = opts.models_dir or default_models_dir()
    return ModelStore(models_dir, load_registry(registry_path(opts, models_dir)),
                      min_free_bytes=max(opts.min_free_disk_mb, 0) * 2**20,
                      default_model_quant=opts.default_model_quant, repack=opts.repack)


def model_specs(opts: ServeOptions, store: ModelStore):
    """Model specs for the pool, the id of the model to load at start, and how a registry
    entry becomes a spec (for models pulled while serving)."""
    from edge_server.catalogue.budget import memory_budget_bytes
    from edge_server.catalogue.spec import ModelSpec
    from edge_server.engine import ContextSettings, EngineSettings, SchedulerSettings
    from edge_server.engine.backend.rpc.rpc_devices import parse_endpoints
    from edge_server.engine.multimodal.audio import AudioLimits
    from edge_server.engine.multimodal.projector import ImageLimits

    rpc = parse_endpoints(opts.rpc)
    limits = ImageLimits(max_images=opts.max_images, max_bytes=int(opts.max_image_mb * 2**20),
                         max_pixels=opts.max_image_pixels, fetch_urls=opts.image_urls == "on",
                         fetch_timeout=opts.image_url_timeout,
                         fetch_networks=tuple(opts.image_url_networks))
    audio_limits = AudioLimits(max_bytes=int(min(max(opts.max_audio_mb, 0.001), 512) * 2**20),
                               max_seconds=min(max(opts.max_audio_seconds, 0.1), 3600.0))

    def settings(entry: RegistryEntry, template: Path | None, mmproj: Path | None,
                 lora: tuple[LoraSpec, ...] = (), draft: Path | None = None
                 ) -> EngineSettings:
        ctx_size = entry.ctx_size
        return EngineSettings(
            context=ContextSettings(
                n_ctx=ctx_size or opts.ctx_size,
                kv_budget_bytes=memory_budget_bytes(opts.memory_budget_mb * 2**20),
                n_threads=opts.threads,
                n_gpu_layers=opts.n_gpu_layers,
                repack=opts.repack,
                flash_attn=opts.flash_attn,
                n_seq_max=max(opts.parallel, 1),
                rpc=rpc,
                cache_type_k=entry.cache_type_k or opts.cache_type_k,
                cache_type_v=entry.cache_type_v or opts.cache_type_v,
            ),
            scheduler=SchedulerSettings(
                max_waiting=opts.max_queue,
                max_wait_seconds=opts.queue_timeout,
                adaptive_threads=opts.adaptive_threads == "on",
                draft_max=min(opts.draft_max, 16) if opts.draft_max >= 0 else -1,
                draft_min=min(max(opts.draft_min, 0), 16),
                stream_interval_ms=min(max(opts.stream_interval_ms, 0.0), 1000.0),
            ),
            chat_template=template.read_text(encoding="utf-8") if template else None,
            prompt_cache_dir=store.models_dir / "prompt-cache" if opts.prompt_cache_mb > 0
            else None,
            prompt_cache_mb=opts.prompt_cache_mb,
            mmproj=mmproj,
            image_limits=limits,
            audio_limits=audio_limits,
            truncation=opts.truncation,
            default_max_tokens=opts.default_max_tokens if opts.default_max_tokens > 0 else -1,
            max_answer_seconds=opts.max_answer_seconds,
            lora=lora or entry.lora,
            draft_model=draft or entry.draft,
            draft_cost_share=min(opts.draft_model_cost, 1.0) if opts.draft_model_cost >= 0
            else None,
        )

    def spec(entry: RegistryEntry, template: Path | None = None,
             mmproj: Path | None = None, lora: tuple[LoraSpec, ...] = (),
             draft: Path | None = None) -> ModelSpec:
        path = store.local_path(entry)
        return ModelSpec(
            entry.id, path, entry.aliases,
            settings(entry, template or entry.chat_template_file,
                     mmproj or store.mmproj_path(entry), lora, draft),
            keep_alive=entry.keep_alive,
            missing_reason="" if path else store.missing_reason(entry),
        )

    entries = list(store.entries)
    default_id = entries[0].id
    # `--model default` names the embedded model, as the alias did before any --model.
    wanted = None if opts.model == DEFAULT_ALIAS else opts.model
    if wanted is not None and store.find(wanted) is not None:
        default_id = store.find(wanted).id  # type: ignore[union-attr]
    elif wanted is not None:
        path = Path(wanted).expanduser()
        if not path.is_file():
            raise RegistryError(f"--model {wanted}: neither a registry model nor a file")
        name = path.name.removesuffix(".gguf")
        model_id = opts.model_id or name

        def taken(n: str) -> bool:
            return n == DEFAULT_ALIAS or store.find(n) is not None

        if taken(model_id):
            raise RegistryError(f"`{model_id}` already names a registry model (or is "
                                "reserved); choose another id with --model-id")
        # The file name is a convenience alias, dropped where a registry model has it.
        aliases = (name,) if model_id != name and not taken(name) else ()
        entries.append(RegistryEntry(model_id, aliases, path=path))
        default_id = model_id
    # --chat-template-file, --mmproj, --lora and --model-draft: the default model's only.
    templates = {default_id: opts.chat_template_file}
    projectors = {default_id: opts.mmproj}
    adapters = {default_id: _lora_options(opts)}
    if opts.model_draft is not None and not opts.model_draft.expanduser().is_file():
        raise RegistryError(f"--model-draft {opts.model_draft}: no such file")
    drafts = {default_id: opts.model_draft.expanduser() if opts.model_draft else None}
    specs = [spec(e, templates.get(e.id), projectors.get(e.id), adapters.get(e.id, ()),
                  drafts.get(e.id)) for e in entries]
    return specs, default_id, spec


def _lora_options(opts: ServeOptions) -> tuple[LoraSpec, ...]:
    """--lora FILE[:SCALE] (each item may list several, comma-separated, as
    llama-server's --lora does), at scale 0 with --lora-init-without-apply."""
    from edge_server.engine.backend.lora import LoraSpec, parse_lora_spec

    specs = []
    for item in (part for value in opts.lora for part in value.split(",") if part):
        try:
            spec = parse_lora_spec(item)
        except ValueError as exc:
            raise RegistryError(f"--lora {item}: {exc}") from exc
        if not spec.path.is_file():
            raise RegistryError(f"--lora {item}: no such file")
        specs.append(LoraSpec(spec.path, 0.0) if opts.lora_init_without_apply else spec)
    return tuple(specs)


def response_store(opts: ServeOptions, models_dir: Path) -> ResponseStore | None:
    """The Responses store in --state-dir (default: the models directory), or None where
    its caps store nothing. A --state-dir that fails stops `serve` (StoreError); the
    models directory failing (read-only, say) leaves the server without a store."""
    from edge_server.api.openai.responses.store import FILE_NAME, ResponseStore, StoreError

    if min(opts.response_store_count, opts.response_store_mb, opts.response_store_days) <= 0:
        return None
    try:
        return ResponseStore((opts.state_dir or models_dir) / FILE_NAME,
                             max_count=opts.response_store_count,
                             max_bytes=int(opts.response_store_mb * 2**20),
                             max_age_s=max(opts.response_store_days, 0.0) * 86400)
    except StoreError as exc:
        if opts.state_dir is not None:
            raise
        log.warning("%s; serving without stored Responses (answers say store: false, "
                    "previous_response_id is refused); give --state-dir a writable "
                    "directory to store them", exc)
        return None
