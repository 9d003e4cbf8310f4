"""`edge-server serve`: options checked, models and stores opened, the app built, and
uvicorn run with signals, systemd notifications and TLS."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys

from edge_server.catalogue.default_model import DefaultModelMissing
from edge_server.catalogue.store import RegistryError
from edge_server.cli.specs import model_specs, model_store, response_store
from edge_server.config import ServeOptions

log = logging.getLogger("edge_server")


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
        store = model_store(opts)
        specs, default_id, make_spec = model_specs(opts, store)
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
        responses = response_store(opts, store.models_dir)
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
