"""Every error answer of every route has exactly the documented shape (docs/api.md, "Errors"): `{"error"}`,
with `fields` when the problem is in the request (a 422, an unknown id), `count` with a 422, `limit` with a
413, `requestId` with a 500 or a store's 503, and no other key.

The routes are read from the app's OpenAPI document, so a route added later is walked too: each is asked
what provokes the errors it declares (no token, no admin token configured, an unknown id, a malformed body,
a bad query parameter or path parameter, a body over the limit, not ready yet) and a method it does not
take. The app is the real one around a fake Sieve (tests/fixtures/fake_api.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import AppState, create_app
from app.settings import Settings
from app.store import StoreUnavailableError
from tests.fixtures.fake_api import ADMIN_TOKEN, FakeSieve, api_settings  # noqa: F401

API_TOKEN = "unit-test-reader-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
UNKNOWN_ID = "no-such-id"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

ERROR = {"error"}
IN_REQUEST = {"error", "fields"}
INVALID = {"error", "fields", "count"}
TOO_LARGE = {"error", "limit"}
IDENTIFIED = {"error", "requestId"}

# a body each route takes, so that the answer is about what the test provokes, not the body
VALID_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/api/retrieve"): {"query": "pay"},
    ("POST", "/api/documents"): {"documents": [{"id": "a", "text": "t"}]},
    ("POST", "/api/evaluations/runs"): {},
    ("POST", "/api/experiments"): {"experiment": "variants: {off: {rag.chain.bm25.enabled: false}}"},
    ("POST", "/api/label/judgments"): {"caseId": UNKNOWN_ID, "id": "c_1", "grade": 1, "who": "tester"},
}


class _Sieve(FakeSieve):
    def delete_documents(self, doc_ids: list[str]) -> tuple[int, int]:
        return 0, 0  # it knows no document


@contextmanager
def app_client(settings: Settings, ready: bool = True, fail_with: Exception | None = None) -> Iterator[Any]:
    """A TestClient with no token of its own, and the app's state; `ready=False` leaves startup unfinished."""
    fake = _Sieve(settings, fail_with=fail_with)

    def start(state: AppState) -> None:
        if ready:
            state.sieve = fake
            state.phase = "ready"
            state.ready = True

    app = create_app(settings, start=start)
    with TestClient(app) as client:
        yield client, app.state.sieve_state


def with_server(settings: Settings, **changes: Any) -> Settings:
    """`settings` with these `rag.server` settings changed."""
    server = settings.rag.server.model_copy(update=changes)
    return settings.model_copy(update={"rag": settings.rag.model_copy(update={"server": server})})


@pytest.fixture
def guarded(settings: Settings) -> Iterator[Any]:  # noqa: F811
    """Both tokens configured: every route but /health and /ready needs one."""
    with app_client(with_server(settings, api_token=API_TOKEN)) as served:
        yield served


@pytest.fixture
def spec(guarded: Any) -> dict[str, Any]:
    client, _ = guarded
    return client.get("/openapi.json").json()


ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}


def operations(spec: dict[str, Any], status: int | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) of every route, or of those declaring an error body for `status` (`/ready`'s
    503 is its probe answer, `ReadyResponse`, not an error body)."""
    return [
        (method.upper(), path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if status is None or _declared_error(op, status)
    ]


def _declared_error(op: dict[str, Any], status: int) -> bool:
    answer = op["responses"].get(str(status), {})
    return answer.get("content", {}).get("application/json", {}).get("schema") == ERROR_SCHEMA


def filled(path: str, value: str = UNKNOWN_ID) -> str:
    """`path` with each `{parameter}` given `value`."""
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        path = path[:start] + value + path[end + 1 :]
    return path


def path_parameters(op: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in op.get("parameters", []) if p["in"] == "path"]


def send(client: TestClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    body = VALID_BODIES.get((method, path))
    if body is not None and "content" not in kwargs:
        kwargs["json"] = body
    return client.request(method, filled(path), **kwargs)


def assert_shape(response: httpx.Response, status: int, keys: set[str], what: str) -> None:
    assert response.status_code == status, f"{what}: {response.status_code} {response.text}"
    body = response.json()
    assert set(body) == keys, f"{what}: {body}"
    assert isinstance(body["error"], str) and body["error"], what
    for problem in body.get("fields", []):
        assert set(problem) == {"field", "message"}, f"{what}: {body}"


def test_the_walk_reads_every_route_of_the_api(spec: dict[str, Any]) -> None:
    walked = {(m, p) for m, p, _ in operations(spec)}
    assert {
        ("POST", "/api/retrieve"),
        ("POST", "/api/documents"),
        ("DELETE", "/api/documents/{doc_id}"),
        ("GET", "/api/jobs/{job_id}"),
        ("POST", "/api/label/judgments"),
    } <= walked
    assert len(walked) == 17  # the routes of today: a new one is walked by the tests below as it is


def test_no_token_is_401_error_only(guarded: Any, spec: dict[str, Any]) -> None:
    client, _ = guarded
    for method, path, _ in operations(spec, 401):
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            response = send(client, method, path, headers=headers)
            assert_shape(response, 401, ERROR, f"{method} {path} {headers}")


def test_an_admin_route_without_an_admin_token_configured_is_403_error_only(
    settings: Settings,  # noqa: F811
    spec: dict[str, Any],
) -> None:
    with app_client(with_server(settings, admin_token=None)) as (client, _):
        for method, path, _ in operations(spec, 403):
            assert_shape(send(client, method, path, headers=ADMIN), 403, ERROR, f"{method} {path}")


def test_an_unknown_id_is_404_naming_it_and_an_absent_resource_404_error_only(
    guarded: Any, spec: dict[str, Any]
) -> None:
    client, _ = guarded
    for method, path, op in operations(spec, 404):
        response = send(client, method, path, headers=ADMIN)
        named = [p["name"] for p in path_parameters(op)] or [
            f for f in ("caseId",) if f in (VALID_BODIES.get((method, path)) or {})
        ]
        if response.status_code == 200:  # declared for the admin reads alike; this one has nothing to miss
            assert not named, f"{method} {path}"
            continue
        assert_shape(response, 404, IN_REQUEST if named else ERROR, f"{method} {path}")
        assert [p["field"] for p in response.json().get("fields", [])] == named
    assert_shape(client.get("/api/no-such-route", headers=ADMIN), 404, ERROR, "an unknown path")


def test_a_method_a_path_does_not_take_is_405_error_only(guarded: Any, spec: dict[str, Any]) -> None:
    client, _ = guarded
    for path, ops in spec["paths"].items():
        taken = {m.upper() for m in ops} | ({"HEAD"} if "get" in ops else set())
        for method in (m for m in METHODS if m not in taken):
            assert_shape(client.request(method, filled(path), headers=ADMIN), 405, ERROR, f"{method} {path}")


def bad_requests(op: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(what, path value, request arguments) of the invalid requests `op` can be sent: a malformed body and
    one with an unknown field (for a route with a body), a query parameter that is not of its type, a path
    parameter over its maxLength."""
    bad: list[tuple[str, str, dict[str, Any]]] = []
    json_body = {"Content-Type": "application/json"}
    if "requestBody" in op:
        bad += [
            ("a malformed body", UNKNOWN_ID, {"content": b"{", "headers": json_body}),
            ("an unknown field", UNKNOWN_ID, {"json": {"noSuchField": 1}}),
        ]
    for param in op.get("parameters", []):
        schema, name = param.get("schema", {}), param["name"]
        if param["in"] == "query" and schema.get("type") in ("integer", "boolean"):
            bad.append((f"?{name}=maybe", UNKNOWN_ID, {"params": {name: "maybe"}}))
        elif param["in"] == "path" and "maxLength" in schema:
            bad.append((f"a {schema['maxLength'] + 1}-character {name}", "x" * (schema["maxLength"] + 1), {}))
    return bad


def test_a_malformed_body_or_a_bad_parameter_is_422_with_fields_and_count(
    guarded: Any, spec: dict[str, Any]
) -> None:
    client, _ = guarded
    provoked = 0
    for method, path, op in operations(spec, 422):
        for what, value, request in bad_requests(op):
            headers = {**ADMIN, **request.pop("headers", {})}
            response = client.request(method, filled(path, value), headers=headers, **request)
            assert_shape(response, 422, INVALID, f"{method} {path} with {what}")
            provoked += 1
    assert provoked == 14  # 5 routes with a body, 2 query parameters, 2 path parameters with a bound
    stray = client.get("/api/label/queue", params={"noSuchParameter": "1"}, headers=ADMIN)
    assert_shape(stray, 422, INVALID, "an unknown query parameter")


def test_a_body_over_the_limit_is_413_with_the_limit(guarded: Any, spec: dict[str, Any]) -> None:
    client, state = guarded
    limit = state.settings.rag.server.max_body_bytes
    for method, path, _ in operations(spec, 413):
        response = client.request(method, filled(path), content=b"x" * (limit + 1), headers=ADMIN)
        assert_shape(response, 413, TOO_LARGE, f"{method} {path}")
        assert response.json()["limit"] == limit


def test_a_route_that_needs_the_sieve_is_503_error_only_until_ready(
    settings: Settings,  # noqa: F811
    spec: dict[str, Any],
) -> None:
    with app_client(settings, ready=False) as (client, _):
        for method, path, _ in operations(spec, 503):
            response = send(client, method, path, headers=ADMIN)
            assert_shape(response, 503, ERROR, f"{method} {path}")
            assert response.json()["error"].startswith("not ready: ")


def test_a_write_while_another_runs_is_409_error_only(guarded: Any) -> None:
    client, state = guarded
    with state.write_lock:
        for path in ("/api/evaluations", "/api/evaluations/runs"):
            assert_shape(send(client, "POST", path, headers=ADMIN), 409, ERROR, f"POST {path}")


@pytest.mark.parametrize(
    ("failure", "status"), [(RuntimeError("a bug"), 500), (StoreUnavailableError("store is down"), 503)]
)
def test_a_failed_request_is_identified_by_its_request_id(
    settings: Settings,  # noqa: F811
    failure: Exception,
    status: int,
) -> None:
    with app_client(settings, fail_with=failure) as (client, _):
        response = send(client, "POST", "/api/retrieve", headers=ADMIN)
    assert_shape(response, status, IDENTIFIED, f"POST /api/retrieve failing with {failure!r}")
    assert response.headers["X-Request-Id"] == response.json()["requestId"]


def test_the_declared_error_schema_has_no_other_key(spec: dict[str, Any]) -> None:
    properties = set(spec["components"]["schemas"]["ErrorResponse"]["properties"])
    assert properties == ERROR | IN_REQUEST | INVALID | TOO_LARGE | IDENTIFIED
