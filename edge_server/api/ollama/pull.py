"""POST /api/pull: a registry id, or a Hugging Face name as Ollama writes it
(`hf.co/{org}/{repo}:{quantization or file}`), downloaded into the models directory by
the model store (resuming, checksum-verified) while Ollama's progress objects stream:
`pulling manifest`, `pulling <digest>` with `total` and `completed`, `verifying sha256
digest`, `writing manifest`, `success`. A pulled model serves at once under that name.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...model_pool import ModelPool
from ...model_spec import ModelSpec
from ...model_store import ModelStore, PullError, RegistryEntry
from ..http.dependencies import parse_body, pool
from ..http.errors import APIError
from ..http.io_threads import run_io
from . import names
from .protocol import PullRequest
from .streaming import line, ndjson_stream

HUB_PREFIXES = ("hf.co/", "huggingface.co/")
_PROGRESS_EVERY_S = 0.25
_DEFAULT_QUANT = "q4_k_m"  # Ollama's choice for an untagged Hugging Face name


@dataclass
class Target:
    name: str  # the pool's name for it
    repo: str
    file: str
    revision: str = "main"
    sha256: str | None = None
    entry: RegistryEntry | None = None  # a registry model; None: a new hub model


def _hub_file(repo: str, tag: str) -> str:
    """The GGUF file of `repo` a tag names: the file itself, or the one whose name holds
    the quantization (q4_k_m when untagged)."""
    from huggingface_hub import list_repo_files

    if tag.endswith(".gguf"):
        return tag
    wanted = (_DEFAULT_QUANT if tag in ("", "latest") else tag).lower()
    try:
        files = [f for f in list_repo_files(repo) if f.endswith(".gguf")
                 and "mmproj" not in f.lower()]
    except Exception as exc:  # huggingface-hub's HTTP errors, offline, a bad repo name
        raise PullError(f"could not list the files of {repo}: {type(exc).__name__}") from exc
    matching = [f for f in files if wanted in f.lower()]
    if len(matching) == 1 or (matching and tag):
        return sorted(matching, key=len)[0]
    if not tag and len(files) == 1:
        return files[0]
    raise PullError(f"{repo} has no single GGUF file for the tag `{tag or 'latest'}`")


def resolve(store: ModelStore, name: str) -> Target:
    """What `name` pulls (blocking: a hub name may list its repo's files)."""
    for candidate in (name, name.removesuffix(names.LATEST)):
        entry = store.find(candidate)
        if entry is not None:
            if entry.repo is None or entry.file is None:
                return Target(entry.id, "", "", entry=entry)  # local or embedded
            return Target(entry.id, entry.repo, entry.file, entry.revision, entry.sha256,
                          entry)
    if name.startswith(HUB_PREFIXES):
        path = name.split("/", 1)[1]
        repo, _, tag = path.partition(":")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise names.not_found(name)
        return Target(name.removesuffix(names.LATEST), repo, _hub_file(repo, tag))
    raise names.not_found(name)


def _partial_size(directory: Path, file: str) -> int:
    """Bytes downloaded so far: huggingface-hub's `.incomplete` file in the target."""
    cache = directory / ".cache"
    sizes = [p.stat().st_size for p in cache.rglob("*.incomplete")
             if p.name.startswith(Path(file).name)] if cache.is_dir() else []
    return max(sizes, default=0)


async def _progress(store: ModelStore, models: ModelPool, target: Target,
                    make_spec: Callable[[RegistryEntry], ModelSpec]
                    ) -> AsyncIterator[dict[str, Any]]:
    yield {"status": "pulling manifest"}
    if target.entry is not None and not target.repo:
        yield {"status": "success"}  # a local file: nothing to download
        return
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        meta = await run_io(get_hf_file_metadata,
                            hf_hub_url(target.repo, target.file, revision=target.revision))
    except Exception as exc:
        raise APIError(502, f"pull model manifest: {target.repo}/{target.file} could not be "
                       f"reached ({type(exc).__name__})", code="pull_failed") from exc
    total = int(meta.size or 0)
    digest = "sha256:" + (target.sha256 or (meta.etag or "").strip('"'))
    status = f"pulling {digest.removeprefix('sha256:')[:12]}"
    outcome: dict[str, Any] = {}

    def download() -> None:
        try:
            if target.entry is not None:
                outcome["path"] = store.pull_entry(target.entry)
            else:
                outcome["path"] = store.pull(target.repo, target.file, revision=target.revision)
        except PullError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=download, name="ollama-pull", daemon=True)
    worker.start()
    directory = store.models_dir / target.repo
    sent = -1
    while worker.is_alive():
        done = _partial_size(directory, target.file)
        if done != sent:
            sent = done
            yield {"status": status, "digest": digest, "total": total, "completed": done}
        await asyncio.sleep(_PROGRESS_EVERY_S)
    if "error" in outcome:
        raise APIError(502, f"pull failed: {outcome['error']}", code="pull_failed")
    yield {"status": status, "digest": digest, "total": total, "completed": total}
    yield {"status": "verifying sha256 digest"}
    path: Path = outcome["path"]
    if target.entry is not None:
        models.set_file(target.entry.id, path)
    elif target.name not in {n for s in models.specs for n in s.names}:
        models.add_model(make_spec(RegistryEntry(target.name, repo=target.repo,
                                                 file=target.file)))
    else:
        models.set_file(target.name, path)
    yield {"status": "writing manifest"}
    yield {"status": "success"}


async def pull(request: Request) -> Response:
    body = await parse_body(request, PullRequest)
    state = request.app.state
    store: ModelStore | None = getattr(state, "store", None)
    make_spec = getattr(state, "make_spec", None)
    if store is None or make_spec is None:
        raise APIError(400, "this server has no models directory to pull into",
                       code="unsupported_endpoint")
    try:
        target = await run_io(resolve, store, body.model)
    except PullError as exc:
        raise APIError(404, f"pull model manifest: {exc}", param="model",
                       code="model_not_found") from exc
    steps = _progress(store, pool(request), target, make_spec)
    if body.stream is False:
        last: dict[str, Any] = {}
        async for step in steps:
            last = step
        return JSONResponse(last)

    async def lines() -> AsyncIterator[str]:
        try:
            async for step in steps:
                yield line(step)
        except APIError as exc:
            yield line({"error": exc.message})

    return ndjson_stream(lines())
