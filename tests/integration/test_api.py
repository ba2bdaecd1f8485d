"""The HTTP API in-process (FastAPI TestClient) over a real Sieve: the packaged e5 embedder and an embedded
Chroma holding the sample knowledge base. The Sieve is built once for the module; each test makes its own app
around it with `create_app(settings, start=...)`, so startup costs nothing and settings can differ per test.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.ingest.types import Document
from app.main import AppState, create_app
from app.service import Sieve
from app.settings import Settings, nested
from app.store import ChromaStore
from tests.fixtures.api_app import (
    GOLDEN_SET,
    MAX_QUERY_CHARS,
    READY_TIMEOUT_S,
    make_settings,
    serving,
    wait_ready,
)
from tests.fixtures.api_server import installs
from tests.fixtures.processes import chroma_run, stop_process

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STAGE_NAMES = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def app_settings(sieve: Sieve, tmp_path: Path) -> Settings:
    """The Sieve's settings with this test's own report folder and an admin token."""
    return make_settings(
        Path(sieve.settings.rag.store.path), tmp_path / "eval", nested("rag.server.admin_token", ADMIN_TOKEN)
    )


@pytest.fixture
def client(sieve: Sieve, app_settings: Settings) -> Iterator[TestClient]:
    with serving(app_settings, installs(sieve)) as c:
        yield c


def retrieve(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/api/retrieve", json=body)


# -- health and readiness ----------------------------------------------------------------------------------


def test_ready_is_503_with_the_phase_while_starting_then_200(sieve: Sieve, app_settings: Settings) -> None:
    release = threading.Event()

    def slow_start(state: AppState) -> None:
        state.phase = "loading models and opening the store"
        if not release.wait(timeout=READY_TIMEOUT_S):
            raise TimeoutError("the test never released startup")
        installs(sieve)(state)

    with TestClient(create_app(app_settings, start=slow_start)) as client:
        try:
            assert client.get("/health").status_code == 200
            starting = client.get("/ready")
            assert starting.status_code == 503
            assert starting.json() == {"status": "starting", "reason": "loading models and opening the store"}
            not_yet = retrieve(client, query="工资什么时候发")
            assert not_yet.status_code == 503
            assert "not ready: loading models" in not_yet.json()["error"]
        finally:
            release.set()
        wait_ready(client)
        assert client.get("/ready").json() == {"status": "ready"}
        assert client.get("/health").json() == {"status": "alive"}


def test_failed_startup_keeps_health_alive_and_ready_names_the_error(app_settings: Settings) -> None:
    def broken_start(state: AppState) -> None:
        raise RuntimeError("the index exploded")

    with TestClient(create_app(app_settings, start=broken_start)) as client:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while client.get("/ready").json()["status"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        failed = client.get("/ready")
        assert failed.status_code == 503
        assert failed.json() == {"status": "failed", "reason": "RuntimeError: the index exploded"}
        assert client.get("/health").status_code == 200


# -- retrieval ---------------------------------------------------------------------------------------------


def test_retrieve_puts_the_payroll_policy_first_and_reports_every_stage(client: TestClient) -> None:
    response = retrieve(client, query="工资什么时候发")
    assert response.status_code == 200
    body = response.json()
    assert body["query"] == "工资什么时候发"
    docs = body["documents"]
    assert docs[0]["docId"] == "hr-payroll-zh"
    assert docs[0]["rank"] == 1
    assert [d["rank"] for d in docs] == list(range(1, len(docs) + 1))
    assert 1 <= len(docs) <= 5  # rag.retrieval.top_k
    assert all(isinstance(d["scores"]["dense"], float) for d in docs)
    assert [s["name"] for s in body["stages"]] == STAGE_NAMES
    for stage in body["stages"]:
        assert {"inputCount", "outputCount", "removed", "latencyMs"} <= stage.keys()
        assert stage["removedItems"] is None  # only with debug
        if not stage["skipped"]:
            assert stage["outputCount"] == stage["inputCount"] - stage["removed"] + stage["added"]
    assert body["stages"][0]["inputCount"] == body["originalCount"]
    assert body["finalCount"] == len(docs)
    assert isinstance(body["fallbackUsed"], bool)
    assert body["latencyMs"] > 0
    assert sum(body["candidateOrigins"].values()) == body["originalCount"]


def test_top_k_limits_the_documents(client: TestClient) -> None:
    body = retrieve(client, query="When is salary paid?", topK=2).json()
    assert body["finalCount"] == len(body["documents"]) == 2
    assert "hr-payroll-en" in [d["docId"] for d in body["documents"]]


def test_debug_lists_removed_items_with_reasons_to_the_admin(client: TestClient) -> None:
    body = client.post(
        "/api/retrieve", json={"query": "出差每天的餐补是多少", "debug": True}, headers=ADMIN
    ).json()
    hard_filter = next(s for s in body["stages"] if s["name"] == "hard_filter")
    removed = hard_filter["removedItems"]
    assert len(removed) == hard_filter["removed"] > 0
    assert {"docId": "travel-expense-2022", "reason": "status=retired"} in [
        {"docId": r["docId"], "reason": r["reason"]} for r in removed
    ]
    assert all(r["chunkId"] and r["reason"] for s in body["stages"] for r in s["removedItems"])
    assert all(s["withheld"] == [] for s in body["stages"])
    assert "travel-expense-2022" not in [d["docId"] for d in body["documents"]]


def test_debug_counts_the_removals_of_hidden_documents_for_a_reader(client: TestClient) -> None:
    answer = retrieve(client, query="出差每天的餐补是多少", debug=True)
    assert "travel-expense-2022" not in answer.text
    stages = answer.json()["stages"]
    assert any(g["reason"] == "status=retired" for s in stages for g in s["withheld"])
    for stage in stages:
        assert len(stage["removedItems"]) + sum(g["count"] for g in stage["withheld"]) == stage["removed"]


def test_unknown_knowledge_tag_returns_no_documents(client: TestClient) -> None:
    response = retrieve(client, query="工资什么时候发", knowledgeTag="no-such-tag")
    assert response.status_code == 200
    assert response.json()["documents"] == []
    assert response.json()["finalCount"] == 0


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"query": "   "}, "query", "must not be blank"),
        ({"topK": 3}, "query", "Field required"),
        ({"query": "工资", "topK": 0}, "topK", "greater than or equal to 1"),
        ({"query": "工资", "topK": 101}, "topK", "less than or equal to 100"),
        ({"query": "工资", "topK": "abc"}, "topK", "valid integer"),
        ({"query": "工资", "topK": True}, "topK", "valid integer"),
        ({"query": "工资", "topK": "3"}, "topK", "valid integer"),
        ({"query": "工资", "debug": "yes"}, "debug", "valid boolean"),
        ({"query": "工资", "knowledgeTag": 7}, "knowledgeTag", "valid string"),
        ({"query": "工资", "top_k": 3}, "top_k", "Extra inputs are not permitted"),
        ({"query": "x" * (MAX_QUERY_CHARS + 1)}, "query", f"max_query_chars={MAX_QUERY_CHARS}"),
    ],
    ids=[
        "blank-query",
        "missing-query",
        "topK-0",
        "topK-101",
        "topK-abc",
        "topK-true",
        "topK-digit-string",
        "debug-yes",
        "knowledgeTag-number",
        "unknown-field",
        "oversized-query",
    ],
)
def test_bad_retrieve_requests_get_422_naming_the_field(
    client: TestClient, body: dict[str, Any], field: str, message: str
) -> None:
    response = retrieve(client, **body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error.startswith(f"{field}: ")
    assert message in error


def test_malformed_json_gets_422_saying_so(client: TestClient) -> None:
    response = client.post(
        "/api/retrieve", content='{"query": "工资'.encode(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"].startswith("body: malformed JSON")


def test_a_query_of_exactly_max_query_chars_is_accepted(client: TestClient) -> None:
    assert retrieve(client, query="x" * MAX_QUERY_CHARS).status_code == 200


# -- ingest over HTTP --------------------------------------------------------------------------------------


def test_added_document_is_retrievable(client: TestClient) -> None:
    document = {
        "id": "api-test-unicorn-allowance",
        "title": "Unicorn grooming allowance",
        "text": "Every employee who keeps a unicorn receives a grooming allowance of 42 credits per month.",
        "knowledge": "api-test",
        "owner": "facilities",
    }
    added = client.post("/api/documents", json={"documents": [document]}, headers=ADMIN)
    assert added.status_code == 200
    assert added.json() == {
        "documents": 1,
        "chunks": 1,
        "added": 1,
        "updated": 0,
        "unchanged": 0,
        "deleted": 0,
        "errors": [],
    }

    body = retrieve(
        client, query="How much is the unicorn grooming allowance?", knowledgeTag="api-test"
    ).json()
    assert [d["docId"] for d in body["documents"]] == ["api-test-unicorn-allowance"]
    assert body["documents"][0]["knowledgeTag"] == "api-test"

    again = client.post("/api/documents", json={"documents": [document]}, headers=ADMIN)
    assert again.json()["added"] == 0 and again.json()["unchanged"] == 1


def test_nested_document_metadata_is_422_naming_the_field(client: TestClient) -> None:
    response = client.post(
        "/api/documents",
        json={"documents": [{"id": "bad-doc", "text": "text", "owner": {"team": "hr"}}]},
        headers=ADMIN,
    )
    assert response.status_code == 422
    assert [p["field"] for p in response.json()["fields"]] == ["documents.0.owner"]
    assert "'owner' must be a scalar" in response.json()["error"]


# -- evaluations over HTTP ---------------------------------------------------------------------------------


def test_latest_evaluation_is_404_before_any_run(client: TestClient, app_settings: Settings) -> None:
    response = client.get("/api/evaluations/latest", headers=ADMIN)
    assert response.status_code == 404
    assert "no evaluation report yet" in response.json()["error"]


def test_evaluations_are_403_without_a_configured_admin_token(sieve: Sieve, tmp_path: Path) -> None:
    settings = make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval")
    assert settings.rag.server.admin_token is None
    with serving(settings, installs(sieve)) as client:
        response = client.post("/api/evaluations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 403
    assert "rag.server.admin_token" in response.json()["error"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-Admin-Token": ADMIN_TOKEN}])
def test_evaluations_are_401_with_a_missing_or_wrong_token(
    client: TestClient, headers: dict[str, str]
) -> None:
    response = client.post("/api/evaluations", headers=headers)
    assert response.status_code == 401
    assert response.json() == {
        "error": "missing or wrong admin token: send 'Authorization: Bearer <rag.server.admin_token>'"
    }


def test_evaluation_with_the_token_returns_the_report_and_becomes_latest(
    client: TestClient, app_settings: Settings
) -> None:
    response = client.post("/api/evaluations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    report = response.json()
    assert report["schemaVersion"] == 3  # the typed Report (app/evaluation/report/model.py)
    assert report["status"] == "ok"
    cases_in_file = len(json.loads(GOLDEN_SET.read_text(encoding="utf-8"))["cases"])
    assert report["summary"]["cases"] == len(report["cases"]) == cases_in_file
    assert report["summary"]["failed"] == 0
    assert [s["name"] for s in report["stages"]] == ["candidates", *STAGE_NAMES]
    payroll = next(c for c in report["cases"] if c["query"] == "工资什么时候发")
    assert payroll["rankedDocuments"][0]["docId"] == "hr-payroll-zh"

    latest = client.get("/api/evaluations/latest", headers=ADMIN)
    assert latest.status_code == 200
    assert latest.json() == report
    assert (Path(app_settings.rag.evaluate.output_dir) / "retrieval-eval-latest.md").exists()


def test_latest_html_is_404_with_a_json_error_before_any_run(client: TestClient) -> None:
    response = client.get("/api/evaluations/latest.html", headers=ADMIN)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert (
        "no HTML evaluation report yet (retrieval-eval-latest.html does not exist)"
        in response.json()["error"]
    )


def test_latest_html_serves_the_page_of_the_latest_evaluation(
    client: TestClient, app_settings: Settings
) -> None:
    assert client.get("/api/evaluations/latest.html").status_code == 401
    report = client.post("/api/evaluations", headers=ADMIN).json()
    response = client.get("/api/evaluations/latest.html", headers=ADMIN)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    on_disk = Path(app_settings.rag.evaluate.output_dir) / "retrieval-eval-latest.html"
    assert response.text == on_disk.read_text(encoding="utf-8")
    assert f'<div class="value">{report["summary"]["ndcg"]:.3f}</div>' in response.text
    assert html.escape(report["cases"][0]["query"], quote=True) in response.text
    spec = client.get("/openapi.json").json()["paths"]["/api/evaluations/latest.html"]["get"]
    assert "text/html" in spec["responses"]["200"]["content"]
    assert spec["security"]


# -- the store goes away -----------------------------------------------------------------------------------


def test_unreachable_store_answers_503_with_a_clear_message(
    real_embedder, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    port = free_port()
    settings = make_settings(
        tmp_path / "unused-store",
        tmp_path / "eval",
        {
            "rag": {
                "store": {"mode": "http", "host": "127.0.0.1", "port": port, "collection": "api-unreachable"}
            }
        },
    )
    with chroma_run(tmp_path, port) as server:
        store = ChromaStore.open(settings.rag.store, real_embedder.identity())
        http_sieve = Sieve(settings, real_embedder, store, reranker=None)
        http_sieve.ingest_documents(
            [
                Document(
                    doc_id="wifi-guest", title="Guest Wi-Fi", text="The guest Wi-Fi password is on the badge."
                )
            ]
        )
        with serving(settings, installs(http_sieve)) as client:
            assert (
                retrieve(client, query="guest wifi password").json()["documents"][0]["docId"] == "wifi-guest"
            )
            stop_process(server)
            response = retrieve(client, query="guest wifi password")
            assert response.status_code == 503
            error = response.json()["error"]
            assert error.startswith(f"vector store unavailable: Chroma server at http://127.0.0.1:{port}")
            assert "Traceback" not in response.text
            assert client.get("/health").status_code == 200
