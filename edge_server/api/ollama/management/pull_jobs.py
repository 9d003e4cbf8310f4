"""Pulls in progress on this server: at most MAX_PULLS at once (one more is a 503), one per
file (a second pull of a file being downloaded is a 409). Each runs its downloads on a
thread of its own, which gives the file and the place back when it ends, however it ends
(done, failed, or cancelled because its client left).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

from edge_server.api.http.errors import APIError
from edge_server.catalogue.hub_download import HubDownload, PullError

log = logging.getLogger(__name__)

MAX_PULLS = 2
_RETRY_AFTER_S = 30


class PullJob:
    """The downloads of one pull, run in order on one thread: the model's file first (the
    one whose progress is reported), then its projector."""

    def __init__(self, jobs: PullJobs, downloads: list[HubDownload]) -> None:
        self.downloads = downloads
        self.main = downloads[0]
        self._jobs = jobs
        self._finished = asyncio.Event()
        self._path: Path | None = None
        self._error: PullError | None = None

    @property
    def keys(self) -> list[Path]:
        return [d.target for d in self.downloads]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._run, args=(loop,), name="pull", daemon=True).start()

    def abandon(self) -> None:
        """Gives the place back for a job that will not start."""
        self._jobs.release(self)

    def cancel(self) -> None:
        for download in self.downloads:
            download.cancel()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._path = self.main.fetch()
            for extra in self.downloads[1:]:
                extra.run()
        except PullError as exc:
            self._error = exc
        except Exception as exc:  # a disk error, a bug: the pull fails, the server does not
            log.exception("pull of %s failed", self.main.name)
            self._error = PullError(f"{self.main.name} could not be stored "
                                    f"({type(exc).__name__}); see the server log")
        finally:
            self._jobs.release(self)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(self._finished.set)

    async def wait(self, seconds: float) -> bool:
        """True once the job has ended, else after `seconds`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), seconds)
        return self._finished.is_set()

    def result(self) -> Path:
        """The model's file; the job's PullError if it failed."""
        if self._error is not None:
            raise self._error
        assert self._path is not None
        return self._path


class PullJobs:
    def __init__(self, limit: int = MAX_PULLS) -> None:
        self.limit = limit
        self._lock = threading.Lock()  # released from the jobs' threads
        self._running: list[PullJob] = []

    def claim(self, downloads: list[HubDownload]) -> PullJob:
        """A place for a pull of these downloads: 409 while one of its files is being
        downloaded, 503 while MAX_PULLS run."""
        job = PullJob(self, downloads)
        with self._lock:
            busy = {key for other in self._running for key in other.keys}
            if busy.intersection(job.keys):
                raise APIError(409, f"{job.main.name} is being pulled already; wait for that "
                               "pull to end", param="model", code="pull_in_progress")
            if len(self._running) >= self.limit:
                raise APIError(503, f"{self.limit} pulls are running; retry when one ends",
                               type="server_error", code="too_many_pulls",
                               headers={"Retry-After": str(_RETRY_AFTER_S)})
            self._running.append(job)
        return job

    def release(self, job: PullJob) -> None:
        with self._lock:
            if job in self._running:
                self._running.remove(job)
