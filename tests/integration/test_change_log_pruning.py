"""The change log stays small and replicas stay right: a writer deletes entries older than the retention
(after a marker saying so), a replica whose index had not read them re-reads the store instead, a live one
does not, a replica follows other writers while idle, a catch-up reads only the last minutes of the log, and
a long prune does not stop catching up.

Real embedded Chroma, several `LexicalSync`s on one store standing for as many processes; the clock
(`time.time_ns`, which stamps change-log entries and drives pruning) is set by the test, days apart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from app.lexical.index import Analyzer
from app.lexical.sync import GRACE_NS, LexicalSync
from app.settings import StoreSettings
from app.store import ChromaStore, StoredChunk

pytestmark = pytest.mark.integration

DIM = 8
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}
DAY_NS = 86400 * 10**9
NOW = time.time_ns()


def text_of(chunk: StoredChunk) -> str:
    return chunk.text


def chunk(i: int, tag: str = "it") -> StoredChunk:
    return StoredChunk(f"c{i:03d}", f"vpn password policy number {i}", {"doc_id": f"d{i}", "knowledge": tag})


def vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(NOW - 3 * DAY_NS)
    monkeypatch.setattr(time, "time_ns", fake)
    return fake


@pytest.fixture
def store(tmp_path: Path):
    opened = ChromaStore.open(StoreSettings(mode="embedded", path=str(tmp_path / "chroma")), IDENTITY)
    yield opened
    opened.close()


def replica(store: ChromaStore, directory: Path, retention_days: float = 0.0) -> LexicalSync:
    sync = LexicalSync(store, directory, Analyzer(), 1.2, 0.75, 0.0, text_of, retention_days * 86400)
    sync.open()
    return sync


def write(sync: LexicalSync, store: ChromaStore, chunks: list[StoredChunk], seed: int) -> None:
    store.upsert(chunks, vectors(len(chunks), seed))
    sync.apply_commit(chunks, [])
    sync.wait_pruned()  # a prune runs in the background


def retag(sync: LexicalSync, store: ChromaStore, changed: StoredChunk) -> None:
    store.update_metadata([changed.chunk_id], [changed.metadata])
    sync.apply_commit([changed], [])
    sync.wait_pruned()


def test_a_prune_past_a_replicas_watermark_makes_it_reread_the_store_and_a_live_replica_does_not(
    store: ChromaStore, tmp_path: Path, clock: Clock
) -> None:
    store.upsert([chunk(i) for i in range(10)], vectors(10))
    writer = replica(store, tmp_path / "a", retention_days=1)
    behind = replica(store, tmp_path / "b")
    live = replica(store, tmp_path / "c")

    write(writer, store, [chunk(10)], seed=1)  # three days ago
    behind.catch_up()
    live.catch_up()
    assert behind.index.tag_of("c010") == "it"
    asleep = replica(store, tmp_path / "d")
    asleep.close()  # a process stopped three days ago: its index files say so

    clock.now = NOW - 2 * DAY_NS - 3600 * 10**9  # `live` reads the log more often than once a day
    live.catch_up()
    clock.now = NOW - 2 * DAY_NS  # two days ago: c003 moves to finance; `behind` reads nothing since
    retag(writer, store, chunk(3, "finance"))

    clock.now = NOW - 60 * 10**9  # a minute ago: `live` catches up (it serves queries)
    live.catch_up()
    assert live.index.tag_of("c003") == "finance"

    clock.now = NOW  # the writer's next write prunes everything older than a day
    write(writer, store, [chunk(11)], seed=2)
    logged = store.changes_since(0)
    assert [e.stamp for e in logged] == [NOW, NOW]  # the write's entry and the marker, nothing older
    assert [e.pruned_before for e in logged if e.pruned_before is not None] == [NOW - DAY_NS]

    # `behind` last read the log three days ago: the retag's entry is gone, the marker says so
    behind.catch_up()
    assert behind.resyncs == 1
    assert behind.index.tag_of("c003") == "finance"  # from the store, the log no longer has it
    assert "c011" in set(behind.index.ids)
    stored = {c.chunk_id: c.metadata["knowledge"] for c in store.iter_all(include_text=False)}
    assert {i: behind.index.tag_of(i) for i in behind.index.ids} == stored

    live.catch_up()
    assert live.resyncs == 0  # it had read everything the prune deleted
    assert {i: live.index.tag_of(i) for i in live.index.ids} == stored
    assert writer.resyncs == 0

    behind.catch_up()
    assert behind.resyncs == 1  # the marker is applied once

    # a process started after the prune, from index files older than it, re-reads the store at start
    woken = replica(store, tmp_path / "d")
    assert woken.resyncs == 1
    assert {i: woken.index.tag_of(i) for i in woken.index.ids} == stored


def test_a_writer_prunes_at_most_once_per_retention_over_24(
    store: ChromaStore, tmp_path: Path, clock: Clock
) -> None:
    writer = replica(store, tmp_path / "a", retention_days=1)
    write(writer, store, [chunk(0)], seed=0)  # prunes (the first write): a marker, nothing old
    clock.now += 3599 * 10**9  # 1 s short of an hour (a day / 24): no prune
    write(writer, store, [chunk(1)], seed=1)
    clock.now += 2 * 10**9
    write(writer, store, [chunk(2)], seed=2)  # prunes again
    markers = [e for e in store.changes_since(0) if e.pruned_before is not None]
    assert [e.stamp for e in markers] == [NOW - 3 * DAY_NS, NOW - 3 * DAY_NS + 3601 * 10**9]


def test_retention_0_keeps_every_entry(store: ChromaStore, tmp_path: Path, clock: Clock) -> None:
    writer = replica(store, tmp_path / "a")
    for day in range(3):
        clock.now = NOW - (2 - day) * DAY_NS
        write(writer, store, [chunk(day)], seed=day)
    assert len(store.changes_since(0)) == 3


def test_a_catch_up_reads_the_log_from_its_last_read_not_from_the_last_foreign_entry(
    store: ChromaStore, tmp_path: Path, clock: Clock
) -> None:
    writer = replica(store, tmp_path / "a")
    asked: list[int] = []
    inner = store.changes_since

    def recording(stamp: int):
        asked.append(stamp)
        return inner(stamp)

    store.changes_since = recording  # type: ignore[method-assign]
    for i in range(3):
        clock.now += 3600 * 10**9
        write(writer, store, [chunk(i)], seed=i)  # its own entries: nothing for it to apply
        writer.catch_up()
    # each read starts GRACE before the previous one began, not at the index's opening three hours back
    assert asked == [NOW - 3 * DAY_NS + h * 3600 * 10**9 - GRACE_NS for h in (0, 1, 2)]


def test_a_following_replica_catches_up_while_no_query_arrives(store: ChromaStore, tmp_path: Path) -> None:
    writer = replica(store, tmp_path / "a")
    follower = replica(store, tmp_path / "b")
    follower.refresh_seconds = 1.0
    follower.follow()
    try:
        write(writer, store, [chunk(7, "hr")], seed=7)
        deadline = time.monotonic() + 15
        while "c007" not in set(follower.index.ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert follower.index.tag_of("c007") == "hr"
    finally:
        follower.close()
        writer.close()
    assert follower._follower is None


def test_a_long_prune_does_not_hold_up_catching_up(store: ChromaStore, tmp_path: Path) -> None:
    writer = replica(store, tmp_path / "a", retention_days=1)
    other = replica(store, tmp_path / "b")
    entered, release = threading.Event(), threading.Event()
    inner = store.prune_changes

    def slow_prune(before: int) -> int:
        entered.set()
        release.wait(30)
        return inner(before)

    store.prune_changes = slow_prune  # type: ignore[method-assign]
    try:
        store.upsert([chunk(0)], vectors(1))
        writer.apply_commit([chunk(0)], [])  # its first write: a prune starts, and stalls
        assert entered.wait(30)
        write(other, store, [chunk(1, "hr")], seed=1)
        writer.catch_up()  # while the prune is still deleting
        assert writer.index.tag_of("c001") == "hr"
    finally:
        release.set()
        writer.wait_pruned()
