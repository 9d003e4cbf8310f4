"""Command line: `edge-server serve` and friends."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__
from .default_model import (
    DEFAULT_MODEL_ALIASES,
    DEFAULT_MODEL_ID,
    DefaultModelMissing,
    default_model_path,
)
from .engine import ContextSettings, EngineSettings, SchedulerSettings
from .model_registry import ModelRegistry, ModelSpec

log = logging.getLogger("edge_server")


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="GGUF file to serve (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--model-id",
        default=None,
        help="id clients name in `model` (default: the file name without .gguf)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--ctx-size",
        type=int,
        default=0,
        help="KV cache size in tokens, shared by all sequences "
        "(default: the model's training context, at most 8192)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument(
        "--parallel", type=int, default=8, help="requests decoded together in one batch (default 8)"
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a free slot before 429 (default 64)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=120.0,
        help="seconds a request may wait for a slot before a 503 (default 120)",
    )
    p.add_argument(
        "--chat-template-file",
        type=Path,
        default=None,
        help="Jinja chat template to use instead of the one in the GGUF file",
    )
    p.add_argument(
        "--n-gpu-layers",
        type=int,
        default=-1,
        help="layers to offload to a GPU backend (default: all; 0 keeps the CPU)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )


def _model_spec(args: argparse.Namespace) -> ModelSpec:
    template = None
    if args.chat_template_file is not None:
        template = args.chat_template_file.read_text(encoding="utf-8")
    settings = EngineSettings(
        context=ContextSettings(
            n_ctx=args.ctx_size,
            n_threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            n_seq_max=max(args.parallel, 1) + 128,
        ),
        scheduler=SchedulerSettings(
            slots=args.parallel, max_waiting=args.max_queue, max_wait_seconds=args.queue_timeout
        ),
        chat_template=template,
    )
    if args.model is None:
        return ModelSpec(DEFAULT_MODEL_ID, default_model_path(), DEFAULT_MODEL_ALIASES, settings)
    path = args.model.expanduser()
    name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    model_id = args.model_id or name
    aliases = (name,) if model_id != name else ()
    return ModelSpec(model_id, path, aliases, settings)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .api.app import create_app

    try:
        spec = _model_spec(args)
    except (DefaultModelMissing, OSError) as exc:
        print(f"edge-server: {exc}", file=sys.stderr)
        return 2
    if not spec.path.is_file():
        print(f"edge-server: model file not found: {spec.path}", file=sys.stderr)
        return 2
    app = create_app(ModelRegistry([spec]))
    log.info("serving %s on http://%s:%d", spec.id, args.host, args.port)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=30
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-server", description=__doc__)
    parser.add_argument("--version", action="version", version=f"edge-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return serve(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
