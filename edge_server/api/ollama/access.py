"""Who may change the models served (/api/copy, /api/delete, /api/create, blob uploads).

One check for all of them, so that a stricter tier (an admin key) applies in one place.
Today it is the API-key check every route already passed: where keys are set, any caller
holding one; without keys, any caller the Host guard admitted.
"""

from __future__ import annotations

from starlette.requests import Request


def require_manager(request: Request) -> None:
    """Raises the error answered to a caller who may not manage models (none yet: the
    key middleware admitted this request before any route ran)."""
    del request  # what a stricter tier would read (its key's scope)
