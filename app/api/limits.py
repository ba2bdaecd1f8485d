"""Request body limits, as ASGI middleware: `BodySizeLimit` answers 413 before a large body is read into
memory; `JsonShapeLimit` answers 422 for a JSON body holding an object or array larger than any request
model takes, before a model reads it (so a body of 150,000 unknown keys costs one parse, not 150,000
error messages)."""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.bounds import json_shape_problem
from app.api.errors import field_problem, validation_response


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """413 `{"error", "limit"}` for a body over `max_bytes`: at once when `Content-Length` says so, else
    (chunked uploads) as soon as the bytes read pass the limit, before the route sees the body."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send, f"request body is {declared} bytes")
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await self._reject(send, f"request body is more than {self.max_bytes} bytes")

    async def _reject(self, send: Send, what: str) -> None:
        body = json.dumps(
            {
                "error": f"{what}, over the limit rag.server.max_body_bytes={self.max_bytes}",
                "limit": self.max_bytes,
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    headers: Any = scope.get("headers") or []
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


# bodies larger than this are parsed off the event loop
PARSE_ON_LOOP_BYTES = 64 * 1024


class JsonShapeLimit:
    """422 for a request body that `app.api.bounds.json_shape_problem` finds too large in shape; any other
    body goes on to the route as it came. Placed inside `BodySizeLimit`, so the body it reads is bounded."""

    def __init__(self, app: ASGIApp, max_object_keys: int):
        """`max_object_keys`: `app.api.bounds.max_object_keys` of rag.ingest.max_metadata_keys."""
        self.app = app
        self.max_object_keys = max_object_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nothing to answer
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = None
        if len(body) > PARSE_ON_LOOP_BYTES:  # a parse of megabytes would hold up every other request
            problem = await anyio.to_thread.run_sync(json_shape_problem, body, self.max_object_keys)
        elif body:
            problem = json_shape_problem(body, self.max_object_keys)
        if problem is not None:
            await validation_response([field_problem(*problem)])(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
