"""The query log's writer: record format, size rotation, age pruning, the bounded queue, file modes, and the
admin-only route, without the model or the store (a fake Sieve answers the queries)."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from app.api.querylog import ByteBudget, QueryLog, query_record, read_newest, utc_timestamp
from app.main import AppState, create_app
from app.querylog_files import log_files
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace
from app.settings import QueryLogSettings, load_settings, merge, nested

LINE_BYTES = 300
T0 = datetime(2026, 5, 4, 9, 0, 0, tzinfo=UTC)
ADMIN_TOKEN = "querylog-admin-token-0123"


def record(i: int, moment: datetime = T0, line_bytes: int = LINE_BYTES) -> dict[str, Any]:
    """A record whose JSON line (newline included) is exactly `line_bytes` long."""
    base = {"time": utc_timestamp(moment), "query": f"q{i:03d}:", "n": i}
    pad = line_bytes - len(json.dumps(base, ensure_ascii=False)) - 1
    base["query"] += "x" * pad
    assert len(json.dumps(base, ensure_ascii=False)) + 1 == line_bytes
    return base


def settings(tmp_path: Path, **values: Any) -> QueryLogSettings:
    values.setdefault("keep_hours", None)  # the byte budget has tests of its own
    return QueryLogSettings(enabled=True, path=str(tmp_path / "log" / "queries.jsonl"), **values)


def numbers(path: Path) -> list[int]:
    return [json.loads(line)["n"] for line in path.read_text(encoding="utf-8").splitlines()]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def running(querylog: QueryLog) -> Iterator[QueryLog]:
    querylog.start()
    try:
        yield querylog
    finally:
        querylog.close()


# -- the record ----------------------------------------------------------------------------------------------


def candidate(chunk_id: str, doc_id: str, **scores: float) -> Candidate:
    return Candidate(chunk_id=chunk_id, doc_id=doc_id, text="t", scores=dict(scores))


def test_a_record_holds_the_query_the_results_by_the_score_that_ordered_them_and_the_latency() -> None:
    result = RetrievalResult(
        query="工资什么时候发",
        documents=[
            candidate("c1", "d1", dense=0.9, bm25=3.2, fused=0.8123456789, rerank=4.5),
            candidate("c2", "d2", dense=0.7, bm25=1.0, fused=0.61),
            candidate("c3", "d3", dense=0.55),
        ],
        original_count=50,
        fallback_used=True,
        trace=RetrievalTrace(),
        latency_ms=12.34567,
    )
    assert query_record(result, "hr", 3, now=T0 + timedelta(microseconds=120_999)) == {
        "time": "2026-05-04T09:00:00.120Z",
        "query": "工资什么时候发",
        "knowledgeTag": "hr",
        "topK": 3,
        "results": [
            {"chunkId": "c1", "docId": "d1", "score": 4.5, "scoreKey": "rerank"},
            {"chunkId": "c2", "docId": "d2", "score": 0.61, "scoreKey": "fused"},
            {"chunkId": "c3", "docId": "d3", "score": 0.55, "scoreKey": "dense"},
        ],
        "abstained": False,
        "latencyMs": 12.346,
    }


def test_a_query_with_no_document_is_recorded_as_abstained() -> None:
    empty = RetrievalResult("nothing", [], 0, False, RetrievalTrace(), 1.0)
    entry = query_record(empty, None, 5, now=T0)
    assert (entry["results"], entry["abstained"], entry["knowledgeTag"]) == ([], True, None)


def test_the_time_is_utc_whatever_the_offset_it_is_given_in() -> None:
    shanghai = datetime(2026, 5, 5, 1, 0, 0, 5000, tzinfo=timezone(timedelta(hours=8)))
    assert utc_timestamp(shanghai) == "2026-05-04T17:00:00.005Z"


# -- writing, rotation ---------------------------------------------------------------------------------------


def test_close_writes_every_queued_record_in_order(tmp_path: Path) -> None:
    querylog = QueryLog(settings(tmp_path))
    with running(querylog):
        for i in range(50):
            assert querylog.submit(record(i))
    assert numbers(querylog.path) == list(range(50))
    assert querylog.dropped == 0


def test_the_file_rotates_before_it_would_pass_max_bytes_and_the_oldest_file_is_dropped(
    tmp_path: Path,
) -> None:
    # 1024 bytes hold 3 lines of 300 (900); a 4th (1200) would pass it. 10 lines: [0-2] [3-5] [6-8] [9]; with
    # 2 rotated files kept the first file is gone.
    querylog = QueryLog(settings(tmp_path, max_bytes=1024, max_files=2, max_age_days=None))
    with running(querylog):
        for i in range(10):
            querylog.submit(record(i))
    path = querylog.path
    assert log_files(path) == [path, path.with_name("queries.jsonl.1"), path.with_name("queries.jsonl.2")]
    assert numbers(path) == [9]
    assert numbers(path.with_name("queries.jsonl.1")) == [6, 7, 8]
    assert numbers(path.with_name("queries.jsonl.2")) == [3, 4, 5]
    assert [e["n"] for e in read_newest(path, 100)] == [9, 8, 7, 6, 5, 4, 3]
    assert [e["n"] for e in read_newest(path, 4)] == [9, 8, 7, 6]


def test_with_max_files_0_a_full_file_is_deleted_instead_of_rotated(tmp_path: Path) -> None:
    querylog = QueryLog(settings(tmp_path, max_bytes=1024, max_files=0, max_age_days=None))
    with running(querylog):
        for i in range(7):
            querylog.submit(record(i))
    assert log_files(querylog.path) == [querylog.path]
    assert numbers(querylog.path) == [6]


def test_a_line_longer_than_max_bytes_is_still_written_alone_in_its_file(tmp_path: Path) -> None:
    querylog = QueryLog(settings(tmp_path, max_bytes=1024, max_files=3, max_age_days=None))
    with running(querylog):
        querylog.submit(record(0))
        querylog.submit(record(1, line_bytes=2000))
        querylog.submit(record(2))
    assert numbers(querylog.path) == [2]
    assert numbers(querylog.rotated(1)) == [1]
    assert numbers(querylog.rotated(2)) == [0]


@given(
    sizes=st.lists(st.integers(min_value=80, max_value=700), min_size=1, max_size=30),
    max_files=st.integers(min_value=0, max_value=3),
)
def test_rotation_keeps_a_suffix_of_the_lines_in_order_and_files_within_max_bytes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], max_files: int
) -> None:
    folder = tmp_path_factory.mktemp("rotation")
    querylog = QueryLog(settings(folder, max_bytes=1024, max_files=max_files, max_age_days=None))
    with running(querylog):
        for i, size in enumerate(sizes):
            querylog.submit(record(i, line_bytes=size))
    files = log_files(querylog.path)
    kept = [n for path in reversed(files) for n in numbers(path)]
    assert kept == list(range(len(sizes) - len(kept), len(sizes)))  # a suffix, in order
    assert len(files) <= max_files + 1
    for path in files:
        assert path.stat().st_size <= 1024
    # every file but the newest was full: the next line would not have fitted
    for older, newer in zip(files[1:], files[:-1], strict=True):
        first_of_newer = numbers(newer)[0]
        assert older.stat().st_size + sizes[first_of_newer] > 1024


# -- age -----------------------------------------------------------------------------------------------------


def test_age_pruning_drops_old_files_and_old_lines_and_keeps_the_rest(tmp_path: Path) -> None:
    now = T0 + timedelta(days=40)
    querylog = QueryLog(settings(tmp_path, max_bytes=1024, max_files=3, max_age_days=30), clock=now.timestamp)
    # lines 0-2 (40 days old) fill path.2, 3-5 (31, 31, 29 days old) path.1, 6 (1 day old) the current one
    ages = [40, 40, 40, 31, 31, 29, 1]
    with running(querylog):
        for i, age in enumerate(ages):
            querylog.submit(record(i, now - timedelta(days=age)))
        assert querylog.wait_written(5.0)
        for index, age in ((2, 40), (1, 29)):
            modified = (now - timedelta(days=age)).timestamp()
            os.utime(querylog.rotated(index), (modified, modified))
        querylog.prune()
        assert log_files(querylog.path) == [querylog.path, querylog.rotated(1)]
        assert numbers(querylog.rotated(1)) == [5]  # 31 > 30 days: dropped; 29 kept
        assert mode(querylog.rotated(1)) == 0o600
        assert numbers(querylog.path) == [6]
        querylog.submit(record(7, now))  # the writer goes on appending after a prune
    assert numbers(querylog.path) == [6, 7]


def test_the_current_file_loses_its_old_lines_and_stays_writable(tmp_path: Path) -> None:
    now = T0 + timedelta(days=10)
    querylog = QueryLog(settings(tmp_path, max_age_days=2), clock=now.timestamp)
    with running(querylog):
        for i, age in enumerate([5, 3, 1, 0]):
            querylog.submit(record(i, now - timedelta(days=age)))
        querylog.wait_written(5.0)
        querylog.prune()
        assert numbers(querylog.path) == [2, 3]
        querylog.submit(record(4, now))
    assert numbers(querylog.path) == [2, 3, 4]
    assert mode(querylog.path) == 0o600


def test_numbered_files_beyond_max_files_are_deleted(tmp_path: Path) -> None:
    config = settings(tmp_path, max_files=1, max_age_days=None)
    folder = Path(config.path).parent
    folder.mkdir(parents=True)
    for index in (1, 2, 3):
        (folder / f"queries.jsonl.{index}").write_text(json.dumps(record(index)) + "\n")
    querylog = QueryLog(config)
    querylog.prune()
    assert sorted(p.name for p in folder.iterdir()) == ["queries.jsonl.1"]


def test_the_writer_prunes_at_start(tmp_path: Path) -> None:
    now = T0 + timedelta(days=100)
    config = settings(tmp_path, max_age_days=30)
    path = Path(config.path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record(0, T0)) + "\n" + json.dumps(record(1, now)) + "\n")
    with running(QueryLog(config, clock=now.timestamp)) as querylog:
        deadline = time.monotonic() + 5
        while numbers(path) != [1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert numbers(path) == [1]
        assert querylog.newest(10) == [record(1, now)]


# -- the queue -----------------------------------------------------------------------------------------------


def test_a_full_queue_drops_and_counts_instead_of_waiting(tmp_path: Path) -> None:
    querylog = QueryLog(settings(tmp_path, queue_size=2))  # the writer not started: nothing drains it
    started = time.perf_counter()
    accepted = [querylog.submit(record(i)) for i in range(5)]
    assert time.perf_counter() - started < 1.0
    assert accepted == [True, True, False, False, False]
    assert querylog.dropped == 3
    with running(querylog):
        pass
    assert numbers(querylog.path) == [0, 1]


def test_a_burst_over_the_byte_budget_is_dropped_and_counted_and_the_history_stays(tmp_path: Path) -> None:
    # capacity 4 x 2048 bytes; keep_hours 1: a burst of 819 bytes, then 8192 * 0.9 bytes an hour
    now = [0.0]
    querylog = QueryLog(
        settings(tmp_path, max_bytes=2048, max_files=4, keep_hours=1.0), monotonic=lambda: now[0]
    )
    with running(querylog):
        accepted = [querylog.submit(record(i, line_bytes=200)) for i in range(10)]
        assert accepted == [True] * 4 + [False] * 6  # 4 x 200 <= 819 < 5 x 200
        assert (querylog.dropped, querylog.dropped_over_budget, querylog.dropped_queue_full) == (6, 6, 0)
        now[0] += 3600.0 * 200 / (8192 * 0.9)  # the steady rate brings back room for one more line
        assert querylog.submit(record(10, line_bytes=200)) is True
        assert querylog.wait_written(5.0)
    assert numbers(querylog.path) == [0, 1, 2, 3, 10]


def test_the_budget_lets_through_what_the_rotated_files_hold_in_keep_hours() -> None:
    budget = ByteBudget.for_settings(
        QueryLogSettings(max_bytes=10 * 1024 * 1024, max_files=4, keep_hours=2.0)
    )
    assert budget is not None
    capacity = 4 * 10 * 1024 * 1024
    assert budget.burst + budget.rate * 2 * 3600 == pytest.approx(capacity)
    assert ByteBudget.for_settings(QueryLogSettings(keep_hours=None)) is None


def test_after_close_records_are_dropped(tmp_path: Path) -> None:
    querylog = QueryLog(settings(tmp_path))
    with running(querylog):
        querylog.submit(record(0))
    assert querylog.submit(record(1)) is False
    assert querylog.dropped == 1
    assert numbers(querylog.path) == [0]


def test_wait_written_returns_once_the_records_before_it_are_on_disk(tmp_path: Path) -> None:
    with running(QueryLog(settings(tmp_path))) as querylog:
        for i in range(20):
            querylog.submit(record(i))
        assert querylog.wait_written(5.0)
        assert [e["n"] for e in querylog.newest(3)] == [19, 18, 17]


# -- modes and reading ---------------------------------------------------------------------------------------


def test_files_are_created_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        querylog = QueryLog(settings(tmp_path, max_bytes=1024, max_files=2))
        with running(querylog):
            for i in range(4):
                querylog.submit(record(i))
    finally:
        os.umask(previous)
    assert mode(querylog.path) == 0o600
    assert mode(querylog.rotated(1)) == 0o600
    assert mode(querylog.path.parent) == 0o700


def test_an_existing_file_with_a_wider_mode_is_narrowed_to_0600(tmp_path: Path) -> None:
    config = settings(tmp_path)
    path = Path(config.path)
    path.parent.mkdir(parents=True)
    path.write_text("")
    path.chmod(0o644)
    with running(QueryLog(config)):
        pass
    assert mode(path) == 0o600


def test_reading_skips_a_line_cut_short_and_reads_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "queries.jsonl"
    lines = [json.dumps(record(i, line_bytes=5000)) for i in range(40)]  # 200 kB: several 64 kB blocks
    path.write_text("\n".join(lines) + "\n" + '{"time": "2026-05-0', encoding="utf-8")
    assert [e["n"] for e in read_newest(path, 100)] == list(range(39, -1, -1))
    assert read_newest(tmp_path / "missing.jsonl", 10) == []


# -- the routes, in-process with a fake Sieve ----------------------------------------------------------------


class FakeSieve:
    def __init__(self, top_k: int = 5):
        self.settings = SimpleNamespace(
            rag=SimpleNamespace(retrieval=SimpleNamespace(max_query_chars=1000, top_k=top_k))
        )

    def retrieve(self, query: str, top_k: int, tag: str | None, principal: object = None) -> RetrievalResult:
        docs = [] if query == "nothing" else [candidate("c1", "d1", dense=0.8, fused=0.75)]
        return RetrievalResult(query, docs, 10, False, RetrievalTrace(), 3.0)


def app_settings(tmp_path: Path, enabled: bool, admin: str | None):
    empty = tmp_path / "application.yml"
    empty.write_text("", encoding="utf-8")
    return load_settings(
        merge(
            nested("rag.querylog.enabled", enabled),
            nested("rag.querylog.path", str(tmp_path / "ql" / "queries.jsonl")),
            nested("rag.server.jobs_dir", str(tmp_path / "jobs")),
            nested("rag.server.admin_token", admin),
        ),
        config_path=empty,
    )


def fake_start(state: AppState) -> None:
    state.sieve = FakeSieve()
    state.phase = "ready"
    state.ready = True


@contextmanager
def client_for(tmp_path: Path, enabled: bool, admin: str | None) -> Iterator[TestClient]:
    app = create_app(app_settings(tmp_path, enabled, admin), start=fake_start)
    with TestClient(app) as client:
        deadline = time.monotonic() + 10  # /ready would probe the store, which the fake has not
        while not app.state.sieve_state.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        yield client


def test_each_retrieve_is_logged_and_only_the_admin_reads_the_log(tmp_path: Path) -> None:
    with client_for(tmp_path, enabled=True, admin=ADMIN_TOKEN) as client:
        assert (
            client.post("/api/retrieve", json={"query": "工资什么时候发", "knowledgeTag": "hr"}).status_code
            == 200
        )
        assert client.post("/api/retrieve", json={"query": "nothing", "topK": 3}).status_code == 200
        assert (
            client.post("/api/retrieve", json={"query": " "}).status_code == 422
        )  # not answered: not logged
        assert client.get("/api/querylog").status_code == 401
        assert (
            client.get(
                "/api/querylog", headers={"Authorization": "Bearer wrong-token-0123456789"}
            ).status_code
            == 401
        )
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert client.get("/api/querylog?limit=0", headers=admin).status_code == 422
        unknown = client.get("/api/querylog?limt=5", headers=admin)
        assert unknown.status_code == 422 and unknown.json()["fields"][0]["field"] == "query.limt"
        body = client.get("/api/querylog?limit=10", headers=admin).json()
    assert (body["enabled"], body["dropped"]) == (True, 0)
    newest, older = body["entries"]
    assert (newest["query"], newest["topK"], newest["abstained"], newest["results"]) == (
        "nothing",
        3,
        True,
        [],
    )
    assert (older["query"], older["knowledgeTag"], older["topK"], older["abstained"]) == (
        "工资什么时候发",
        "hr",
        5,
        False,
    )
    assert older["results"] == [{"chunkId": "c1", "docId": "d1", "score": 0.75, "scoreKey": "fused"}]
    assert older["latencyMs"] == 3.0
    path = tmp_path / "ql" / "queries.jsonl"
    assert [json.loads(line)["query"] for line in path.read_text(encoding="utf-8").splitlines()] == [
        "工资什么时候发",
        "nothing",
    ]
    assert mode(path) == 0o600


def test_the_log_route_is_403_without_an_admin_token_configured(tmp_path: Path) -> None:
    with client_for(tmp_path, enabled=True, admin=None) as client:
        client.post("/api/retrieve", json={"query": "vpn"})
        refused = client.get("/api/querylog", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert refused.status_code == 403
    assert "rag.server.admin_token" in refused.json()["error"]


def test_disabled_nothing_is_written(tmp_path: Path) -> None:
    with client_for(tmp_path, enabled=False, admin=ADMIN_TOKEN) as client:
        assert client.post("/api/retrieve", json={"query": "vpn"}).status_code == 200
        body = client.get("/api/querylog", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert body == {
        "enabled": False,
        "dropped": 0,
        "droppedBy": {"queueFull": 0, "overBudget": 0},
        "entries": [],
    }
    assert not (tmp_path / "ql").exists()
