"""The labelling API (app/api/label.py) on the main app: the page is open and carries no data; every
`/api/label/*` call needs the admin token; a judgment is one appended line; bad input is a 4xx naming the
field or the file. A fake Sieve (fake chains and store) stands in for the models."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings, load_settings, merge, nested
from app.store.types import StoredChunk
from tests.fixtures.label_fakes import FakeChain, FakeStore

TOKEN = "label-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHUNKS = ["pay#0", "pay#1", "leave#0", "faq#0"]


class Store(FakeStore):
    def iter_all(self, include_text: bool = True, include_vectors: bool = False) -> Iterator[StoredChunk]:
        return iter(self.held.values())


class Lexical:
    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]:
        return {i: float(len(i)) for i in ids}


class Analyzer:
    def tokens(self, text: str) -> list[str]:
        return text.lower().split()


class FakeSieve:
    def __init__(self, settings: Settings, answers: dict[str, list[str]]) -> None:
        self.settings = settings
        self.chain = FakeChain(answers)
        self.store = Store(CHUNKS)
        self.lexical = Lexical()
        self.analyzer = Analyzer()
        self.answers = answers

    def with_settings(self, settings: Settings) -> FakeSieve:
        other = FakeSieve(settings, {q: list(reversed(ids)) for q, ids in self.answers.items()})
        other.store = self.store
        return other


def settings_for(tmp: Path, admin_token: str | None = TOKEN) -> Settings:
    return load_settings(
        merge(
            nested("rag.evaluate.resource_location", str(tmp / "golden.json")),
            nested("rag.evaluate.output_dir", str(tmp / "eval")),
            nested("rag.label.judgments", str(tmp / "judgments.jsonl")),
            nested("rag.label.drafts", str(tmp / "drafts.jsonl")),
            nested("rag.label.queue", str(tmp / "queue.jsonl")),
            nested("rag.server.jobs_dir", str(tmp / "jobs")),
            nested("rag.server.admin_token", admin_token),
        )
    )


def write_golden(tmp: Path) -> None:
    cases = [
        {"id": "pay", "query": "when is payday", "expectedDocIds": ["pay"]},
        {"id": "judged", "query": "leave days", "expectedDocIds": ["leave"], "judgments": {"faq#0": 0}},
    ]
    (tmp / "golden.json").write_text(json.dumps({"datasetVersion": "1", "cases": cases}))
    (tmp / "drafts.jsonl").write_text(
        json.dumps({"id": "d1", "query": "new hire laptop", "draft": True}) + "\n"
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    write_golden(tmp_path)
    settings = settings_for(tmp_path)
    app = create_app(settings, start=lambda state: None)
    state = app.state.sieve_state
    answers = {"when is payday": ["pay#0", "faq#0"], "leave days": ["leave#0"], "new hire laptop": ["faq#0"]}
    state.sieve, state.phase, state.ready = FakeSieve(settings, answers), "ready", True
    with TestClient(app) as test_client:
        yield test_client


def test_the_page_is_open_static_and_fetches_only_its_server(tmp_path: Path) -> None:
    app = create_app(settings_for(tmp_path), start=lambda state: None)
    with TestClient(app) as test_client:
        page = test_client.get("/label")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert TOKEN not in page.text and "innerHTML" not in page.text  # data goes in as text nodes only
    assert "http://" not in page.text and "https://" not in page.text  # no outside resource


@pytest.mark.parametrize(
    ("admin_token", "headers", "status"),
    [
        (None, ADMIN, 403),  # labelling is off without an admin token
        (TOKEN, {}, 401),
        (TOKEN, {"Authorization": "Bearer wrong-token-0123456789"}, 401),
        (TOKEN, ADMIN, 503),  # the token is right; the models are still loading
    ],
)
def test_every_api_call_needs_the_admin_token(
    tmp_path: Path, admin_token: str | None, headers: dict[str, str], status: int
) -> None:
    write_golden(tmp_path)
    app = create_app(settings_for(tmp_path, admin_token), start=lambda state: None)
    body = {"caseId": "pay", "id": "pay#0", "grade": 2, "who": "ann"}
    with TestClient(app) as test_client:
        assert test_client.get("/api/label/queue", headers=headers).status_code == status
        assert test_client.get("/api/label/cases/pay", headers=headers).status_code == status
        assert test_client.post("/api/label/judgments", json=body, headers=headers).status_code == status
    assert not (tmp_path / "judgments.jsonl").exists()


def test_the_queue_lists_drafts_and_partly_judged_cases_least_judged_first(client: TestClient) -> None:
    queue = client.get("/api/label/queue", headers=ADMIN).json()
    rows = [(c["caseId"], c["kind"], c["pool"], c["unjudged"]) for c in queue["cases"]]
    # pay: pay#0, faq#0 from current; reversed for the variants: both again -> 2 chunks, pay#0 judged by its
    # document; judged: leave#0 only, judged by expectedDocIds -> fully judged, not listed; d1: the draft
    assert rows == [("d1", "draft", 1, 1), ("pay", "golden", 2, 1)]


def test_a_case_shows_its_pool_variants_and_judgments(client: TestClient) -> None:
    view = client.get("/api/label/cases/pay", headers=ADMIN).json()
    assert (view["query"], view["k"], view["matchOn"], view["kind"]) == ("when is payday", 5, "doc", "golden")
    assert view["terms"] == ["is", "payday", "when"]
    items = {i["id"]: i for i in view["items"]}
    assert [i["id"] for i in view["items"]] == ["faq#0", "pay#0"]  # unjudged by the golden set first
    assert items["pay#0"]["golden"] == {"judged": True, "grade": 1.0, "forbidden": False, "evidence": False}
    assert items["faq#0"]["variants"] == {"current": 2, "dense": 1, "bm25": 1}
    assert items["faq#0"]["segments"] == [["text of faq#0", False]]
    assert items["faq#0"]["unjudged"] is True


def test_a_judgment_is_appended_and_shown(client: TestClient, tmp_path: Path) -> None:
    answer = client.post(
        "/api/label/judgments",
        headers=ADMIN,
        json={"caseId": "pay", "id": "faq#0", "grade": 0, "who": " ann "},
    )
    assert answer.status_code == 200
    item = next(i for i in answer.json()["items"] if i["id"] == "faq#0")
    assert [(j["who"], j["grade"]) for j in item["judgments"]] == [("ann", 0)] and item["unjudged"] is False
    client.post(
        "/api/label/judgments", headers=ADMIN, json={"caseId": "d1", "label": "noAnswer", "who": "bob"}
    )
    client.post(
        "/api/label/judgments", headers=ADMIN, json={"caseId": "pay", "id": "faq#0", "grade": 1, "who": "ann"}
    )
    lines = [json.loads(x) for x in (tmp_path / "judgments.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in x.items() if k != "at"} for x in lines] == [
        {
            "caseId": "pay",
            "query": "when is payday",
            "id": "faq#0",
            "docId": "faq",
            "grade": 0,
            "who": "ann",
            "quote": "text of faq#0",  # the chunk's text: the export's judgment resolves on any chunking
        },
        {
            "caseId": "d1",
            "query": "new hire laptop",
            "id": None,
            "docId": None,
            "label": "noAnswer",
            "who": "bob",
        },
        {
            "caseId": "pay",
            "query": "when is payday",
            "id": "faq#0",
            "docId": "faq",
            "grade": 1,
            "who": "ann",
            "quote": "text of faq#0",
        },
    ]
    assert all(x["at"].endswith("Z") for x in lines)
    view = client.get("/api/label/cases/pay", headers=ADMIN).json()
    assert [j["grade"] for j in view["items"][0]["judgments"]] == [1]  # ann's latest
    assert client.get("/api/label/cases/d1", headers=ADMIN).json()["noAnswer"][0]["who"] == "bob"


def test_a_chunk_outside_the_pool_is_judged_with_its_stored_document(
    client: TestClient, tmp_path: Path
) -> None:
    answer = client.post(
        "/api/label/judgments",
        headers=ADMIN,
        json={"caseId": "pay", "id": "pay#1", "label": "forbidden", "who": "a"},
    )
    assert answer.status_code == 200
    assert json.loads((tmp_path / "judgments.jsonl").read_text())["docId"] == "pay"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"caseId": "pay", "id": "faq#0", "grade": 5, "who": "a"}, 422, "grade"),
        ({"caseId": "pay", "id": "faq#0", "grade": 1, "label": "forbidden", "who": "a"}, 422, "grade"),
        ({"caseId": "pay", "id": "faq#0", "who": "a"}, 422, "grade"),
        ({"caseId": "pay", "grade": 1, "who": "a"}, 422, "id"),
        ({"caseId": "pay", "id": "faq#0", "grade": 1, "who": "   "}, 422, "who"),
        ({"caseId": "pay", "id": "faq#0", "grade": 1}, 422, "who"),
        ({"caseId": "pay", "id": "faq#0", "grade": 1, "who": "a", "extra": 1}, 422, "extra"),
        ({"caseId": "nope", "id": "faq#0", "grade": 1, "who": "a"}, 404, "caseId"),
        ({"caseId": "pay", "id": "nope#0", "grade": 1, "who": "a"}, 422, "id"),
    ],
)
def test_a_bad_judgment_is_refused_naming_its_field(
    client: TestClient, tmp_path: Path, body: dict[str, Any], status: int, field: str
) -> None:
    answer = client.post("/api/label/judgments", headers=ADMIN, json=body)
    assert answer.status_code == status
    assert field in {f["field"] for f in answer.json()["fields"]}
    assert not (tmp_path / "judgments.jsonl").exists()


def test_an_unknown_case_is_404(client: TestClient) -> None:
    assert client.get("/api/label/cases/%00%ff", headers=ADMIN).status_code == 404


def test_a_bad_judgments_line_is_named_and_the_others_still_count(client: TestClient, tmp_path: Path) -> None:
    (tmp_path / "judgments.jsonl").write_text('{"caseId": "pay"}\n')
    answer = client.get("/api/label/cases/pay", headers=ADMIN)
    assert answer.status_code == 200
    assert [p.split(": ")[0] for p in answer.json()["fileProblems"]] == [f"{tmp_path / 'judgments.jsonl'}:1"]


def test_a_broken_golden_set_is_422_naming_the_file(client: TestClient, tmp_path: Path) -> None:
    (tmp_path / "golden.json").write_text("{")
    answer = client.get("/api/label/queue", headers=ADMIN)
    assert answer.status_code == 422 and "golden.json" in answer.json()["error"]


def test_an_unknown_query_parameter_is_refused(client: TestClient) -> None:
    answer = client.get("/api/label/queue?refresh=true&fresh=1", headers=ADMIN)
    assert answer.status_code == 422 and [p["field"] for p in answer.json()["fields"]] == ["fresh"]
    assert client.get("/api/label/queue?refresh=true", headers=ADMIN).status_code == 200
