"""Command line: `edge-server serve | pull | models | info`.

    serve.py      `serve`: the app built over the models, uvicorn run
    specs.py      the registry, the models directory and stored Responses, as the pool's specs
    commands.py   `pull`, `models` and `info`
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from edge_server import __version__
from edge_server.cli.commands import info, list_models, pull
from edge_server.cli.serve import serve
from edge_server.config import add_serve_arguments, resolve_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edge-server",
        description="Serve GGUF models over the OpenAI, Anthropic, Ollama and llama-server APIs.")
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
