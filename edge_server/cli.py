"""Command line: `edge-server serve | pull | models | info`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edge_server import __version__
from edge_server.catalogue.default_model import DEFAULT_ALIAS, DefaultModelMissing
from edge_server.catalogue.hub_download import run_showing_progress
from edge_server.catalogue.store import (
    ModelStore,
    PullError,
    RegistryEntry,
    RegistryError,
    load_registry,
)
from edge_server.config import (
    ServeOptions,
    add_serve_arguments,
    default_models_dir,
    resolve_options,
)

if TYPE_CHECKING:
    from edge_server.api.openai.responses.store import ResponseStore

log = logging.getLogger("edge_server")

_PROJECT_REGISTRY = Path(__file__).resolve().parent.parent / "models" / "registry.toml"


def _registry_path(opts: ServeOptions, models_dir: Path) -> Path | None:
    if opts.registry is not None:
        return opts.registry
    for candidate in (models_dir / "registry.toml", _PROJECT_REGISTRY):
        if candidate.is_file():
            return candidate
    return None


def _store(opts: ServeOptions) -> ModelStore:
    models_dir = opts.models_dir or default_models_dir()
    return ModelStore(models_dir, load_registry(_registry_path(opts, models_dir)),
                      min_free_bytes=max(opts.min_free_disk_mb, 0) * 2**20,
                      default_model_quant=opts.default_model_quant, repack=opts.repack)


def _specs(opts: ServeOptions, store: ModelStore):
    """Model specs for the pool, the id of the model to load at start, and how a registry
    entry becomes a spec (for models pulled while serving)."""
    from edge_server.catalogue.budget import memory_budget_bytes
    from edge_server.catalogue.spec import ModelSpec
    from edge_server.engine import ContextSettings, EngineSettings, SchedulerSettings
    from edge_server.engine.backend.rpc.rpc_devices import parse_endpoints
    from edge_server.engine.multimodal.projector import ImageLimits

    rpc = parse_endpoints(opts.rpc)
    limits = ImageLimits(max_images=opts.max_images, max_bytes=int(opts.max_image_mb * 2**20),
                         max_pixels=opts.max_image_pixels, fetch_urls=opts.image_urls == "on",
                         fetch_timeout=opts.image_url_timeout,
                         fetch_networks=tuple(opts.image_url_networks))

    def settings(entry: RegistryEntry, template: Path | None, mmproj: Path | None
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
                stream_interval_ms=min(max(opts.stream_interval_ms, 0.0), 1000.0),
            ),
            chat_template=template.read_text(encoding="utf-8") if template else None,
            prompt_cache_dir=store.models_dir / "prompt-cache" if opts.prompt_cache_mb > 0
            else None,
            prompt_cache_mb=opts.prompt_cache_mb,
            mmproj=mmproj,
            image_limits=limits,
            truncation=opts.truncation,
        )

    def spec(entry: RegistryEntry, template: Path | None = None,
             mmproj: Path | None = None) -> ModelSpec:
        path = store.local_path(entry)
        return ModelSpec(
            entry.id, path, entry.aliases,
            settings(entry, template or entry.chat_template_file,
                     mmproj or store.mmproj_path(entry)),
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
    # --chat-template-file and --mmproj apply to the default model only.
    templates = {default_id: opts.chat_template_file}
    projectors = {default_id: opts.mmproj}
    specs = [spec(e, templates.get(e.id), projectors.get(e.id)) for e in entries]
    return specs, default_id, spec


def _response_store(opts: ServeOptions, models_dir: Path) -> ResponseStore | None:
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


def _allowed_hosts(opts: ServeOptions) -> list[str]:
    """--allowed-hosts (items may be comma-separated), plus the address served on unless
    it is a wildcard."""
    hosts = [h.strip() for item in opts.allowed_hosts for h in item.split(",") if h.strip()]
    if opts.host not in ("", "0.0.0.0", "::"):
        hosts.append(opts.host)
    return hosts


def tls_options(opts: ServeOptions) -> dict[str, str]:
    """uvicorn's TLS settings: both files or neither, each readable (a clear message, not
    a traceback from the ssl module at start)."""
    files = {"ssl_certfile": opts.ssl_certfile, "ssl_keyfile": opts.ssl_keyfile}
    given = {k: v for k, v in files.items() if v is not None}
    if not given:
        return {}
    if len(given) == 1:
        raise ValueError("--ssl-certfile and --ssl-keyfile go together: give both")
    for name, path in given.items():
        if not path.is_file():
            raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
    return {k: str(v) for k, v in given.items()}


def serve(opts: ServeOptions) -> int:
    import uvicorn

    from edge_server.api.app import create_app
    from edge_server.api.http.guards.cors import check_origin
    from edge_server.api.http.metrics import Metrics
    from edge_server.api.http.replica import check_replica_name
    from edge_server.api.http.send_buffers import SendBuffers
    from edge_server.api.openai.responses.store import StoreError
    from edge_server.catalogue.pool import ModelPool
    from edge_server.engine.backend.rpc import rpc_guard
    from edge_server.engine.backend.rpc.rpc_devices import RpcError, check_servers, parse_endpoints
    from edge_server.process.malloc_tuning import fix_mmap_threshold
    from edge_server.process.send_timeout import http_protocol
    from edge_server.process.shutdown import DrainingServer, exit_when_drained
    from edge_server.process.systemd_notify import notify, watchdog_interval

    fix_mmap_threshold()  # before the models load: their buffers come and go from here on
    try:
        store = _store(opts)
        specs, default_id, make_spec = _specs(opts, store)
        keys = opts.api_keys()
        admin_keys = opts.admin_api_keys()
        tls = tls_options(opts)
        replica = check_replica_name(opts.replica_name or f"{socket.gethostname()}:{opts.port}")
        # Unreachable servers fail here, clearly, not as an abort inside llama.cpp.
        check_servers(parse_endpoints(opts.rpc))
        for origin in opts.cors_origins:
            check_origin(origin)
    except (DefaultModelMissing, RegistryError, RpcError, OSError, ValueError) as exc:
        print(f"edge-server: {exc}", file=sys.stderr)
        return 2
    default_spec = next(s for s in specs if s.id == default_id)
    if default_spec.path is None:
        print(f"edge-server: {default_spec.missing_reason}", file=sys.stderr)
        return 2
    try:
        responses = _response_store(opts, store.models_dir)
    except StoreError as exc:
        print(f"edge-server: {exc}", file=sys.stderr)
        return 2
    metrics = Metrics()
    send_buffers = SendBuffers(int(opts.send_buffer_mb * 1024 * 1024), opts.send_timeout)
    metrics.watch_send_buffers(send_buffers)
    pool = ModelPool(specs, default=default_id, memory_budget=opts.memory_budget_mb * 1024 * 1024,
                     keep_alive=opts.keep_alive, on_job_done=metrics.observe_job,
                     serve_unknown=opts.serve_unknown_models)
    app = create_app(pool, preload=default_id, metrics=metrics, api_keys=keys,
                     admin_api_keys=admin_keys,
                     max_body_mb=opts.max_body_mb, replica_name=replica,
                     webui=not opts.no_webui, cors_origins=opts.cors_origins, store=store,
                     make_spec=make_spec, allowed_hosts=_allowed_hosts(opts),
                     admitted_per_model=max(opts.parallel, 1) + opts.max_queue,
                     slots=opts.slots, responses=responses)
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level=opts.log_level,
                            timeout_graceful_shutdown=int(opts.drain_timeout),
                            http=http_protocol(send_buffers, opts.limit_concurrency),
                            **tls)  # type: ignore[arg-type]
    app.state.watchdog_seconds = opts.watchdog_seconds
    server = DrainingServer(config, app.state.drain)
    exit_code = 0

    async def watchdog_pings(interval: float) -> None:
        # Pings prove the event loop runs and no engine step is stuck: when either
        # freezes, the pings stop and systemd restarts the service.
        while True:
            if not pool.stalled(opts.watchdog_seconds) and not rpc_guard.failure():
                notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def announce_ready() -> None:
        nonlocal exit_code
        while not (server.started and app.state.ready):
            if app.state.startup_error:
                exit_code = 1
                server.should_exit = True
                return
            await asyncio.sleep(0.05)
        loop_kind = type(asyncio.get_running_loop()).__module__.split(".")[0]
        log.info("serving %s on http://%s:%d (event loop: %s)", default_id, opts.host,
                 opts.port, loop_kind)
        notify("READY=1\nSTATUS=serving")

    async def run() -> None:
        announcer = asyncio.create_task(announce_ready())
        drainer = asyncio.create_task(exit_when_drained(server, opts.drain_timeout, notify))
        interval = watchdog_interval()
        pinger = asyncio.create_task(watchdog_pings(interval)) if interval else None
        try:
            await server.serve()
        finally:
            announcer.cancel()
            drainer.cancel()
            if pinger is not None:
                pinger.cancel()
            notify("STOPPING=1")

    # A second SIGTERM goes to uvicorn, which re-raises it after its shutdown; this no-op
    # handler receives it, so a stop ends with exit status 0 as systemd expects.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # uvicorn's own loop choice (uvloop where installed): serve() alone would run on
    # asyncio's, whose cross-thread wake-up releases the GIL, and every streamed token
    # then cost the engine thread a wait for the event loop's work (about 0.5 ms of a
    # 30 ms step on a 1.5B model).
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(run())
    return exit_code


def pull(opts: ServeOptions, args: argparse.Namespace) -> int:
    store = _store(opts)
    try:
        if args.file is None:
            entry = store.find(args.name)
            if entry is None:
                print(f"edge-server: no model `{args.name}` in the registry; give REPO FILE",
                      file=sys.stderr)
                return 2
            if entry.embedded:  # nothing to download: the file it is served from
                print(store.local_path(entry))
                return 0
            downloads = store.downloads_of(entry)
        else:
            downloads = [store.download(args.name, args.file, revision=args.revision,
                                        sha256=args.sha256)]
        paths = [run_showing_progress(download, sys.stderr) for download in downloads]
    except PullError as exc:
        print(f"edge-server: {exc}", file=sys.stderr)
        return 1
    print(paths[0])
    return 0


def _describe(path: Path) -> str:
    """Architecture, size and quantization from the GGUF header (vocab-only load)."""
    import ctypes

    import llama_cpp as lc

    from edge_server.engine.backend.runtime import init_backend

    init_backend()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return "unreadable"
    try:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")
    finally:
        lc.llama_model_free(model)


def _reads(mmproj: Path | None) -> str:
    """What a model reads besides text, from its projector's metadata."""
    if mmproj is None:
        return ""
    from edge_server.engine.multimodal.projector_check import projector_modalities

    kinds = projector_modalities(mmproj) if mmproj.is_file() else ()
    if not kinds:
        return f"  [projector {mmproj.name} missing or unreadable]"
    return f"  [reads text, {', '.join(kinds)}]"


def list_models(opts: ServeOptions) -> int:
    store = _store(opts)
    print(f"models directory: {store.models_dir}")
    print(f"{'id':28} {'status':15} {'size':>9}  description / file")
    listed: set[Path] = set()
    for entry in store.entries:
        path = store.local_path(entry)
        if path is None:
            where = f"{entry.repo}/{entry.file}" if entry.repo else str(entry.path)
            print(f"{entry.id:28} {'not downloaded':15} {'-':>9}  {where}")
            continue
        listed.add(path.resolve())
        size = f"{path.stat().st_size / 1e6:.0f} MB"
        print(f"{entry.id:28} {'present':15} {size:>9}  {_describe(path)}  {path.name}"
              f"{_reads(store.mmproj_path(entry))}")
    for path in store.present_files():
        if path.resolve() not in listed:
            size = f"{path.stat().st_size / 1e6:.0f} MB"
            print(f"{'(unregistered)':28} {'present':15} {size:>9}  {_describe(path)}  {path}")
    return 0


def info(opts: ServeOptions) -> int:
    import os

    import llama_cpp as lc

    from edge_server.engine.backend.llama_model import default_threads
    from edge_server.engine.backend.runtime import init_backend

    init_backend()
    features = lc.llama_print_system_info().decode().strip()
    print(f"edge-server {__version__}, llama-cpp-python {lc.__version__}")
    print(f"GPU offload: {'yes' if lc.llama_supports_gpu_offload() else 'no'}   "
          f"mmap: {'yes' if lc.llama_supports_mmap() else 'no'}")
    backends = [name for name in ("Metal", "CUDA", "Vulkan", "BLAS") if name.upper() in
                features.upper()]
    print(f"backends: CPU{''.join(', ' + b for b in backends)}")
    print(f"CPU features: {features}")
    print(f"threads: {opts.threads or default_threads()} of {os.cpu_count()} cores")
    print(f"RPC: {'yes' if lc.llama_supports_rpc() else 'no (see docs/deployment.md)'}")
    if opts.rpc:
        from edge_server.engine.backend.rpc.rpc_devices import (
            RpcError,
            describe_servers,
            parse_endpoints,
        )

        try:
            for line in describe_servers(parse_endpoints(opts.rpc)):
                print(line)
        except RpcError as exc:
            print(f"edge-server: {exc}", file=sys.stderr)
            return 2
    return list_models(opts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-server", description=__doc__)
    parser.add_argument("--version", action="version", version=f"edge-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="serve models over the OpenAI-compatible HTTP API")
    add_serve_arguments(serve_p)
    pull_p = sub.add_parser("pull", help="download a model from the Hugging Face Hub")
    pull_p.add_argument("name", help="registry model id, or a Hugging Face repo id")
    pull_p.add_argument("file", nargs="?", help="GGUF file in the repo (with a repo id)")
    pull_p.add_argument("--revision", default="main", help="branch, tag or commit")
    pull_p.add_argument("--sha256", default=None, help="expected SHA-256 of the file")
    models_p = sub.add_parser("models", help="list registered and downloaded models")
    info_p = sub.add_parser("info", help="llama.cpp build, backends, CPU features, models")
    for p in (pull_p, models_p, info_p):
        for flag in ("--registry", "--models-dir", "--config"):
            p.add_argument(flag, type=Path, default=argparse.SUPPRESS)
    info_p.add_argument("--rpc", action="append", default=argparse.SUPPRESS,
                        help="also list the devices of these rpc-servers (HOST:PORT)")
    args = parser.parse_args(argv)
    try:
        opts = resolve_options(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=getattr(logging, opts.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return serve(opts)
    if args.command == "pull":
        return pull(opts, args)
    if args.command == "models":
        return list_models(opts)
    return info(opts)


if __name__ == "__main__":
    raise SystemExit(main())
