"""Request dependencies: the application state and the loaded Sieve."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

if TYPE_CHECKING:
    from app.main import AppState
    from app.service import Sieve


def sieve_state(request: Request) -> AppState:
    return request.app.state.sieve_state


def require_sieve(request: Request) -> Sieve:
    """The loaded Sieve, or a 503 that says what startup is doing."""
    from app.api.errors import ApiError

    state = sieve_state(request)
    if state.sieve is None or not state.ready:
        raise ApiError(503, f"not ready: {state.error or state.phase}")
    return state.sieve  # type: ignore[return-value]
