"""API errors: `ApiError` for answers the routes choose, and the handlers that turn every error into JSON."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.store import StoreUnavailableError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An answer a route chose: `{"error": message, **extra}` with `status` (and `headers`)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, **extra: Any):
        self.status = status
        self.message = message
        self.headers = headers
        self.extra = extra


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message, **exc.extra}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p != "body"]
            field = ".".join(loc) or "body"
            msg = err.get("msg", "invalid")
            if err.get("type") == "json_invalid":
                field, msg = "body", f"malformed JSON: {err.get('ctx', {}).get('error', msg)}"
            problems.append({"field": field, "message": msg})
        summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        return JSONResponse({"error": summary, "fields": problems}, status_code=422)

    @app.exception_handler(StoreUnavailableError)
    async def _store_down(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        log.error("store unavailable: %s", exc)
        return JSONResponse({"error": f"vector store unavailable: {exc}"}, status_code=503)
