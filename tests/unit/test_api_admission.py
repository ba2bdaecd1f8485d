"""/api/retrieve's admission and its debug view for readers and admins, with the real app around a fake Sieve.

The real server, model and store under a burst: tests/integration/test_hostile_load.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import AppState, create_app
from app.retrieval.types import Candidate, Removal, RetrievalResult, RetrievalTrace, StageTrace
from app.settings import Settings, load_settings, merge, nested

ADMIN_TOKEN = "unit-test-admin-token"
API_TOKEN = "unit-test-reader-token"
REPO = Path(__file__).resolve().parents[2]


class FakeStore:
    description = "fake store"

    def heartbeat(self) -> None:
        pass


class FakeSieve:
    """Every query: one document; hard_filter removed a draft and a future document's chunks, diversity a
    chunk of the kept document. `gate`, when set, holds every retrieval until it is set."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = FakeStore()
        self.gate: threading.Event | None = None
        self.entered = threading.Semaphore(0)

    def retrieve(
        self, query: str, top_k: int, knowledge_tag: str | None = None, principal: object = None
    ) -> RetrievalResult:
        self.entered.release()
        if self.gate is not None:
            self.gate.wait(10)
        hard = [
            Removal("c_draft", "hr-remote-work-draft", "status=draft"),
            Removal("c_future", "policy-v3", "effectiveFrom=2099-01-01 > today=2026-01-01"),
            Removal("c_draft2", "hr-remote-work-draft", "status=draft"),
        ]
        diversity = [Removal("c_2", "doc-1", "doc=doc-1 already has 1")]
        trace = RetrievalTrace(
            stages=[
                StageTrace("hard_filter", 5, 2, hard, [], 0.1),
                StageTrace("diversity", 2, 1, diversity, [], 0.1),
            ],
            withheld={"c_draft": "status=draft", "c_draft2": "status=draft", "c_future": "not yet effective"},
        )
        doc = Candidate("c_1", "doc-1", "text", {"title": "Title"}, scores={"dense": 0.5})
        return RetrievalResult(query, [doc], 5, False, trace, 1.0)

    def close(self) -> None:
        pass


def settings_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **server: object) -> Settings:
    monkeypatch.setenv("SIEVE_CONFIG", str(REPO / "config" / "application.yml"))
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    return load_settings(
        merge(
            nested("rag.store.path", str(tmp_path / "store")),
            nested("rag.ingest.paths", []),
            nested("rag.server.jobs_dir", str(tmp_path / "jobs")),
            *(nested(f"rag.server.{key}", value) for key, value in server.items()),
        )
    )


def serve(fake: FakeSieve) -> TestClient:
    def start(state: AppState) -> None:
        state.sieve = fake
        state.phase = "ready"
        state.ready = True

    return TestClient(create_app(fake.settings, start=start))


def debug_stages(client: TestClient, token: str | None) -> dict[str, dict]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    answer = client.post("/api/retrieve", json={"query": "q", "debug": True}, headers=headers)
    assert answer.status_code == 200, answer.text
    return {s["name"]: s for s in answer.json()["stages"]}


@pytest.mark.parametrize("tokens", ["no api token", "api token"])
def test_a_reader_sees_hidden_removals_as_counts_and_the_admin_sees_their_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokens: str
) -> None:
    api_token = API_TOKEN if tokens == "api token" else None
    fake = FakeSieve(settings_with(tmp_path, monkeypatch, admin_token=ADMIN_TOKEN, api_token=api_token))
    with serve(fake) as client:
        reader = debug_stages(client, api_token)
        assert reader["hard_filter"]["removed"] == 3
        assert reader["hard_filter"]["removedItems"] == []
        assert reader["hard_filter"]["withheld"] == [
            {"reason": "status=draft", "count": 2},
            {"reason": "not yet effective", "count": 1},
        ]
        assert reader["diversity"]["removedItems"] == [
            {"chunkId": "c_2", "docId": "doc-1", "reason": "doc=doc-1 already has 1", "relevant": None}
        ]
        assert reader["diversity"]["withheld"] == []

        admin = debug_stages(client, ADMIN_TOKEN)
        assert [i["docId"] for i in admin["hard_filter"]["removedItems"]] == [
            "hr-remote-work-draft",
            "policy-v3",
            "hr-remote-work-draft",
        ]
        assert admin["hard_filter"]["withheld"] == []


def test_without_debug_there_are_neither_items_nor_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve(FakeSieve(settings_with(tmp_path, monkeypatch))) as client:
        stages = client.post("/api/retrieve", json={"query": "q"}).json()["stages"]
    assert [(s["removedItems"], s["withheld"]) for s in stages] == [(None, None), (None, None)]


def test_over_the_limit_a_retrieval_is_429_with_retry_after_while_health_and_ready_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSieve(
        settings_with(tmp_path, monkeypatch, max_concurrent_retrievals=1, max_queued_retrievals=0)
    )
    fake.gate = threading.Event()
    with serve(fake) as client:
        answers: list[int] = []
        first = threading.Thread(
            target=lambda: answers.append(client.post("/api/retrieve", json={"query": "q"}).status_code)
        )
        first.start()
        try:
            assert fake.entered.acquire(timeout=10)  # the first retrieval holds the only slot
            refused = client.post("/api/retrieve", json={"query": "q"})
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"].startswith("too many retrievals at once: 1 running")
            assert client.get("/health").json() == {"status": "alive"}
            assert client.get("/ready").json() == {"status": "ready"}
        finally:
            fake.gate.set()
            first.join(10)
        assert answers == [200]
        assert client.post("/api/retrieve", json={"query": "q"}).status_code == 200
