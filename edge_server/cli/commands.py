"""`edge-server pull | models | info`: a model downloaded, the models known, and what
this llama.cpp build and machine offer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_server import __version__
from edge_server.catalogue.hub_download import run_showing_progress
from edge_server.catalogue.store import PullError
from edge_server.cli.specs import model_store
from edge_server.config import ServeOptions


def pull(opts: ServeOptions, args: argparse.Namespace) -> int:
    store = model_store(opts)
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
    store = model_store(opts)
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
