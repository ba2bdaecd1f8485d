"""The findings of a hostile reader, reproduced through a real uvicorn server over a real Sieve (the packaged
e5 embedder, an embedded Chroma holding the sample base), with an admin token and a reader token:

- a 2 MB `knowledgeTag` sent 30 times must not push earlier entries out of the query log;
- a judgment whose `who` holds U+2028 must not break the labelling queue or the case view;
- a body of 150,000 unknown keys is answered at once with a small 422;
- `/docs` and every asset it references come from the server itself (no network).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.service import Sieve
from app.settings import Settings
from app.store import ChromaStore
from tests.fixtures.api_server import ADMIN_TOKEN, installs, make_settings, uvicorn_server
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
READER_TOKEN = "hostile-reader-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READER = {"Authorization": f"Bearer {READER_TOKEN}"}
CASE = "zh-payroll-001"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def settings(base: Path) -> Settings:
    return make_settings(
        seeded_store(base / "store"),
        base / "eval",
        {"rag": {"server": {"api_token": READER_TOKEN}}},
        {"rag": {"querylog": {"enabled": True, "path": str(base / "querylog" / "queries.jsonl")}}},
        {
            "rag": {
                "evaluate": {"resource_location": str(REPO / "golden_set" / "golden-set.json")},
                "label": {
                    "drafts": str(base / "label" / "drafts.jsonl"),
                    "judgments": str(base / "label" / "judgments.jsonl"),
                    "queue": str(base / "label" / "queue.jsonl"),
                },
            }
        },
    )


@pytest.fixture(scope="module")
def server(settings: Settings, real_embedder: Any) -> Iterator[str]:
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    sieve = Sieve(settings, real_embedder, store, reranker=None)
    try:
        with uvicorn_server(create_app(settings, start=installs(sieve))) as (host, port):
            yield f"http://{host}:{port}"
    finally:
        sieve.close()


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def querylog(client: httpx.Client) -> dict[str, Any]:
    answer = client.get("/api/querylog", params={"limit": 1000}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_thirty_requests_with_a_2_mb_tag_leave_every_earlier_log_entry_in_place(client: httpx.Client) -> None:
    earlier = [f"hostile earlier query {i}" for i in range(5)]
    for query in earlier:
        assert client.post("/api/retrieve", json={"query": query}, headers=READER).status_code == 200
    before = querylog(client)
    assert {e["query"] for e in before["entries"]} >= set(earlier)
    statuses = set()
    tag = "t" * 2_000_000
    for _ in range(30):
        answer = client.post("/api/retrieve", json={"query": "payday", "knowledgeTag": tag}, headers=READER)
        statuses.add(answer.status_code)
        assert len(answer.content) < 4096  # the answer names the bound, it does not echo the tag
    assert statuses == {422}
    after = querylog(client)
    assert {e["query"] for e in after["entries"]} >= set(earlier)
    assert all(len(e.get("knowledgeTag") or "") <= 256 for e in after["entries"])
    assert len(json.dumps(after)) < 1_000_000


def test_the_log_stays_bounded_on_disk_and_no_file_was_rotated(
    client: httpx.Client, settings: Settings
) -> None:
    path = Path(settings.rag.querylog.path)
    assert path.exists() and not path.with_name(path.name + ".1").exists()
    assert path.stat().st_size < 100_000


def test_a_u2028_judgment_is_stored_and_read_back_and_labelling_keeps_working(
    client: httpx.Client, settings: Settings
) -> None:
    case = client.get(f"/api/label/cases/{CASE}", headers=ADMIN)
    assert case.status_code == 200, case.text
    chunk = case.json()["items"][0]["id"]
    judgments = Path(settings.rag.label.judgments)
    for who in ("ann\u2028bob", "x\u2029y", "a\u0085b", "nul\x00l"):
        answer = client.post(
            "/api/label/judgments", json={"caseId": CASE, "id": chunk, "grade": 2, "who": who}, headers=ADMIN
        )
        lines_before = judgments.read_bytes().count(b"\n") if judgments.exists() else 0
        # refused without writing (a control or line-break character in a name), or stored and read back
        assert answer.status_code in (200, 422), answer.text
        if answer.status_code == 422:
            assert (judgments.read_bytes().count(b"\n") if judgments.exists() else 0) == lines_before
    good = client.post(
        "/api/label/judgments", json={"caseId": CASE, "id": chunk, "grade": 1, "who": "carol"}, headers=ADMIN
    )
    assert good.status_code == 200, good.text
    # a line another tool wrote with U+2028 raw still reads as one line
    with judgments.open("a", encoding="utf-8") as f:
        line = {"caseId": CASE, "query": case.json()["query"], "id": chunk, "docId": "x", "grade": 3}
        f.write(
            json.dumps({**line, "who": "dan\u2028", "at": "2026-01-01T00:00:00Z"}, ensure_ascii=False) + "\n"
        )
    for path in (f"/api/label/cases/{CASE}", "/api/label/queue"):
        answer = client.get(path, headers=ADMIN)
        assert answer.status_code == 200, answer.text
        assert answer.json()["fileProblems"] == []
    raters = {
        j["who"]
        for item in client.get(f"/api/label/cases/{CASE}", headers=ADMIN).json()["items"]
        for j in item["judgments"]
    }
    assert {"carol", "dan"} <= raters
    assert not re.search(
        "[\u2028\u2029\u0085]", judgments.read_text(encoding="utf-8").replace("dan\u2028", "")
    )


def test_a_body_of_150000_keys_is_answered_at_once_with_a_small_422(client: httpx.Client) -> None:
    body = json.dumps({"query": "pay", **{f"{i:x}": 1 for i in range(150_000)}}, separators=(",", ":"))
    started = time.perf_counter()
    answer = client.post(
        "/api/retrieve", content=body, headers={**READER, "Content-Type": "application/json"}
    )
    elapsed = time.perf_counter() - started
    print(
        f"150,000-key body of {len(body)} bytes: {answer.status_code} in {elapsed:.3f} s, "
        f"{len(answer.content)} bytes"
    )
    assert answer.status_code == 422
    assert len(answer.content) < 2048 and answer.json()["count"] == 1
    assert elapsed < 1.0


def test_docs_and_every_asset_it_references_come_from_the_server(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text) + re.findall(
        r"url: '([^']+)'", page.text
    )
    assert refs and all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    assert "http://" not in page.text and "https://" not in page.text
    for ref in refs:
        asset = client.get(ref)
        assert asset.status_code == 200 and asset.content, ref
    assert client.get("/openapi.json").json()["info"]["title"] == "Sieve"
