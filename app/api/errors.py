"""API errors: `ApiError` for answers the routes choose, and the handlers that turn every error into JSON.

Every error body has the same shape, `{"error": "...", "fields": [{"field", "message"}]}` (`fields` when the
problem is in the request), declared in the OpenAPI document by `app.api.schemas.ErrorResponse`, and no other
key but those named below (`count`, `limit`, `requestId`):

- request validation (pydantic), malformed JSON, a body that is not UTF-8 or is nested too deeply, a body
  with an object or array larger than any request takes (`app.api.limits.JsonShapeLimit`): 422, with the
  first `MAX_REPORTED_PROBLEMS` problems and their `count`;
- `ApiError`: the status the route chose;
- any other `HTTPException` (404 for an unknown path, 405, ...): its status, `{"error": detail}`;
- a body over `rag.server.max_body_bytes` (`app.api.limits.BodySizeLimit`, before the body is read): 413
  `{"error", "limit"}`; a retrieval refused at once by admission (`app.api.admission.AdmissionGate`): 429
  `{"error"}`, as the route's own refusal;
- the vector store unreachable, or failing a read or a write (`StoreUnavailableError`, `StoreFailedError`:
  whatever Chroma raised, wrapped once in `ChromaStore`), or any other `StoreError` during a request (the
  document record's): 503 `{"error": "vector store ...: <reason>", "requestId": "..."}`, the reason logged
  under that id (also in the `X-Request-Id` header);
- a write refused for lack of disk space (`InsufficientStorage`: less than `rag.store.min_free_mb` would be
  left), or any error caused by a full disk or quota (ENOSPC, EDQUOT, SQLite's "database or disk is full",
  `app.store.space.storage_exhausted`): 507 `{"error": "insufficient storage: ...", "requestId": "..."}`;
- anything unexpected, raised anywhere (route, dependency, middleware): 500 `{"error": "internal error",
  "requestId": "..."}`, the traceback logged under that id, and the keep-alive connection kept open (see
  `KeepConnectionOpen`).

Messages never carry a lone surrogate (a `\\ud800` escape in a JSON string decodes to one and cannot be
encoded as UTF-8): they are written with `\\ud800`-style escapes instead.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.bounds import MAX_FIELD_NAME_CHARS, MAX_MESSAGE_CHARS, MAX_REPORTED_PROBLEMS
from app.store import (
    InsufficientStorage,
    StoreError,
    StoreFailedError,
    StoreUnavailableError,
    storage_exhausted,
)

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error"
REQUEST_ID_HEADER = "X-Request-Id"


class ApiError(Exception):
    """An answer a route chooses: `ApiError(422, "query: too long", field="query")`.

    `field=` names the request field at fault: the body lists it under `fields`, with the message.
    `headers` go on the response (`WWW-Authenticate`, ...)."""

    def __init__(
        self, status: int, message: str, headers: dict[str, str] | None = None, field: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.field = field

    def body(self) -> dict[str, Any]:
        """`{"error"}`, with `fields` when a field is named and `count` with a 422: the documented shape."""
        body: dict[str, Any] = {"error": safe_text(self.message)}
        if self.field is not None:
            body["fields"] = [field_problem(self.field, self.message)]
        if self.status == 422:
            body["count"] = len(body.get("fields", [])) or 1
        return body


def safe_text(text: str) -> str:
    """`text` with every lone surrogate written as a `\\udXXX` escape, so that it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def field_problem(field: str, message: str) -> dict[str, str]:
    """One entry of a 422's `fields`; a field name or message over its bound is cut ("…" marks the cut)."""
    return {
        "field": _cut(safe_text(field), MAX_FIELD_NAME_CHARS),
        "message": _cut(safe_text(message), MAX_MESSAGE_CHARS),
    }


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def validation_response(problems: list[dict[str, str]], count: int | None = None) -> JSONResponse:
    """The 422 every invalid request gets: a one-line summary, the first `MAX_REPORTED_PROBLEMS` problems
    field by field, and `count`, how many there are (`len(problems)` unless given)."""
    count = len(problems) if count is None else count
    shown = problems[:MAX_REPORTED_PROBLEMS]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in shown)
    if count > len(shown):
        summary += f"; and {count - len(shown)} more"
    return JSONResponse({"error": summary, "fields": shown, "count": count}, status_code=422)


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def _body_problem(exc: BaseException | None) -> str:
    """Why FastAPI could not parse a JSON body (it answers 400 and keeps the reason as the cause)."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    if isinstance(exc, RecursionError):
        return "malformed JSON: nested too deeply"
    if isinstance(exc, ValueError) and str(exc):
        return f"malformed JSON: {exc}"
    return "malformed JSON: the body cannot be parsed"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        problems = []
        for err in errors[:MAX_REPORTED_PROBLEMS]:
            field = _field_name(err.get("loc", ()))
            msg = err.get("msg", "invalid")
            if err.get("type") == "json_invalid":
                field, msg = "body", f"malformed JSON: {err.get('ctx', {}).get('error', msg)}"
            problems.append(field_problem(field, msg))
        return validation_response(problems, count=len(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's answer for a JSON body json.loads could not take (not UTF-8, too deep, a number
            # too long): it is a malformed body like any other, so the same 422 as malformed JSON
            return validation_response([field_problem("body", _body_problem(exc.__cause__))])
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return JSONResponse({"error": safe_text(detail)}, status_code=exc.status_code, headers=exc.headers)

    _install_store_error_handlers(app)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware calls this for anything no other handler took, wherever it was
        # raised (a route, a dependency, any middleware), answers with it, then re-raises the exception
        if storage_exhausted(exc):
            return storage_error_response(request.scope, exc)
        return internal_error_response(request.scope, exc)

    keep_connection_open(app)


def _install_store_error_handlers(app: FastAPI) -> None:
    """The store's failures during a request: 503 naming the store, 507 for lack of space."""

    @app.exception_handler(StoreUnavailableError)
    async def _store_down(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        return store_error_response(request.scope, f"vector store unavailable: {exc}")

    @app.exception_handler(StoreFailedError)
    async def _store_failed(request: Request, exc: StoreFailedError) -> JSONResponse:
        return store_error_response(request.scope, f"vector store: {exc}")

    @app.exception_handler(InsufficientStorage)
    async def _no_space(request: Request, exc: InsufficientStorage) -> JSONResponse:
        return storage_error_response(request.scope, exc)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        # any other store failure during a request (the document record's, ...): its message names it
        if storage_exhausted(exc):
            return storage_error_response(request.scope, exc)
        return store_error_response(request.scope, f"store: {exc}")


def store_error_response(scope: Scope, reason: str) -> JSONResponse:
    """The 503 for a store that failed the request: `reason` and a request id, logged under that id."""
    return _identified(scope, 503, safe_text(reason), f"store error: {safe_text(reason)}")


def storage_error_response(scope: Scope, exc: BaseException) -> JSONResponse:
    """The 507 for a write refused or failed for lack of disk space (`storage_exhausted`): the guard's
    reason as it stands, or what failed; logged under the request id."""
    reason = str(exc) if isinstance(exc, InsufficientStorage) else f"insufficient storage: {exc}"
    return _identified(scope, 507, safe_text(reason), f"refused: {safe_text(reason)}")


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def internal_error_response(scope: Scope, exc: BaseException) -> JSONResponse:
    """The JSON 500 for an unexpected exception; its traceback is logged under the request id it carries."""
    return _identified(scope, 500, INTERNAL_ERROR, "internal error", exc)


def _identified(
    scope: Scope, status: int, error: str, logged: str, exc: BaseException | None = None
) -> JSONResponse:
    """`{"error": error, "requestId": ...}` with `status` and the id in `X-Request-Id`; the log line says
    `logged`, the id, the method and the path (and `exc`'s traceback)."""
    request_id = new_request_id()
    method, path = scope.get("method", "?"), safe_text(str(scope.get("path", "?")))
    log.error("%s requestId=%s on %s %s", logged, request_id, method, path, exc_info=exc)
    return JSONResponse(
        {"error": error, "requestId": request_id}, status_code=status, headers={REQUEST_ID_HEADER: request_id}
    )


def keep_connection_open(app: FastAPI) -> None:
    """Wrap the app's whole middleware stack in `KeepConnectionOpen` (outside Starlette's
    ServerErrorMiddleware, so it holds whatever middleware is added later)."""
    build = app.build_middleware_stack

    def build_wrapped() -> ASGIApp:
        return KeepConnectionOpen(build())

    app.build_middleware_stack = build_wrapped  # type: ignore[method-assign]


class KeepConnectionOpen:
    """Stops an exception that was already answered from reaching the server.

    Starlette's ServerErrorMiddleware re-raises after sending the 500; uvicorn then logs "Exception in ASGI
    application" and closes the keep-alive connection, so the client's next request on it fails. Here an
    exception after a complete response is dropped (the handler logged it with its request id); one before
    any response gets the JSON 500; one in the middle of a response is re-raised, since the server must then
    close the connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if finished:
                return
            if started:
                raise
            await internal_error_response(scope, exc)(scope, receive, send)
