"""The models one server serves: loaded on first use within a memory budget, unloaded
after an idle time (like Ollama's keep_alive) or, least recently used first, to make room.
Which model a name answers for is names.py's, which the pool builds on.

What each model is charged is budget.py's; a load that cannot fit, even with every
idle model unloaded, is refused rather than overcommitted.

A request holds a lease on its model's engine from the moment it is routed until its
response is finished, so a model is never unloaded under a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edge_server.catalogue.budget import Budget
from edge_server.catalogue.names import ModelNames
from edge_server.catalogue.spec import ModelSpec
from edge_server.engine import Engine
from edge_server.engine.sched.scheduler import JobStats

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """Known, but cannot be served now: not downloaded, failed to load, or no memory."""

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# A model that failed to load is not tried again for this long, doubling per failure:
# a broken file must not cost a full load (and its memory) on every request.
_LOAD_BACKOFF_FIRST_S = 2.0
_LOAD_BACKOFF_MAX_S = 300.0


@dataclass
class _LoadFailure:
    message: str
    count: int
    retry_at: float


@dataclass
class _Loaded:
    engine: Engine
    load_seconds: float
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    keep_alive: float | None = None  # set by a request (Ollama's keep_alive); None: spec's


def _public_reason(exc: Exception) -> str:
    """The kind of failure without file paths, for clients."""
    name = type(exc).__name__
    if "Load" in name:
        # A projector's problem is the operator's to fix and names no path: say it.
        text = str(exc)
        return text if text.startswith("multimodal projector") else (
            "the model file could not be loaded")
    return "see the server log"


class Lease:
    def __init__(self, pool: ModelPool, model_id: str, engine: Engine) -> None:
        self._pool = pool
        self.model_id = model_id
        self.engine = engine
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self.model_id)


class ModelPool(ModelNames):
    def __init__(
        self,
        specs: list[ModelSpec],
        *,
        default: str | None = None,
        memory_budget: int = 0,
        keep_alive: float = 300.0,
        on_job_done: Callable[[str, JobStats], None] | None = None,
        serve_unknown: bool = False,
    ) -> None:
        """The names are ModelNames' (`default`, `serve_unknown`); `memory_budget`: bytes
        for loaded models (0: 75% of RAM); `keep_alive`: seconds a model stays after its
        last use, where its spec does not say."""
        super().__init__(specs, default=default, serve_unknown=serve_unknown)
        self._budget = Budget(memory_budget)
        self.memory_budget = self._budget.total
        self.keep_alive = keep_alive
        self._on_job_done = on_job_done
        self._loaded: dict[str, _Loaded] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.load_errors: dict[str, str] = {}
        self._failures: dict[str, _LoadFailure] = {}
        self.load_seconds: dict[str, float] = {}
        self._unloading: set[asyncio.Task[bool]] = set()
        self._reserved = self._budget.reserved  # held by models being loaded or freed

    # --- lookup and leases -------------------------------------------------------------

    def is_loaded(self, model_id: str) -> bool:
        return model_id in self._loaded

    def loaded_count(self) -> int:
        return len(self._loaded)

    def loaded_engines(self) -> list[Engine]:
        return [x.engine for x in self._loaded.values()]

    def context_length(self, spec: ModelSpec) -> int | None:
        """Tokens one request may use (prompt plus completion) on the model: exact once
        it is loaded, else from its configured context (None: known at load)."""
        loaded = self._loaded.get(spec.id)
        if loaded is not None:
            return loaded.engine.n_ctx
        context = spec.settings.context
        if context.n_ctx <= 0:
            return None
        return -(-context.n_ctx // 256) * 256  # llama.cpp rounds a cache up to 256 cells

    def cpu_kernels(self) -> dict[str, str]:
        """The CPU kernel path of each loaded model (/health): amx+repack, repack, plain."""
        return {mid: x.engine.cpu_kernels for mid, x in self._loaded.items()}

    def kv_cache(self) -> dict[str, dict[str, str | bool]]:
        """KV cache types and flash attention of each loaded model (/health)."""
        return {mid: x.engine.kv_cache_info() for mid, x in self._loaded.items()}

    async def acquire(self, name: str) -> Lease:
        spec = self.resolve(name)
        lock = self._locks.setdefault(spec.id, asyncio.Lock())
        async with lock:
            loaded = self._loaded.get(spec.id)
            if loaded is None:
                loaded = await self._load(spec)
            loaded.leases += 1
            loaded.last_used = time.monotonic()
            return Lease(self, spec.id, loaded.engine)

    def lease_if_loaded(self, name: str) -> Lease | None:
        """A lease on the model if it is loaded now; None, and nothing loaded, if not."""
        spec = self.spec(name)
        loaded = self._loaded.get(spec.id)
        if loaded is None:
            return None
        loaded.leases += 1  # no await since the lookup: an unload cannot come between
        loaded.last_used = time.monotonic()
        return Lease(self, spec.id, loaded.engine)

    def _release(self, model_id: str) -> None:
        loaded = self._loaded.get(model_id)
        if loaded is not None:
            loaded.leases -= 1
            loaded.last_used = time.monotonic()
            if loaded.keep_alive == 0 and loaded.leases == 0:
                # Asked to go as soon as it is done: unload now rather than at the next reap.
                with contextlib.suppress(RuntimeError):  # no running loop: the reaper will
                    task = asyncio.get_running_loop().create_task(
                        self.unload_when_idle(model_id))
                    self._unloading.add(task)  # held, so it is not collected mid-way
                    task.add_done_callback(self._unloading.discard)

    # --- names, files and keep-alive set at run time (Ollama's model management) ---------

    def remove_model(self, model_id: str) -> None:
        """Stops serving a model add_model gave, and its names (it must not be loaded)."""
        if self.spec(model_id).id in self._loaded:
            raise ValueError(f"model `{model_id}` is loaded")
        super().remove_model(model_id)

    def set_file(self, name: str, path: Path | None, missing_reason: str = "") -> None:
        """The model's file is now `path` (pulled), or gone (None: deleted)."""
        spec = self.spec(name)
        spec.path = path
        spec.missing_reason = missing_reason
        self._failures.pop(spec.id, None)

    def set_keep_alive(self, model_id: str, seconds: float | None) -> None:
        """How long the loaded model stays after its last use (negative: for good)."""
        loaded = self._loaded.get(model_id)
        if loaded is not None:
            loaded.keep_alive = seconds

    def _keep_alive_of(self, model_id: str, loaded: _Loaded) -> float:
        if loaded.keep_alive is not None:
            return loaded.keep_alive
        keep = self.spec(model_id).keep_alive
        return self.keep_alive if keep is None else keep

    def expires_in(self, model_id: str) -> float | None:
        """Seconds until the loaded model is unloaded if unused (None: never)."""
        loaded = self._loaded.get(model_id)
        if loaded is None:
            return 0.0
        keep = self._keep_alive_of(model_id, loaded)
        if keep < 0:
            return None
        return max(0.0, keep - (time.monotonic() - loaded.last_used))

    def loaded_engine(self, model_id: str) -> Engine | None:
        loaded = self._loaded.get(model_id)
        return None if loaded is None else loaded.engine

    def loaded_bytes(self, model_id: str) -> int:
        """What the loaded model is charged in the budget (0: not loaded)."""
        loaded = self._loaded.get(model_id)
        return 0 if loaded is None else loaded.engine.held_bytes()

    async def unload_when_idle(self, model_id: str, wait: float = 2.0) -> bool:
        """Unloads the model once no request uses it, waiting up to `wait` seconds for
        the engine to settle; True when it is unloaded (or was not loaded)."""
        deadline = time.monotonic() + wait
        while True:
            lock = self._locks.setdefault(model_id, asyncio.Lock())
            async with lock:
                loaded = self._loaded.get(model_id)
                if loaded is None:
                    return True
                if not self._in_use(loaded):
                    log.info("unloading %s (keep_alive 0, or deleted)", model_id)
                    await self._unload(model_id)
                    return True
                if loaded.leases > 0 or time.monotonic() > deadline:
                    return False  # its last lease unloads it, or the reaper will
            await asyncio.sleep(0.02)

    # --- loading and unloading ------------------------------------------------------------

    async def _load(self, spec: ModelSpec) -> _Loaded:
        if spec.path is None:
            raise ModelUnavailable(spec.missing_reason or f"model `{spec.id}` is not available")
        failure = self._failures.get(spec.id)
        if failure is not None and time.monotonic() < failure.retry_at:
            wait = max(1, int(failure.retry_at - time.monotonic() + 0.999))
            raise ModelUnavailable(
                f"model `{spec.id}` failed to load ({failure.message}); next try in {wait}s",
                retry_after=wait,
            )
        loop = asyncio.get_running_loop()
        need = self._budget.remembered(spec)
        if need is None:  # reads the file's header: off the event loop
            need = await loop.run_in_executor(None, spec.estimated_bytes)
        await self._make_room(need, spec.id)
        self._reserved[spec.id] = need  # no await since the check: nothing came between
        started = time.monotonic()
        try:
            engine = await loop.run_in_executor(
                None, lambda: Engine(spec.id, spec.path, spec.settings)  # type: ignore[arg-type]
            )
        except Exception as exc:
            self._reserved.pop(spec.id, None)
            self.load_errors[spec.id] = str(exc)
            count = failure.count + 1 if failure is not None else 1
            delay = min(_LOAD_BACKOFF_FIRST_S * 2 ** (count - 1), _LOAD_BACKOFF_MAX_S)
            self._failures[spec.id] = _LoadFailure(
                _public_reason(exc), count, time.monotonic() + delay
            )
            log.error("could not load model %s (try %d, next in %.0fs): %s",
                      spec.id, count, delay, exc)
            raise ModelUnavailable(
                f"model `{spec.id}` failed to load ({_public_reason(exc)})",
                retry_after=int(delay),
            ) from exc
        held = engine.held_bytes()
        self._budget.remember(spec, held)
        if held > need:  # more than estimated: room for the rest (its estimate still
            try:         # held meanwhile), or no model at all
                self._refuse_if_too_big(held, spec.id)
                await self._make_room(held - need, spec.id)
            except ModelUnavailable:
                await loop.run_in_executor(None, engine.close)
                self._reserved.pop(spec.id, None)
                raise
        self._reserved.pop(spec.id, None)  # in _loaded below, with no await between
        self.load_errors.pop(spec.id, None)
        self._failures.pop(spec.id, None)
        if self._on_job_done is not None:
            callback = self._on_job_done
            engine.scheduler.on_job_done = lambda stats, mid=spec.id: callback(mid, stats)
        elapsed = time.monotonic() - started
        self.load_seconds[spec.id] = elapsed
        loaded = _Loaded(engine, elapsed)
        self._loaded[spec.id] = loaded
        log.info("model %s loaded in %.2fs, holding %d MiB (%d MiB of the %d MiB budget "
                 "in use)", spec.id, elapsed, held >> 20, self._used_bytes() >> 20,
                 self.memory_budget >> 20)
        return loaded

    def _in_use(self, loaded: _Loaded) -> bool:
        return loaded.leases > 0 or not loaded.engine.scheduler.idle

    async def _make_room(self, need: int, for_id: str) -> None:
        """Unloads idle models, least recently used first, until `need` more bytes fit
        the budget; ModelUnavailable where they cannot."""
        self._refuse_if_too_big(need, for_id)
        while self._used_bytes() + need > self.memory_budget:
            idle = [(mid, x) for mid, x in self._loaded.items()
                    if mid != for_id and not self._in_use(x)]
            if not idle:
                raise ModelUnavailable(
                    f"not enough memory budget to load `{for_id}` while the other models "
                    "are busy; retry shortly")
            victim = min(idle, key=lambda item: item[1].last_used)[0]
            log.info("unloading %s to make room for %s", victim, for_id)
            await self._unload(victim)

    def _refuse_if_too_big(self, need: int, for_id: str) -> None:
        reason = self._budget.too_big(need, for_id)
        if reason is not None:
            raise ModelUnavailable(reason, retry_after=60)

    def _used_bytes(self) -> int:
        """What loaded models hold (embedding contexts made since included), and what
        models being loaded or freed are holding the budget for."""
        return (sum(x.engine.held_bytes() for x in self._loaded.values())
                + sum(self._reserved.values()))

    async def _unload(self, model_id: str) -> None:
        loaded = self._loaded.pop(model_id, None)
        if loaded is not None:
            with self._budget.holding(f"{model_id}\0freeing", loaded.engine.held_bytes()):
                await asyncio.get_running_loop().run_in_executor(None, loaded.engine.close)

    async def preload(self, name: str) -> None:
        lease = await self.acquire(name)
        lease.release()

    async def reap_idle(self) -> list[str]:
        """Unloads models unused for longer than their keep_alive; returns their ids."""
        now = time.monotonic()
        unloaded = []
        for model_id, loaded in list(self._loaded.items()):
            keep = self._keep_alive_of(model_id, loaded)
            if keep < 0 or self._in_use(loaded) or now - loaded.last_used < keep:
                continue
            lock = self._locks.setdefault(model_id, asyncio.Lock())
            async with lock:
                if model_id in self._loaded and not self._in_use(self._loaded[model_id]):
                    log.info("unloading %s after %.0fs idle", model_id, now - loaded.last_used)
                    await self._unload(model_id)
                    unloaded.append(model_id)
        return unloaded

    async def run_reaper(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.reap_idle()

    # --- reporting -----------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            mid: {**x.engine.stats(), "leases": x.leases}
            for mid, x in self._loaded.items()
        }

    def stalled(self, limit: float) -> list[str]:
        """Models whose engine step has run longer than `limit` seconds (watchdog)."""
        return [
            mid for mid, x in self._loaded.items()
            if x.engine.stalled_for() > limit
        ]

    def close(self) -> None:
        loaded, self._loaded = list(self._loaded.values()), {}
        for x in loaded:
            x.engine.close()
