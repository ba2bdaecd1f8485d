"""`--server URL`: `sieve query`, `sieve eval` and `sieve experiment` sent to a running `sieve serve`.

The server has its models loaded and its store open, so a command answers in the time of the request, and
`sieve eval` can run while `sieve serve` holds an embedded store (one process per store path).

- The URL: `--server URL`, else `$SIEVE_SERVER`; `http://` or `https://`, a host, an optional port.
- The token, sent as `Authorization: Bearer <token>`: `$SIEVE_TOKEN` when set; otherwise, from this
  invocation's own settings (the same config file and `RAG__*` environment `sieve serve` reads), for a
  query `rag.server.api_token` (else `rag.server.admin_token`), for an evaluation or an experiment
  `rag.server.admin_token`.
  No token at all sends no header (a server without `api_token` answers queries without one).
- Failures are one line and an exit code: the server cannot be reached, is not ready, is busy, or does not
  answer as a Sieve server: 3 (`exit_codes.UNAVAILABLE`); a token it refuses (401, 403) or input it
  rejects (4xx): 2 (`exit_codes.BAD_INPUT`), with the server's own message.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from app import exit_codes

SERVER_ENV = "SIEVE_SERVER"
TOKEN_ENV = "SIEVE_TOKEN"
# connecting is quick or not at all; an evaluation answers when the golden set has run through the chain
CONNECT_TIMEOUT_S = 5.0
QUERY_TIMEOUT_S = 120.0
EVALUATION_TIMEOUT_S = 3600.0


class ServerError(Exception):
    """A request to the server that did not give an answer: `message` is the one line to print, `code`
    the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def server_url(flag: str | None) -> str | None:
    """The server to send the command to: `--server`, else `$SIEVE_SERVER`; None: run here. A URL that is
    not `http(s)://host[:port][/path]` is a `ServerError` (exit 2) naming where it came from."""
    source = "--server"
    url = flag
    if url is None:
        url = os.environ.get(SERVER_ENV) or None
        source = f"${SERVER_ENV}"
    if url is None:
        return None
    parts = urlsplit(url.strip())
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query:
        raise ServerError(
            f"{source}: expected a URL like http://127.0.0.1:8080, got {url!r}", exit_codes.BAD_INPUT
        )
    return url.strip().rstrip("/")


def server_token(kind: Literal["reader", "admin"], load_settings: Callable[[], Any]) -> str | None:
    """`$SIEVE_TOKEN`, else the token of `rag.server` that `kind` of request needs (see above), from the
    settings `load_settings()` returns (only called when `$SIEVE_TOKEN` is unset)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    server = load_settings().rag.server
    if kind == "admin":
        return server.admin_token
    return server.api_token or server.admin_token


@dataclass
class SieveClient:
    """The requests the CLI sends, each answered with the server's JSON object or a `ServerError`."""

    url: str
    token: str | None = None
    # an httpx transport in place of the network (tests); None: the network
    transport: Any = None

    def retrieve(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("/api/retrieve", body, QUERY_TIMEOUT_S)

    def evaluate(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("/api/evaluations/runs", body, EVALUATION_TIMEOUT_S)

    def start_experiment(self, body: dict[str, Any]) -> dict[str, Any]:
        """`POST /api/experiments`: the accepted job, `{"job": id}`."""
        return self._request("/api/experiments", body, QUERY_TIMEOUT_S, accepted=202)

    def job(self, job_id: str) -> dict[str, Any]:
        """`GET /api/jobs/{id}`: the job as the server shows it."""
        return self._request(f"/api/jobs/{job_id}", None, QUERY_TIMEOUT_S)

    def _request(
        self, path: str, body: dict[str, Any] | None, read_timeout: float, accepted: int = 200
    ) -> dict[str, Any]:
        """POST `body` to `path` (GET when `body` is None); the answer's JSON object when its status is
        `accepted`, else a `ServerError`."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT_S)
        try:
            with httpx.Client(transport=self.transport, timeout=timeout) as client:
                if body is None:
                    response = client.get(self.url + path, headers=headers)
                else:
                    response = client.post(self.url + path, json=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerError(
                f"cannot reach the server at {self.url}: {_reason(exc)} (is `sieve serve` running there?)",
                exit_codes.UNAVAILABLE,
            ) from None
        except httpx.TimeoutException:
            raise ServerError(
                f"the server at {self.url} did not answer {path} within {read_timeout:.0f} s",
                exit_codes.UNAVAILABLE,
            ) from None
        except httpx.HTTPError as exc:
            raise ServerError(
                f"no answer from the server at {self.url}: {_reason(exc)}", exit_codes.UNAVAILABLE
            ) from None
        answer = _json_object(response)
        if response.status_code == accepted and answer is not None:
            return answer
        raise _refusal(self.url, path, response, answer, sent_token=bool(self.token))


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _json_object(response: Any) -> dict[str, Any] | None:
    try:
        answer = response.json()
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _refusal(
    url: str, path: str, response: Any, answer: dict[str, Any] | None, sent_token: bool
) -> ServerError:
    status = response.status_code
    said = answer.get("error") if answer is not None else None
    if not isinstance(said, str):
        return ServerError(
            f"the server at {url} did not answer {path} as a Sieve server (HTTP {status}, "
            f"{response.headers.get('content-type', 'no content type')})",
            exit_codes.UNAVAILABLE,
        )
    if status == 401:
        return ServerError(
            f"the server at {url} {'refused the token' if sent_token else 'needs a token'} (401): {said}; "
            f"set ${TOKEN_ENV} to the server's token",
            exit_codes.BAD_INPUT,
        )
    if status == 403:
        return ServerError(f"the server at {url} refused the request (403): {said}", exit_codes.BAD_INPUT)
    if status in (409, 503) or status >= 500:
        return ServerError(f"the server at {url} cannot do it now ({status}): {said}", exit_codes.UNAVAILABLE)
    return ServerError(said, exit_codes.BAD_INPUT)
