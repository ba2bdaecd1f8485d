"""The persisted BM25 index against a real embedded Chroma: loaded without rebuilding, kept in step by
writes, repaired at start after a crash (a kill -9 mid-write, a torn journal, a write the index missed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rank_bm25 import BM25Okapi

from app.lexical.sync import LexicalSync
from app.service import Sieve
from app.settings import LexicalSettings, RagSettings, Settings, StoreSettings
from app.store import ChromaStore, StoredChunk
from tests.fixtures.lexical_store import ANALYZER, DIM, IDENTITY, chunk, open_sync, text_of, vectors

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def assert_matches_store(sync: LexicalSync, store: ChromaStore) -> None:
    """The index holds exactly the store's chunks and scores them as a fresh BM25Okapi (in index order)."""
    stored = {c.chunk_id: c for c in store.iter_all(include_text=True)}
    ids = sync.index.ids
    assert sorted(ids) == sorted(stored)
    reference = BM25Okapi([ANALYZER.tokens(stored[i].text) for i in ids], k1=1.2, b=0.75, epsilon=0.25)
    for query in ("vpn password", "报销 差旅", "salary leave"):
        expected = reference.get_scores(ANALYZER.tokens(query))
        assert sync.index.scores(query, ids) == {i: float(s) for i, s in zip(ids, expected, strict=True)}
    for i in ids:
        assert sync.index.tag_of(i) == stored[i].metadata["knowledge"]


@pytest.fixture
def store(tmp_path: Path):
    opened = ChromaStore.open(StoreSettings(mode="embedded", path=str(tmp_path / "chroma")), IDENTITY)
    yield opened
    opened.close()


def test_loaded_at_start_updated_by_writes_and_repaired_after_a_missed_write(store, tmp_path: Path) -> None:
    directory = tmp_path / "lexical"
    first = [chunk(i) for i in range(300)]
    store.upsert(first, vectors(300))
    sync = open_sync(store, directory)
    assert sync.how_opened.startswith("built from the store")
    assert_matches_store(sync, store)

    # writes through the hook: adds, a retag, deletes
    more = [chunk(i) for i in range(300, 340)]
    store.upsert(more, vectors(40))
    sync.apply_commit(more, [])
    retag = StoredChunk("c00001", first[1].text, {"doc_id": "d1", "knowledge": "hr"})
    store.update_metadata(["c00001"], [retag.metadata])
    sync.apply_commit([retag], [])
    store.delete(["c00002", "c00003"])
    sync.apply_commit([], ["c00002", "c00003"])
    assert_matches_store(sync, store)
    sync.close()

    # reopened: loaded from the files, nothing rebuilt
    sync = open_sync(store, directory)
    assert sync.how_opened.startswith(f"loaded from {directory}")
    assert_matches_store(sync, store)
    sync.close()

    # a write the index never heard of (a writer killed before its change-log entry): found at start
    store.upsert([chunk(500)], vectors(1))
    store.delete(["c00004"])
    sync = open_sync(store, directory)
    assert sync.how_opened.startswith("loaded from")
    assert_matches_store(sync, store)
    sync.close()


def index_then_write_unrecorded_keeping_the_count(store: ChromaStore, directory: Path) -> None:
    """100 chunks indexed in `directory`, then writes no change-log entry records that keep the count (a
    chunk added, c00500, another deleted, c00004): the next start checks the ids in the background."""
    store.upsert([chunk(i) for i in range(100)], vectors(100))
    open_sync(store, directory).close()
    store.upsert([chunk(500)], vectors(1))
    store.delete(["c00004"])


def test_a_server_start_checks_the_ids_in_the_background_only_when_the_counts_agree(
    store, tmp_path: Path
) -> None:
    directory = tmp_path / "lexical"
    # the start does not wait for the id listing, and the thread that does it repairs the index
    index_then_write_unrecorded_keeping_the_count(store, directory)
    sync = LexicalSync(store, directory, ANALYZER, 1.2, 0.75, 0.0, text_of)
    sync.open(check_ids_in_background=True)
    assert sync.id_check is not None
    sync.id_check.join(timeout=60)
    assert not sync.id_check.is_alive()
    assert "c00500" in sync.index and "c00004" not in sync.index
    assert_matches_store(sync, store)
    sync.close()

    # an unrecorded write that changes the count: repaired before open() returns, no thread
    store.upsert([chunk(501)], vectors(1))
    sync = LexicalSync(store, directory, ANALYZER, 1.2, 0.75, 0.0, text_of)
    sync.open(check_ids_in_background=True)
    assert sync.id_check is None
    assert len(sync.index) == 100 + 1 - 1 + 1
    assert_matches_store(sync, store)
    sync.close()


def test_a_torn_journal_line_is_dropped_and_the_change_log_brings_the_write_back(
    store, tmp_path: Path
) -> None:
    directory = tmp_path / "lexical"
    store.upsert([chunk(i) for i in range(50)], vectors(50))
    sync = open_sync(store, directory)
    added = [chunk(i) for i in range(50, 60)]
    store.upsert(added, vectors(10))
    sync.apply_commit(added, [])
    journal = sync._journal.path
    sync.close()
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 40])  # the last record cut short, as by a kill -9
    sync = open_sync(store, directory)
    assert_matches_store(sync, store)
    sync.close()


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, sys.argv[3])
    from tests.fixtures.lexical_store import chunk, vectors, open_sync, IDENTITY
    from app.settings import StoreSettings
    from app.store import ChromaStore
    from pathlib import Path
    store = ChromaStore.open(StoreSettings(mode="embedded", path=sys.argv[1]), IDENTITY)
    sync = open_sync(store, Path(sys.argv[2]))
    print("ready", flush=True)
    i = 1000
    while True:  # write until killed: 20 new chunks, 5 deleted, per commit
        batch = [chunk(j) for j in range(i, i + 20)]
        store.upsert(batch, vectors(20))
        sync.apply_commit(batch, [])
        gone = [f"c{j:05d}" for j in range(i - 20, i - 15)] if i > 1000 else []
        store.delete(gone)
        sync.apply_commit([], gone)
        i += 20
    """
)


@pytest.mark.parametrize("delay", [0.3, 0.9, 1.7])
def test_kill_9_during_writes_leaves_an_index_that_is_repaired_at_start(tmp_path: Path, delay: float) -> None:
    path, directory = tmp_path / "chroma", tmp_path / "lexical"
    store = ChromaStore.open(StoreSettings(mode="embedded", path=str(path)), IDENTITY)
    store.upsert([chunk(i) for i in range(200)], vectors(200))
    open_sync(store, directory).close()  # the first build, so the writer loads and then writes
    store.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(directory), str(REPO)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = ChromaStore.open(StoreSettings(mode="embedded", path=str(path)), IDENTITY)
    try:
        assert store.count() > 200
        sync = open_sync(store, directory)
        assert sync.how_opened.startswith("loaded from")
        assert_matches_store(sync, store)
        sync.close()
    finally:
        store.close()


class _VectorsOnly:
    """What `Sieve` asks of an embedder when nothing is embedded: its identity and dimension."""

    dimension = DIM

    def identity(self) -> dict[str, object]:
        return IDENTITY


def test_sieve_wait_id_check_returns_once_the_background_check_has_repaired_the_index(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "lexical"
    index_then_write_unrecorded_keeping_the_count(store, directory)
    listing = store.iter_ids

    def slow_listing():  # as at a million chunks: the check is still running when the start returns
        time.sleep(1.0)
        yield from listing()

    monkeypatch.setattr(store, "iter_ids", slow_listing)
    settings = Settings(rag=RagSettings(lexical=LexicalSettings(path=str(directory))))
    sieve = Sieve(settings, _VectorsOnly(), store, None)  # type: ignore[arg-type]
    assert "c00500" not in sieve.lexical  # not repaired yet: what a query right after the start sees
    sieve.wait_id_check(timeout=60)
    assert "c00500" in sieve.lexical and "c00004" not in sieve.lexical
    sieve.close()
