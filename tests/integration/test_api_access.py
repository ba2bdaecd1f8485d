"""Who may call what, body and document limits, and write jobs: the real app over a real Sieve (packaged e5,
embedded Chroma with the sample base), in-process, plus one check over a real uvicorn server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.service import Sieve
from app.settings import Settings, nested
from tests.fixtures.api_app import make_settings, serving
from tests.fixtures.api_server import installs

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "admin-token-0123456789"
API_TOKEN = "reader-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": f"Bearer {API_TOKEN}"}
QUERY = {"query": "工资什么时候发", "topK": 3}
JOB_TIMEOUT_S = 120.0


def settings_for(sieve: Sieve, tmp_path: Path, *overrides: dict[str, Any]) -> Settings:
    return make_settings(Path(sieve.settings.rag.store.path), tmp_path / "eval", *overrides)


def doc(doc_id: str, text: str, **meta: Any) -> dict[str, Any]:
    return {"id": doc_id, "title": doc_id, "text": text, **meta}


def post_docs(client: TestClient, docs: list[dict[str, Any]], headers: dict[str, str] | None = None):
    return client.post("/api/documents", json={"documents": docs}, headers=headers or {})


# -- writes need the admin token ---------------------------------------------------------------------------


def test_writes_are_403_when_no_admin_token_is_configured(sieve: Sieve, tmp_path: Path) -> None:
    with serving(settings_for(sieve, tmp_path), installs(sieve)) as client:
        for response in (
            post_docs(client, [doc("x-doc", "some text")], ADMIN),
            client.post("/api/evaluations", headers=ADMIN),
            client.get("/api/evaluations/latest", headers=ADMIN),
            client.get("/api/evaluations/latest.html", headers=ADMIN),
            client.get("/api/jobs", headers=ADMIN),
        ):
            assert response.status_code == 403
            assert "set rag.server.admin_token" in response.json()["error"]
        # reads stay open without an api token
        assert client.post("/api/retrieve", json=QUERY).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": ADMIN_TOKEN},
        {"Authorization": f"Bearer {API_TOKEN}"},  # a reader cannot write
        {"Authorization": b"Bearer " + "tökén-ümlaut-0123456789".encode()},  # not ASCII
        {"Authorization": b"Bearer \xff\xfe\xfd"},  # not even UTF-8
    ],
)
def test_a_write_without_the_admin_token_is_401_and_changes_nothing(
    sieve: Sieve,
    tmp_path: Path,
    headers: dict[str, Any],
) -> None:
    settings = settings_for(
        sieve,
        tmp_path,
        nested("rag.server.admin_token", ADMIN_TOKEN),
        nested("rag.server.api_token", API_TOKEN),
    )
    before = sieve.store.count()
    with serving(settings, installs(sieve)) as client:
        response = post_docs(client, [doc("hr-payroll-zh", "attacker text", status="retired")], headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert "admin token" in response.json()["error"]
        assert client.post("/api/retrieve", json=QUERY, headers=ADMIN).json()["documents"][0]["docId"] == (
            "hr-payroll-zh"
        )
    assert sieve.store.count() == before


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_admin_token_writes_with_any_case_of_the_scheme(
    sieve: Sieve,
    tmp_path: Path,
    scheme: str,
) -> None:
    settings = settings_for(sieve, tmp_path, nested("rag.server.admin_token", ADMIN_TOKEN))
    with serving(settings, installs(sieve)) as client:
        response = post_docs(
            client,
            [doc("access-test-doc", "A short note used by the access tests.", knowledge="access-test")],
            {"Authorization": f"{scheme} {ADMIN_TOKEN}"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["documents"] == 1


# -- reads need the api token when one is set --------------------------------------------------------------


def test_with_an_api_token_reads_need_it_and_ops_pages_stay_open(sieve: Sieve, tmp_path: Path) -> None:
    settings = settings_for(
        sieve,
        tmp_path,
        nested("rag.server.admin_token", ADMIN_TOKEN),
        nested("rag.server.api_token", API_TOKEN),
    )
    with serving(settings, installs(sieve)) as client:
        assert client.post("/api/retrieve", json=QUERY).status_code == 401
        assert (
            client.post("/api/retrieve", json=QUERY, headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert client.post("/api/retrieve", json=QUERY, headers=READER).status_code == 200
        assert client.post("/api/retrieve", json=QUERY, headers=ADMIN).status_code == 200
        # the reader token does not open the reports (they hold the golden queries) or the jobs
        assert client.get("/api/evaluations/latest", headers=READER).status_code == 401
        assert client.get("/api/evaluations/latest.html", headers=READER).status_code == 401
        assert client.get("/api/jobs", headers=READER).status_code == 401
        for path in ("/health", "/ready", "/docs", "/openapi.json"):
            assert client.get(path).status_code == 200, path


def test_the_openapi_document_declares_the_bearer_scheme(sieve: Sieve, tmp_path: Path) -> None:
    with serving(settings_for(sieve, tmp_path), installs(sieve)) as client:
        spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/api/documents"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/health"]["get"]


# -- limits ------------------------------------------------------------------------------------------------


def test_a_body_over_max_body_bytes_is_413_naming_the_limit(sieve: Sieve, tmp_path: Path) -> None:
    settings = settings_for(
        sieve,
        tmp_path,
        nested("rag.server.admin_token", ADMIN_TOKEN),
        nested("rag.server.max_body_bytes", 4096),
    )
    with serving(settings, installs(sieve)) as client:
        response = post_docs(client, [doc("big", "x" * 5000)], ADMIN)
        assert response.status_code == 413
        assert response.json()["limit"] == 4096
        assert "rag.server.max_body_bytes=4096" in response.json()["error"]


def test_a_document_over_max_document_chars_is_422_naming_it(sieve: Sieve, tmp_path: Path) -> None:
    settings = settings_for(
        sieve,
        tmp_path,
        nested("rag.server.admin_token", ADMIN_TOKEN),
        nested("rag.ingest.max_document_chars", 100),
    )
    before = sieve.store.count()
    with serving(settings, installs(sieve)) as client:
        response = post_docs(client, [doc("short-one", "fine"), doc("long-one", "y" * 101)], ADMIN)
    assert response.status_code == 422
    assert response.json() == {
        "error": "documents[1] (id long-one): text has 101 characters, more than "
        "rag.ingest.max_document_chars=100",
        "fields": [
            {
                "field": "documents.1.text",
                "message": "documents[1] (id long-one): text has 101 characters, more than "
                "rag.ingest.max_document_chars=100",
            }
        ],
        "count": 1,
    }
    assert sieve.store.count() == before  # the good document in the same request was not written either


# -- jobs ----------------------------------------------------------------------------------------------------


def wait_job(client: TestClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}", headers=ADMIN).json()
        if job["state"] in ("done", "failed", "interrupted"):
            return job
        time.sleep(0.1)
    pytest.fail(f"job {job_id} not finished after {JOB_TIMEOUT_S}s")


def test_a_write_over_sync_write_chunks_becomes_a_job_with_progress_and_report(
    sieve: Sieve,
    tmp_path: Path,
) -> None:
    settings = settings_for(
        sieve,
        tmp_path,
        nested("rag.server.admin_token", ADMIN_TOKEN),
        nested("rag.server.sync_write_chunks", 2),
    )
    sections = [f"## Section {i}\n\nThe zebra crossing rule number {i} says walk slowly." for i in range(4)]
    with serving(settings, installs(sieve)) as client:
        accepted = post_docs(client, [doc("job-zebra-rules", "\n\n".join(sections), knowledge="jobs")], ADMIN)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job"]
        # queries are served while the job runs
        assert client.post("/api/retrieve", json=QUERY).status_code == 200
        job = wait_job(client, job_id)
        assert job["state"] == "done", job
        # progress also counts the new chunks stored in committed batches
        assert job["chunks"] == 4 and job["progress"] == {"embedded": 4, "stored": 4, "chunks": 4}
        assert job["report"]["added"] == 4 and job["report"]["errors"] == []
        listed = client.get("/api/jobs", headers=ADMIN).json()["jobs"]
        assert job_id in [j["id"] for j in listed]
        found = client.post(
            "/api/retrieve", json={"query": "zebra crossing rule", "knowledgeTag": "jobs"}
        ).json()
        assert [d["docId"] for d in found["documents"]] == ["job-zebra-rules"]
        missing = client.get("/api/jobs/j-20260101T000000-00000000", headers=ADMIN)
        assert missing.status_code == 404


def test_access_is_enforced_over_a_real_server(sieve: Sieve, tmp_path: Path, free_port) -> None:
    import threading

    import uvicorn

    from app.main import create_app

    settings = settings_for(sieve, tmp_path, nested("rag.server.admin_token", ADMIN_TOKEN))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, start=installs(sieve)), host="127.0.0.1", port=port, log_config=None
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            # one keep-alive connection: a refused write with a non-ASCII header, then a normal query
            bad = client.post(
                "/api/documents",
                json={"documents": [doc("x", "y")]},
                headers={"Authorization": b"Bearer \xe9\xe9\xe9"},
            )
            assert bad.status_code == 401
            assert client.post("/api/retrieve", json=QUERY).status_code == 200
            too_big = client.post("/api/documents", content=b"{" * (3 * 1024 * 1024), headers=ADMIN)
            assert too_big.status_code == 413
    finally:
        server.should_exit = True
        thread.join(10)
