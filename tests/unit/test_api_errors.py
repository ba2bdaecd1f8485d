"""Every bad request gets a JSON answer in the documented shape, never a 500 with a traceback.

The app is the real one (`create_app`) around a fake Sieve: the fake records what reached it, so a test can
also check that a refused request wrote nothing. The real server and real store are in
tests/integration/test_api_robustness.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.fixtures.fake_api import ADMIN_TOKEN, FakeSieve, api_settings, post_json, serve_fake  # noqa: F401

DEEP = 100_000


@pytest.fixture
def fake(settings: Settings) -> FakeSieve:
    return FakeSieve(settings)


@pytest.fixture
def client(fake: FakeSieve) -> Iterator[TestClient]:
    with serve_fake(fake) as c:
        yield c


def assert_422(response: Any, field: str, message: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error", "fields", "count"}
    assert isinstance(body["error"], str) and body["error"]
    fields = body["fields"]
    assert all(set(p) == {"field", "message"} for p in fields)
    named = [p for p in fields if p["field"] == field]
    assert named, f"{field} not in {fields}"
    assert message in named[0]["message"], named[0]["message"]
    return body


# -- lone surrogates ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"query": "\\ud800abc"}', "query"),
        ('{"query": "abc\\udfff"}', "query"),
        ('{"query": "pay", "knowledgeTag": "\\ud800"}', "knowledgeTag"),
    ],
    ids=["query-high", "query-low", "knowledgeTag"],
)
def test_a_lone_surrogate_in_a_retrieve_field_is_422_naming_it(
    client: TestClient, fake: FakeSieve, raw: str, field: str
) -> None:
    body = assert_422(post_json(client, "/api/retrieve", raw), field, "lone surrogate")
    assert body["error"].startswith(f"{field}: not valid Unicode")
    assert fake.queries == []
    # the same client (one connection in-process) keeps working
    assert client.post("/api/retrieve", json={"query": "pay"}).status_code == 200


def test_a_valid_surrogate_pair_is_an_ordinary_character(client: TestClient, fake: FakeSieve) -> None:
    response = post_json(client, "/api/retrieve", '{"query": "pay \\ud83d\\ude00"}')
    assert response.status_code == 200
    assert fake.queries == [("pay \U0001f600", 5, None)]


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ('{"id": "\\ud800", "text": "t"}', "documents.0.id"),
        ('{"id": "a", "text": "\\udc00 text"}', "documents.0.text"),
        ('{"id": "a", "title": "\\ud800", "text": "t"}', "documents.0.title"),
        ('{"id": "a", "text": "t", "owner": "\\ud800"}', "documents.0.owner"),
        ('{"id": "a", "text": "t", "\\ud800key": "v"}', "documents.0.\\ud800key"),
    ],
    ids=["id", "text", "title", "metadata-value", "metadata-key"],
)
def test_a_lone_surrogate_in_a_document_is_422_naming_the_field(
    client: TestClient, fake: FakeSieve, document: str, field: str
) -> None:
    response = post_json(client, "/api/documents", '{"documents": [' + document + "]}")
    assert_422(response, field, "lone surrogate")
    assert fake.ingested == []


# -- metadata keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "metadata key must not be empty"),
        ("#document", "metadata key '#document' is reserved by the store"),
        ("#embedding", "is reserved by the store"),
        ("chroma:document", "metadata key 'chroma:document' is reserved by the store"),
        ("chroma:anything", "is reserved by the store"),
        ("$and", "is reserved by the store"),
    ],
)
def test_reserved_or_empty_metadata_keys_are_422_naming_the_key(
    client: TestClient, fake: FakeSieve, key: str, message: str
) -> None:
    documents = [{"id": "ok", "text": "fine"}, {"id": "bad", "text": "t", key: "v"}]
    response = client.post("/api/documents", json={"documents": documents})
    assert_422(response, f"documents.1.{key}", message)
    assert fake.ingested == []  # nothing of the request was written, not even the good document


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_metadata_number_the_store_cannot_keep_is_422(
    client: TestClient, fake: FakeSieve, number: str
) -> None:
    # Chroma would accept it and silently store the chunk's whole metadata (doc_id included) as None
    raw = '{"documents": [{"id": "a", "text": "t", "weight": ' + number + "}]}"
    assert_422(post_json(client, "/api/documents", raw), "documents.0.weight", "is not a finite number")
    assert fake.ingested == []


def test_ordinary_metadata_keys_are_accepted(client: TestClient, fake: FakeSieve) -> None:
    document = {"id": "a", "text": "t", "knowledge": "hr", "x#": 1, "a.b": True, "chroma": "ok"}
    assert client.post("/api/documents", json={"documents": [document]}).status_code == 200
    [[doc]] = fake.ingested
    assert doc.metadata == {"knowledge": "hr", "x#": 1, "a.b": True, "chroma": "ok"}


# -- ids ---------------------------------------------------------------------------------------------------


def test_the_same_id_twice_in_one_request_is_422_naming_both_positions(
    client: TestClient, fake: FakeSieve
) -> None:
    documents = [
        {"id": "a", "text": "first"},
        {"id": "b", "text": "other"},
        {"id": "a", "text": "second"},
        {"id": "a", "text": "third"},
    ]
    response = client.post("/api/documents", json={"documents": documents})
    body = assert_422(response, "documents.2.id", "duplicate id (also documents.0.id)")
    assert [p["field"] for p in body["fields"]] == ["documents.2.id", "documents.3.id"]
    assert "documents.0.id" in body["fields"][1]["message"]
    assert fake.ingested == []


# -- bodies that are not JSON --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"query": "pay \xff\xfe"}', "not valid UTF-8"),
        (b"\xc3\x28", "not valid UTF-8"),
        (("[" * DEEP + "]" * DEEP).encode(), "nested too deeply"),
        (('{"query": ' + "[" * DEEP + "]" * DEEP + "}").encode(), "nested too deeply"),
        (b'{"query": ' + b"1" * 5000 + b"}", "malformed JSON"),
        (b'{"query": "pay"', "malformed JSON"),
    ],
    ids=["utf8-in-string", "utf8-bare", "deep-array", "deep-value", "huge-int", "truncated"],
)
@pytest.mark.parametrize("path", ["/api/retrieve", "/api/documents"])
def test_a_body_that_is_not_json_is_422_in_the_documented_shape(
    client: TestClient, fake: FakeSieve, path: str, raw: bytes, message: str
) -> None:
    response = post_json(client, path, raw)
    body = assert_422(response, "body", message)
    assert body["error"].startswith("body: ")
    assert "detail" not in body
    assert fake.queries == [] and fake.ingested == []


def test_json_nested_deeply_but_parseable_is_an_ordinary_422(client: TestClient) -> None:
    depth = 500
    raw = '{"documents": [{"id": "a", "text": "t", "meta": ' + "[" * depth + "]" * depth + "}]}"
    response = post_json(client, "/api/documents", raw)
    assert response.status_code == 422
    assert response.json()["fields"][0]["field"] == "documents.0.meta"


def test_an_unknown_path_answers_json_in_the_error_shape(client: TestClient) -> None:
    response = client.get("/api/nothing-here")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}
    wrong_method = client.get("/api/retrieve")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"error": "Method Not Allowed"}


def test_a_route_error_lists_its_field_under_fields_too(client: TestClient) -> None:
    response = client.post("/api/documents", json={"documents": [{"id": "a", "text": "t", "m": [1]}]})
    assert response.status_code == 422
    body = response.json()
    assert set(body) == {"error", "fields", "count"}
    assert body["fields"] == [{"field": "documents.0.m", "message": body["error"]}]


# -- the last resort ---------------------------------------------------------------------------------------


def test_an_unexpected_exception_is_a_json_500_with_a_request_id_logged_with_the_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeSieve(settings, fail_with=RuntimeError("the chain fell over"))
    with serve_fake(fake) as client, caplog.at_level(logging.ERROR):
        response = client.post("/api/retrieve", json={"query": "pay"})
        assert response.status_code == 500
        body = response.json()
        assert set(body) == {"error", "requestId"}
        assert body["error"] == "internal error"
        assert response.headers["X-Request-Id"] == body["requestId"]
        assert "Traceback" not in response.text and "fell over" not in response.text
        [record] = [r for r in caplog.records if body["requestId"] in r.getMessage()]
        assert record.exc_info is not None and "the chain fell over" in str(record.exc_info[1])
        assert "POST /api/retrieve" in record.getMessage()
        # later requests are served as usual
        assert client.get("/health").json() == {"status": "alive"}
        second = client.post("/api/retrieve", json={"query": "pay"})
        assert second.status_code == 500 and second.json()["requestId"] != body["requestId"]


class RaisingMiddleware:
    """A middleware added after the error handlers (as a later feature would add one) that fails."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            raise KeyError("middleware bug")
        await self.app(scope, receive, send)


def test_an_exception_in_a_middleware_added_later_is_the_same_json_500(
    fake: FakeSieve, caplog: pytest.LogCaptureFixture
) -> None:
    client = serve_fake(fake)
    client.app.add_middleware(RaisingMiddleware)  # type: ignore[attr-defined]
    with client, caplog.at_level(logging.ERROR):
        response = client.get("/health")
        assert response.status_code == 500
        assert response.json() == {"error": "internal error", "requestId": response.headers["X-Request-Id"]}
        assert client.post("/api/retrieve", json={"query": "pay"}).status_code == 200
    [record] = [r for r in caplog.records if response.headers["X-Request-Id"] in r.getMessage()]
    assert record.getMessage().endswith("on GET /health")


def test_a_recursion_error_anywhere_is_the_same_json_500(settings: Settings) -> None:
    fake = FakeSieve(settings, fail_with=RecursionError("maximum recursion depth exceeded"))
    with serve_fake(fake) as client:
        response = client.post("/api/retrieve", json={"query": "pay"})
    assert response.status_code == 500
    assert response.json()["error"] == "internal error"


# -- readiness ---------------------------------------------------------------------------------------------


def test_ready_follows_the_store_heartbeat(client: TestClient, fake: FakeSieve) -> None:
    assert client.get("/ready").json() == {"status": "ready"}
    fake.store.up = False
    deadline_s = 3.0
    response = _poll_ready(client, 503, deadline_s)
    assert response.json() == {
        "status": "unavailable",
        "reason": "vector store unavailable: fake store is unreachable",
    }
    fake.store.up = True
    assert _poll_ready(client, 200, deadline_s).json() == {"status": "ready"}


def _poll_ready(client: TestClient, status: int, deadline_s: float) -> Any:
    import time

    end = time.monotonic() + deadline_s
    while True:
        response = client.get("/ready")
        if response.status_code == status or time.monotonic() > end:
            assert response.status_code == status, response.json()
            return response
        time.sleep(0.05)


# -- the OpenAPI document declares the error answers --------------------------------------------------------


def test_openapi_declares_the_error_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    error_ref = "#/components/schemas/ErrorResponse"
    expected = {
        ("/api/retrieve", "post"): {"401", "413", "422", "500", "503"},
        ("/api/documents", "post"): {"401", "403", "409", "413", "422", "500", "503"},
        ("/api/evaluations", "post"): {"401", "403", "409", "413", "422", "500", "503"},
        ("/api/evaluations/latest", "get"): {"401", "403", "404", "500"},
        ("/api/jobs", "get"): {"401", "403", "500"},
        ("/api/jobs/{job_id}", "get"): {"401", "403", "404", "422", "500"},
    }
    for (path, method), statuses in expected.items():
        responses = spec["paths"][path][method]["responses"]
        assert statuses <= set(responses), (path, set(responses))
        for status in statuses:
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": error_ref}, (path, status, schema)
    assert "HTTPValidationError" not in json.dumps(spec)  # FastAPI's {"detail"} shape is not what we send
    ready = spec["paths"]["/ready"]["get"]["responses"]
    assert ready["503"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ReadyResponse"
    }


def test_an_api_error_carries_its_headers_and_lists_its_field() -> None:
    from app.api.errors import ApiError

    error = ApiError(401, "missing token", headers={"WWW-Authenticate": "Bearer"}, field="authorization")
    assert error.headers == {"WWW-Authenticate": "Bearer"}
    assert error.body() == {
        "error": "missing token",
        "fields": [{"field": "authorization", "message": "missing token"}],
    }
    assert ApiError(404, "no job '\ud800'").body() == {"error": "no job '\\ud800'"}
