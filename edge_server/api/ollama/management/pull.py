"""POST /api/pull: a registry id, or a Hugging Face name as Ollama writes it
(`hf.co/{org}/{repo}:{quantization or file}`), downloaded into the models directory
(hub_download.py: resumed, bounded by free disk, checksum-verified) while Ollama's progress
objects stream: `pulling manifest`, `pulling <digest>` with `total` and `completed`,
`verifying sha256 digest`, `writing manifest`, `success`. A pulled model serves at once
under that name.

Pulls need an admin key where keys are set. A hub file is one its repo lists; a pull never
gives a name another model holds new weights (409); at most two run at once, one per file
(pull_jobs.py); a client that leaves cancels its download (the next pull resumes it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from edge_server.api.http.dependencies import parse_body, pool
from edge_server.api.http.errors import APIError
from edge_server.api.http.guards.auth import require_admin
from edge_server.api.http.io_threads import run_io
from edge_server.api.ollama import names
from edge_server.api.ollama.management.pull_jobs import PullJob, PullJobs
from edge_server.api.ollama.protocol import PullRequest
from edge_server.api.ollama.streaming import NDJSON, line
from edge_server.catalogue.hub_download import HubDownload, InsufficientStorage, PullCancelled
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec, UnknownModel
from edge_server.catalogue.store import ModelStore, PullError, RegistryEntry

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
    """The GGUF file of `repo` a tag names, one the repo lists: the file itself, or the
    one whose name holds the quantization (q4_k_m when untagged)."""
    from huggingface_hub import list_repo_files

    try:
        files = [f for f in list_repo_files(repo) if f.endswith(".gguf")
                 and "mmproj" not in f.lower()]
    except Exception as exc:  # huggingface-hub's HTTP errors, offline, a bad repo name
        raise PullError(f"could not list the files of {repo}: {type(exc).__name__}") from exc
    if tag.endswith(".gguf"):
        if tag in files:
            return tag
        raise PullError(f"{repo} has no file `{tag[:200]}`")
    wanted = (_DEFAULT_QUANT if tag in ("", "latest") else tag).lower()
    matching = [f for f in files if wanted in f.lower()]
    if len(matching) == 1 or (matching and tag):
        return sorted(matching, key=len)[0]
    if not tag and len(files) == 1:
        return files[0]
    raise PullError(f"{repo} has no single GGUF file for the tag `{tag[:200] or 'latest'}`")


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


def _named(models: ModelPool, name: str) -> bool:
    try:
        models.spec(name)
    except UnknownModel:
        return False
    return True


def _name_held(models: ModelPool, name: str) -> str | None:
    """The model `name` answers for when it is another model's name (a copy, an alias),
    else None: a pull must not give that model new weights."""
    try:
        spec = models.spec(name)
    except UnknownModel:
        return None
    return spec.id if spec.id != name else None


def _refuse_held(models: ModelPool, store: ModelStore, target: Target) -> None:
    """409 where a hub pull would replace the weights another name serves: a name that
    is an alias, or a model of that name with another file."""
    if target.entry is not None:
        return  # a registry model: its own file
    holder = _name_held(models, target.name)
    if holder is None and _named(models, target.name):
        path = models.spec(target.name).path
        if path is not None and path != store.hub_path(target.repo, target.file):
            holder = target.name
    if holder is not None:
        raise APIError(409, f"`{target.name}` names model `{holder}`: a pull does not "
                       "replace the weights behind a name (delete the name first)",
                       param="model", code="name_taken")


def _error_of(exc: PullError) -> APIError:
    if isinstance(exc, InsufficientStorage):
        return APIError(507, str(exc), type="server_error", code="insufficient_storage")
    return APIError(502, f"pull failed: {exc}", type="server_error", code="pull_failed")


def _register(models: ModelPool, store: ModelStore, target: Target, path: Path,
              make_spec: Callable[[RegistryEntry], ModelSpec]) -> None:
    """The pulled file serves under the target's name from now on."""
    if target.entry is not None:
        models.set_file(target.entry.id, path)
        return
    _refuse_held(models, store, target)  # a copy may have taken the name meanwhile
    if _named(models, target.name):
        models.set_file(target.name, path)  # the same hub model, pulled again
    else:
        models.add_model(make_spec(RegistryEntry(target.name, repo=target.repo,
                                                 file=target.file)))


async def _progress(job: PullJob, register: Callable[[Path], None],
                    client_left: Callable[[], Awaitable[bool]]
                    ) -> AsyncIterator[dict[str, Any]]:
    main = job.main
    digest = "sha256:" + main.digest
    status = f"pulling {main.digest[:12]}"
    yield {"status": "pulling manifest"}
    sent = -1
    while not await job.wait(_PROGRESS_EVERY_S):
        if await client_left():
            job.cancel()  # the download stops at its next chunk; the next pull resumes it
            return
        if main.done != sent:  # a byte counter: nothing on the disk is read
            sent = main.done
            yield {"status": status, "digest": digest, "total": main.total, "completed": sent}
    try:
        path = job.result()
    except PullCancelled:
        return
    except PullError as exc:
        raise _error_of(exc) from exc
    yield {"status": status, "digest": digest, "total": main.total, "completed": main.total}
    yield {"status": "verifying sha256 digest"}
    register(path)
    yield {"status": "writing manifest"}
    yield {"status": "success"}


class _CancelledOnExit(StreamingResponse):
    """The progress stream; the pull is cancelled however sending ends (the client gone
    before the first line included)."""

    def __init__(self, lines: AsyncIterator[str], job: PullJob) -> None:
        super().__init__(lines, media_type=NDJSON,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def _jobs(request: Request) -> PullJobs:
    state = request.app.state
    if getattr(state, "pull_jobs", None) is None:
        state.pull_jobs = PullJobs()
    jobs: PullJobs = state.pull_jobs
    return jobs


def _downloads(store: ModelStore, target: Target) -> list[HubDownload]:
    if target.entry is not None:
        return store.downloads_of(target.entry)
    return [store.download(target.repo, target.file, revision=target.revision)]


async def _started(request: Request, store: ModelStore, target: Target) -> PullJob:
    """The pull's downloads, their place taken and the first one prepared (its size and
    checksum asked, the disk checked), running."""
    try:
        downloads = _downloads(store, target)
    except PullError as exc:
        raise APIError(400, f"pull model manifest: {exc}", param="model") from exc
    job = _jobs(request).claim(downloads)
    try:
        await run_io(job.main.prepare)
    except PullError as exc:
        job.abandon()
        raise _error_of(exc) from exc
    except BaseException:
        job.abandon()
        raise
    job.start()
    return job


async def pull(request: Request) -> Response:
    require_admin(request, "pulling a model")
    body = await parse_body(request, PullRequest)
    state = request.app.state
    store: ModelStore | None = getattr(state, "store", None)
    make_spec = getattr(state, "make_spec", None)
    if store is None or make_spec is None:
        raise APIError(400, "this server has no models directory to pull into",
                       code="unsupported_endpoint")
    models = pool(request)
    for candidate in (body.model, body.model.removesuffix(names.LATEST)):
        holder = _name_held(models, candidate) if body.model.startswith(HUB_PREFIXES) else None
        if holder is not None and store.find(candidate) is None:  # refused before the hub
            raise APIError(409, f"`{candidate}` names model `{holder}`: a pull does not "
                           "replace the weights behind a name", param="model",
                           code="name_taken")
    try:
        target = await run_io(resolve, store, body.model)
    except PullError as exc:
        raise APIError(404, f"pull model manifest: {exc}", param="model",
                       code="model_not_found") from exc
    _refuse_held(models, store, target)
    if target.entry is not None and not target.repo:
        return JSONResponse({"status": "success"})  # a local file: nothing to download
    job = await _started(request, store, target)
    steps = _progress(job, lambda path: _register(models, store, target, path, make_spec),
                      request.is_disconnected)
    if body.stream is False:
        last: dict[str, Any] = {}
        try:
            async for step in steps:
                last = step
        finally:
            job.cancel()  # a no-op once it is done
        return JSONResponse(last)

    async def lines() -> AsyncIterator[str]:
        try:
            async for step in steps:
                yield line(step)
        except APIError as exc:
            yield line({"error": exc.message})

    return _CancelledOnExit(lines(), job)
