"""Hostile requests against a real uvicorn server over one keep-alive connection, a real Sieve (the packaged
e5 embedder, an embedded Chroma holding the sample base) and a real `chroma run` for readiness.

Every request in a test goes over the same TCP connection (`http.client`, no reconnects): a server that
answered and then dropped the connection would fail the next request.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from app.ingest.pipeline import IngestReport
from app.main import create_app
from app.service import Sieve
from app.settings import Settings, nested
from app.store import ChromaStore
from tests.conftest import find_free_port
from tests.fixtures.api_server import ADMIN_TOKEN, READY_TIMEOUT_S, installs, make_settings, uvicorn_server
from tests.fixtures.processes import chroma_run, stop_process
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEEP = 100_000
# /ready caches the heartbeat for 1 s; a refused connection is answered at once
READY_FLIP_S = 2.5


@pytest.fixture(scope="module")
def sieve(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[Sieve]:
    base = tmp_path_factory.mktemp("robust-api")
    settings = make_settings(seeded_store(base / "store"), base / "eval")
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    built = Sieve(settings, real_embedder, store, reranker=None)
    yield built
    built.close()


class OneConnection:
    """HTTP/1.1 over a single TCP connection; fails if the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        self.conn.connect()
        self.sock = self.conn.sock
        self.requests = 0
        self.last_answer = time.monotonic()

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], Any]:
        assert self.conn.sock is self.sock, "the connection was replaced"
        headers = {"Content-Type": "application/json"} if body is not None else {}
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"  # writes need it; reads accept it
        self.conn.request(method, path, body=body, headers=headers)
        try:
            response = self.conn.getresponse()
        except http.client.RemoteDisconnected as exc:
            idle = time.monotonic() - self.last_answer
            raise AssertionError(
                f"{method} {path}: connection closed, {idle:.1f}s after the last answer"
            ) from exc
        raw = response.read()
        self.last_answer = time.monotonic()
        self.requests += 1
        assert response.getheader("connection", "").lower() != "close", (method, path, raw[:200])
        assert self.conn.sock is self.sock, f"the server closed the connection after {method} {path}"
        return response.status, dict(response.getheaders()), json.loads(raw)

    def post(self, path: str, raw: str | bytes | dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        if isinstance(raw, dict):
            raw = json.dumps(raw)
        body = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        return self.send("POST", path, body)

    def close(self) -> None:
        self.conn.close()


@contextmanager
def one_connection(app: FastAPI) -> Iterator[OneConnection]:
    with uvicorn_server(app) as (host, port):
        conn = OneConnection(host, port)
        try:
            status, _, body = conn.send("GET", "/ready")
            deadline = time.monotonic() + READY_TIMEOUT_S
            while status != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
                status, _, body = conn.send("GET", "/ready")
            assert status == 200, body
            yield conn
        finally:
            conn.close()


def fields(body: dict[str, Any]) -> list[str]:
    return [p["field"] for p in body["fields"]]


# -- bad input over one connection -------------------------------------------------------------------------

BAD_REQUESTS = [
    ("/api/retrieve", '{"query": "\\ud800abc"}', ["query"]),
    ("/api/retrieve", '{"query": "工资什么时候发", "knowledgeTag": "\\ud800"}', ["knowledgeTag"]),
    ("/api/documents", '{"documents": [{"id": "robust-1", "text": "a\\ud800b"}]}', ["documents.0.text"]),
    ("/api/documents", '{"documents": [{"id": "robust-1", "text": "t", "o": "\\udc00"}]}', ["documents.0.o"]),
    ("/api/documents", '{"documents": [{"id": "robust-1", "text": "t", "": "v"}]}', ["documents.0."]),
    (
        "/api/documents",
        '{"documents": [{"id": "robust-1", "text": "t", "#document": "v"}]}',
        ["documents.0.#document"],
    ),
    (
        "/api/documents",
        '{"documents": [{"id": "robust-1", "text": "t", "chroma:document": "v"}]}',
        ["documents.0.chroma:document"],
    ),
    (
        "/api/documents",
        '{"documents": [{"id": "robust-1", "text": "one"}, {"id": "robust-1", "text": "two"}]}',
        ["documents.1.id"],
    ),
    ("/api/retrieve", b'{"query": "\xff\xfe"}', ["body"]),
    ("/api/documents", b'{"documents": [{"id": "robust-1", "text": "\xc3\x28"}]}', ["body"]),
    ("/api/retrieve", ("[" * DEEP + "]" * DEEP).encode(), ["body"]),
    ("/api/documents", ('{"documents": ' + "[" * DEEP + "]" * DEEP + "}").encode(), ["body"]),
]


def test_every_bad_request_is_a_422_naming_the_field_and_the_connection_stays_usable(
    sieve: Sieve, tmp_path: Path
) -> None:
    chunks_before = sieve.store.count()
    app = create_app(
        make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval"), start=installs(sieve)
    )
    with one_connection(app) as conn:
        for path, raw, named in BAD_REQUESTS:
            status, headers, body = conn.post(path, raw)
            assert status == 422, (path, raw[:80], body)
            assert headers["content-type"] == "application/json"
            assert fields(body) == named, (path, raw[:80], body)
            assert body["error"] and "Traceback" not in body["error"]
            assert "detail" not in body
        status, _, body = conn.post("/api/retrieve", {"query": "工资什么时候发"})
        assert status == 200
        assert body["documents"][0]["docId"] == "hr-payroll-zh"
        assert conn.requests == len(BAD_REQUESTS) + 2
    assert sieve.store.count() == chunks_before  # nothing of a refused request was written
    assert not [c for c in sieve.store.iter_all(include_text=False) if c.metadata["doc_id"] == "robust-1"]


def test_duplicate_ids_name_both_positions_and_store_neither_version(sieve: Sieve, tmp_path: Path) -> None:
    app = create_app(
        make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval"), start=installs(sieve)
    )
    documents = [
        {"id": "robust-dup", "text": "first version"},
        {"id": "robust-dup", "text": "second version"},
    ]
    with one_connection(app) as conn:
        status, _, body = conn.post("/api/documents", {"documents": documents})
    assert status == 422
    assert body["fields"] == [
        {
            "field": "documents.1.id",
            "message": "duplicate id (also documents.0.id); ids must be unique within a request",
        }
    ]
    assert not [c for c in sieve.store.iter_all(include_text=False) if c.metadata["doc_id"] == "robust-dup"]


# -- the last resort ---------------------------------------------------------------------------------------


class ExplodingSieve:
    """A loaded Sieve whose retrieval raises what no handler expects."""

    def __init__(self, settings: Settings, store: ChromaStore) -> None:
        self.settings = settings
        self.store = store
        self.record = None  # the Sieve's document record: none here, as for an index alone

    def retrieve(
        self, query: str, top_k: int, knowledge_tag: str | None = None, principal: Any = None
    ) -> Any:
        raise RuntimeError(f"chain exploded on {query!r}")

    def chunk_count(self, documents: Any) -> int:
        return len(documents)

    def ingest_documents(self, documents: Any, **_: Any) -> IngestReport:
        return IngestReport(documents=len(documents))

    def close(self) -> None:
        pass


def test_an_unexpected_exception_is_a_json_500_with_a_request_id_and_the_connection_stays_usable(
    sieve: Sieve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval")
    app = create_app(settings, start=installs(ExplodingSieve(settings, sieve.store)))
    with caplog.at_level(logging.ERROR), one_connection(app) as conn:
        status, headers, body = conn.post("/api/retrieve", {"query": "boom"})
        assert status == 500
        assert body == {"error": "internal error", "requestId": body["requestId"]}
        assert headers["x-request-id"] == body["requestId"]
        assert len(body["requestId"]) == 16
        # the same connection answers the next requests
        status, _, again = conn.post("/api/retrieve", {"query": "boom again"})
        assert status == 500 and again["requestId"] != body["requestId"]
        assert conn.send("GET", "/health")[0] == 200
        status, _, added = conn.post("/api/documents", {"documents": [{"id": "x", "text": "t"}]})
        assert status == 200 and added["documents"] == 1
    [record] = [r for r in caplog.records if body["requestId"] in r.getMessage()]
    assert record.getMessage() == f"internal error requestId={body['requestId']} on POST /api/retrieve"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "chain exploded on 'boom'"
    assert "Exception in ASGI application" not in caplog.text  # nothing escaped to uvicorn


class FailingMiddleware:
    """Middleware added after the error handlers, as a later feature (auth, a body limit) would be."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            raise ValueError("middleware bug")
        await self.app(scope, receive, send)


def test_an_exception_in_a_later_middleware_is_the_same_json_500_on_the_same_connection(
    sieve: Sieve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(
        make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval"), start=installs(sieve)
    )
    app.add_middleware(FailingMiddleware)
    with caplog.at_level(logging.ERROR), one_connection(app) as conn:
        status, headers, body = conn.send("GET", "/health")
        assert status == 500 and body == {"error": "internal error", "requestId": headers["x-request-id"]}
        assert conn.post("/api/retrieve", {"query": "工资什么时候发"})[0] == 200
    assert "Exception in ASGI application" not in caplog.text


# -- readiness follows a real Chroma server ------------------------------------------------------------------


def poll_ready(conn: OneConnection, status: int, within_s: float) -> tuple[float, dict[str, Any]]:
    start = time.monotonic()
    while True:
        got, _, body = conn.send("GET", "/ready")
        elapsed = time.monotonic() - start
        if got == status:
            return elapsed, body
        if elapsed > within_s:
            pytest.fail(f"/ready still {got} {body} after {elapsed:.1f}s (expected {status})")
        time.sleep(0.05)


def test_ready_is_503_while_the_chroma_server_is_down_and_200_when_it_is_back(
    real_embedder, tmp_path: Path
) -> None:
    port = find_free_port()
    settings = make_settings(
        tmp_path / "unused",
        tmp_path / "eval",
        {"rag": {"store": {"mode": "http", "host": "127.0.0.1", "port": port, "collection": "robust-ready"}}},
    )
    data = tmp_path / "chroma"
    data.mkdir()
    with chroma_run(data, port) as first:
        store = ChromaStore.open(settings.rag.store, real_embedder.identity())
        from app.ingest.types import Document

        http_sieve = Sieve(settings, real_embedder, store, reranker=None)
        http_sieve.ingest_documents(
            [Document(doc_id="wifi", title="Wi-Fi", text="The guest Wi-Fi password.")]
        )
        app = create_app(settings, start=installs(http_sieve))
        with one_connection(app) as conn:
            assert conn.send("GET", "/ready")[2] == {"status": "ready"}

            stop_process(first)
            took, body = poll_ready(conn, 503, READY_FLIP_S)
            assert body["status"] == "unavailable"
            assert body["reason"].startswith(
                f"vector store unavailable: Chroma server at http://127.0.0.1:{port} is unreachable: "
            )
            assert conn.send("GET", "/health") == (200, conn.send("GET", "/health")[1], {"status": "alive"})
            status, _, failed = conn.post("/api/retrieve", {"query": "guest wifi"})
            assert status == 503

            with chroma_run(data, port):
                took_back, body = poll_ready(conn, 200, READY_FLIP_S)
                assert body == {"status": "ready"}
                status, _, found = conn.post("/api/retrieve", {"query": "guest wifi password"})
                assert status == 200 and found["documents"][0]["docId"] == "wifi"
    print(f"/ready went 503 {took:.2f}s after the kill and 200 {took_back:.2f}s after the restart")


# -- a broken golden set does not stop the server ----------------------------------------------------------


def test_serve_starts_with_a_too_deep_golden_set_when_invalid_sets_are_allowed(
    real_embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = tmp_path / "golden.jsonl"
    case = {"id": "q1", "query": "工资什么时候发", "expectedDocIds": ["hr-payroll-zh"]}
    golden.write_text(json.dumps(case, ensure_ascii=False) + "\n" + "[" * DEEP + "]" * DEEP + "\n")
    settings = make_settings(
        seeded_store(tmp_path / "store"),
        tmp_path / "eval",
        nested("rag.evaluate.enabled", True),
        nested("rag.evaluate.resource_location", str(golden)),
        nested("rag.evaluate.fail_on_invalid_golden_set", False),
        nested("rag.ingest.on_startup", False),
    )
    monkeypatch.setattr("app.service.load_embedder", lambda _: real_embedder)
    fatal: list[int] = []
    app = create_app(settings, on_fatal=fatal.append)  # the real startup sequence
    with one_connection(app) as conn:
        status, _, body = conn.post("/api/retrieve", {"query": "工资什么时候发"})
        assert status == 200 and body["documents"][0]["docId"] == "hr-payroll-zh"
    assert fatal == []
    report = json.loads((tmp_path / "eval" / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["status"] == "invalid"
    assert f"{golden}:2: invalid JSON: nested too deeply to read" in report["error"]
