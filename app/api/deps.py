"""Request dependencies: the application state, the loaded Sieve, and who may call what.

Access, by `rag.server` settings:
- writes (`POST /api/documents`, `POST /api/evaluations`), the evaluation reports, the jobs and the query
  log (`GET /api/querylog`) need `Authorization: Bearer <admin_token>`; with no admin token configured they
  answer 403;
- every other `/api/*` route needs `Bearer <api_token>` when one is configured (the admin token works too);
- `/health`, `/ready` and the OpenAPI pages are always open.

With `rag.access.enabled` (docs/access.md), every read needs a token that names who reads: the admin token
(everything) or a `rag.access.principals` token (its scope, `request_principal`); no token, an unknown one
or `rag.server.api_token` is a 401.
The scheme is case-insensitive; tokens are compared as bytes in constant time. A header that is missing,
malformed or not ASCII is a 401, never an error of the server.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from fastapi import Request, Security
from fastapi.security import HTTPBearer

from app.access.scope import ADMIN, Principal
from app.api.errors import ApiError
from app.api.principals import TokenRefused

if TYPE_CHECKING:
    from app.api.state import AppState
    from app.service import Sieve

# Declares the scheme in the OpenAPI document; the header itself is read and checked below.
bearer = HTTPBearer(auto_error=False, description="rag.server.api_token, or rag.server.admin_token")

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}


def sieve_state(request: Request) -> AppState:
    return request.app.state.sieve_state


def require_sieve(request: Request) -> Sieve:
    """The loaded Sieve, or a 503 that says what startup is doing."""
    state = sieve_state(request)
    if state.sieve is None or not state.ready:
        raise ApiError(503, f"not ready: {state.error or state.phase}")
    return state.sieve  # type: ignore[return-value]


def bearer_token(request: Request) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header as bytes; None when there is no usable one
    (absent, another scheme, empty, or not ASCII)."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    try:
        return token.encode("ascii")
    except UnicodeEncodeError:
        return None


def token_matches(given: bytes | None, expected: str | None) -> bool:
    return given is not None and expected is not None and hmac.compare_digest(given, expected.encode("ascii"))


# Reads take a token only when rag.server.api_token is set: in OpenAPI terms, no security or the bearer.
READER_SECURITY: dict[str, Any] = {"security": [{}, {"HTTPBearer": []}]}


async def require_reader(request: Request) -> None:
    """Reads: open unless `rag.server.api_token` is set; then that token or the admin token. With access
    scopes on, a principal's token or the admin token (`request_principal`).

    `async`: it does no I/O, and a sync dependency would wait for a worker thread, behind the retrievals."""
    state = sieve_state(request)
    if state.principals.enabled:
        request_principal(request)
        return
    server = state.settings.rag.server
    if server.api_token is None:
        return
    given = bearer_token(request)
    if not (token_matches(given, server.api_token) or token_matches(given, server.admin_token)):
        raise ApiError(
            401,
            "missing or wrong token: send 'Authorization: Bearer <rag.server.api_token>'",
            headers=UNAUTHORIZED_HEADERS,
        )


def request_principal(request: Request) -> Principal | None:
    """Whose scope this request reads in: None with access scopes off (unscoped), else the admin or the
    token's principal; a 401 for anything else (fail closed)."""
    state = sieve_state(request)
    if not state.principals.enabled:
        return None
    given = bearer_token(request)
    if token_matches(given, state.settings.rag.server.admin_token):
        return ADMIN
    why = ""
    if given is not None:
        try:
            return state.principals.resolve(given)
        except TokenRefused as exc:
            why = f"; {exc}"
    raise ApiError(
        401,
        "access scopes are on (rag.access.enabled): send 'Authorization: Bearer <token>' with the token "
        "of one of rag.access.principals, a JWT when rag.access.jwt is on, or the admin token" + why,
        headers=UNAUTHORIZED_HEADERS,
    )


def _principal_or_none(request: Request, given: bytes | None) -> Principal | None:
    """The principal `given` reads as, with access scopes on; None for anything else."""
    state = sieve_state(request)
    if given is None or not state.principals.enabled:
        return None
    try:
        return state.principals.resolve(given)
    except TokenRefused:
        return None


def is_admin(request: Request) -> bool:
    """The request carries the admin token (never true while none is configured)."""
    return token_matches(bearer_token(request), sieve_state(request).settings.rag.server.admin_token)


def require_admin(request: Request, _: object = Security(bearer)) -> None:
    """Writes and reports: the admin token; 403 when none is configured."""
    server = sieve_state(request).settings.rag.server
    if server.admin_token is None:
        raise ApiError(
            403,
            "this endpoint is off: set rag.server.admin_token (e.g. RAG__SERVER__ADMIN_TOKEN) to a long "
            "random string and send it as 'Authorization: Bearer <token>'",
        )
    given = bearer_token(request)
    if not token_matches(given, server.admin_token):
        principal = _principal_or_none(request, given)
        if principal is not None:
            raise ApiError(
                403,
                f"this token reads as principal {principal.name!r}; this endpoint needs the admin token "
                "(rag.server.admin_token)",
            )
        raise ApiError(
            401,
            "missing or wrong admin token: send 'Authorization: Bearer <rag.server.admin_token>'",
            headers=UNAUTHORIZED_HEADERS,
        )
