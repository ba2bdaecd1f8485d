"""Keeps a process's BM25 index equal to the store: loaded from disk at start, updated on every write, and
caught up with other processes' writes through the store's change log.

- Start (`open`): load the snapshot and replay the journal (app/retrieval/lexical_files.py), nothing read
  back from the store, nothing re-tokenised but the journal's tail; then read the change log since the
  saved watermark and apply what is new; then compare the store's ids with the index's (ids only, no
  text) and repair the difference (fetch only the missing chunks, drop the extra ones): that catches a
  writer killed between its store write and its change-log entry, or a Sieve without the change log.
  Listing a million ids takes seconds, so a server (`open(check_ids_in_background=True)`) does it in a
  thread after start when the index holds as many chunks as the store (a missed write of new chunks or
  a missed delete changes the count, and is then repaired before start-up goes on). A
  retag (metadata only) lost in that same window is not detected: it is corrected when the document is
  next written, or by deleting the index directory (rebuilt at start). No usable
  files (first start, other k1/b/analyzer, a rebuilt collection): build from the store once and save.
- Own writes (`apply_commit(upserted, deleted_ids)`, the ingest pipeline's on_commit hook): update the
  index in memory, append to the journal (fsync), and add a change-log entry for the other processes.
- Others' writes (`catch_up`, called before a query at most every `rag.lexical.refresh_seconds`): one
  small query of the change log for entries stamped since the watermark (minus `GRACE_NS`, because stamps
  come from each writer's clock and an entry can land after a later-stamped one); for the entries not yet
  applied, fetch their chunk ids' current state from the store and upsert what is there, delete what is not.
  The store is the truth, so applying entries out of order or twice gives the same index. The same ids
  leave the store's chunk cache (app/store/chunk_cache.py), which is thereby as current as this index.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app.retrieval.lexical import ANALYZER_VERSION, Analyzer, Bm25Index
from app.retrieval.lexical_files import (
    Journal,
    LexicalFilesError,
    load_snapshot,
    lock,
    read_manifest,
    save_snapshot,
    unlock,
)
from app.retrieval.types import knowledge_tag_of
from app.store import ChromaStore, StoredChunk

log = logging.getLogger(__name__)

GRACE_NS = 120 * 10**9  # change-log entries re-read this far behind the watermark (clock skew, slow writes)
SNAPSHOT_MIN_JOURNAL_BYTES = 8 * 2**20  # a journal past this (and 10% of the snapshot) becomes a snapshot
CLOSE_SNAPSHOT_JOURNAL_BYTES = 2**20
EPSILON = 0.25

TextOf = Callable[[StoredChunk], str]


def build_from_store(
    store: ChromaStore, analyzer: Analyzer, k1: float, b: float, text_of: TextOf
) -> Bm25Index:
    """A fresh in-memory index over every chunk of the store (the slow path: reads and tokenises all)."""
    ids, texts, tags = [], [], []
    for stored in store.iter_all(include_text=True):
        ids.append(stored.chunk_id)
        texts.append(text_of(stored))
        tags.append(knowledge_tag_of(stored.metadata))
    return Bm25Index.build(ids, texts, analyzer, k1=k1, b=b, epsilon=EPSILON, knowledge_tags=tags)


class LexicalSync:
    def __init__(
        self,
        store: ChromaStore,
        directory: Path | None,
        analyzer: Analyzer,
        k1: float,
        b: float,
        refresh_seconds: float,
        text_of: TextOf,
    ):
        self.store = store
        self.directory = directory
        self.analyzer = analyzer
        self.k1, self.b = k1, b
        self.refresh_seconds = refresh_seconds
        self.text_of = text_of
        self.index: Bm25Index = Bm25Index(analyzer, k1=k1, b=b, epsilon=EPSILON)
        self._lock_fd: int | None = None
        self._journal: Journal | None = None
        self._manifest: dict[str, Any] = {}
        self._snapshot_bytes = 0
        self._watermark = 0  # newest change-log stamp applied
        self._seen: dict[str, int] = {}  # change-log entries applied (those within GRACE_NS of the watermark)
        self._last_check = float("-inf")
        self._catching_up = threading.Lock()
        self._writing = threading.Lock()
        self.how_opened = ""
        self.id_check: threading.Thread | None = None  # the background id check, when one runs
        self._stop_check = threading.Event()

    # -- start -----------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        user_dict = self.analyzer.user_dict
        stamp = None
        if user_dict and Path(user_dict).exists():
            st = Path(user_dict).stat()
            stamp = [st.st_size, st.st_mtime_ns]
        return {
            "collection_id": self.store.collection_id,
            "k1": self.k1,
            "b": self.b,
            "epsilon": EPSILON,
            "analyzer": ANALYZER_VERSION,
            "user_dict": [user_dict, stamp],
        }

    def open(self, check_ids_in_background: bool = False) -> Bm25Index:
        """Load (or build) the index and catch it up with the store. The id check against the store (it lists
        every id: seconds at a million chunks) runs before this returns, or, with
        `check_ids_in_background` and when the index and the store hold as many chunks, in a thread of
        its own after it (the index is then current unless a write went unrecorded; the check repairs
        that within seconds, and queries meanwhile use the index as loaded)."""
        t0 = time.perf_counter()
        identity = self._identity()
        loaded = False
        if self.directory is not None:
            self._lock_fd = lock(self.directory)
            manifest = read_manifest(self.directory)
            if manifest is not None and all(manifest.get(k) == v for k, v in identity.items()):
                try:
                    self._load(manifest)
                    loaded = True
                except (LexicalFilesError, ValueError, KeyError) as exc:
                    log.warning(
                        "lexical index in %s is unusable (%s); rebuilding it from the store",
                        self.directory,
                        exc,
                    )
        if not loaded:
            # A change-log entry is written after the write it records: whatever is logged now is in the
            # store the build reads, so it counts as applied; entries logged during the build are not.
            logged = self.store.changes_since(0)
            self.index = build_from_store(self.store, self.analyzer, self.k1, self.b, self.text_of)
            self._seen = dict(logged)
            self._watermark = max((stamp for _, stamp in logged), default=0)
            self._manifest = dict(identity)
            self._snapshot()
            self.how_opened = f"built from the store ({len(self.index)} chunks)"
        t1 = time.perf_counter()
        caught = self._catch_up_now()
        in_store = self.store.count()
        if check_ids_in_background and in_store == len(self.index):
            self._stop_check.clear()
            self.id_check = threading.Thread(target=self._repair_in_background, name="lexical-id-check")
            self.id_check.daemon = True
            self.id_check.start()
            checked = f"running in the background ({in_store} chunks in both)"
        else:
            added, dropped = self._repair()
            checked = f"+{added} missing, -{dropped} extra"
        log.info(
            "BM25 index %s in %.1fs; change log: %d chunk(s) caught up; id check against the store: "
            "%s (%.1fs)",
            self.how_opened,
            t1 - t0,
            caught,
            checked,
            time.perf_counter() - t1,
        )
        return self.index

    def _repair_in_background(self) -> None:
        started = time.perf_counter()
        # jieba's dictionary takes seconds to load: here, not in the first query's or write's time
        self.analyzer.tokens("预热 warm-up")
        try:
            added, dropped = self._repair(self._stop_check)
        except Exception as exc:  # the store closed under it, or unreachable: the next start checks again
            if not self._stop_check.is_set():
                log.warning("BM25 id check against the store failed: %s", exc)
            return
        if added >= 0:
            log.info(
                "BM25 id check against the store: +%d missing, -%d extra (%.1fs, in the background)",
                added,
                dropped,
                time.perf_counter() - started,
            )

    def _load(self, manifest: dict[str, Any]) -> None:
        if self.directory is None:
            raise LexicalFilesError("no lexical index directory to load from")
        state, tags = load_snapshot(self.directory, manifest)
        index = Bm25Index.from_state(state, tags, self.analyzer, k1=self.k1, b=self.b, epsilon=EPSILON)
        journal = Journal(self.directory, int(manifest["generation"]))
        watermark = int(manifest.get("watermark", 0))
        seen = {str(k): int(v) for k, v in dict(manifest.get("seen", {})).items()}
        records = journal.read()
        for record in records:
            if "analysed" in record:  # tokens already counted: no analyzer needed
                index.upsert_analysed(
                    [
                        (str(i), int(d), g, n, None if c is None else [(str(t), int(f)) for t, f in c])
                        for i, d, g, n, c in record["analysed"]
                    ]
                )
            if "put" in record:  # journals written before the analysed records: text, tokenised again
                index.upsert([(str(i), str(t), g) for i, t, g in record["put"]])
            if "del" in record:
                index.delete([str(i) for i in record["del"]])
            for entry, stamp in record.get("seen", []):
                seen[str(entry)] = int(stamp)
                watermark = max(watermark, int(stamp))
        self.index, self._journal, self._manifest = index, journal, manifest
        self._watermark, self._seen = watermark, seen
        self._snapshot_bytes = sum(
            (self.directory / f"snap-{manifest['generation']}.{ext}").stat().st_size
            for ext in ("npz", "json")
        )
        self.how_opened = (
            f"loaded from {self.directory} ({len(index)} chunks, snapshot {manifest['generation']} + "
            f"{len(records)} journal record(s))"
        )

    def _repair(self, stop: threading.Event | None = None) -> tuple[int, int]:
        """Make the index hold exactly the store's ids: fetch the missing chunks, drop the extra ones.
        Writes may land while the ids are listed: an id that differs is brought to its state in the store
        at the time it is applied, so a concurrent write is never undone. (-1, -1): stopped by `stop`."""
        in_store: set[str] = set()
        for chunk_id in self.store.iter_ids():
            in_store.add(chunk_id)
            if stop is not None and stop.is_set():
                return -1, -1
        with self._writing:
            in_index = set(self.index.ids)
            missing = [i for i in in_store if i not in in_index]
            extra = [i for i in in_index if i not in in_store]
            if missing or extra:
                self._apply_ids(missing + extra, [])
        return len(missing), len(extra)

    # -- writes ----------------------------------------------------------------------------------

    def apply_commit(self, upserted: Sequence[StoredChunk], deleted_ids: Sequence[str]) -> None:
        """The store has just committed these chunks and deletions: index them, journal them, and tell the
        other processes through the change log."""
        if not upserted and not deleted_ids:
            return
        items = [(c.chunk_id, self.text_of(c), knowledge_tag_of(c.metadata)) for c in upserted]
        with self._writing:
            analysed = self.index.upsert(items)
            self.index.delete(list(deleted_ids))
            entry, stamp = self.store.record_change([c.chunk_id for c in upserted], list(deleted_ids))
            self._seen[entry] = stamp
            self._journal_append(
                [{"analysed": analysed}, {"del": list(deleted_ids)}, {"seen": [[entry, stamp]]}]
            )

    # -- others' writes ----------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Apply other processes' writes, at most once every `refresh_seconds`; a query arriving while
        another thread catches up uses the index as it is."""
        now = time.monotonic()
        if now - self._last_check < self.refresh_seconds:
            return
        if not self._catching_up.acquire(blocking=False):
            return
        try:
            self._last_check = now
            self._catch_up_now()
        finally:
            self._catching_up.release()

    def _catch_up_now(self) -> int:
        entries = self.store.changes_since(self._watermark - GRACE_NS)
        new = [(entry, stamp) for entry, stamp in entries if entry not in self._seen]
        if not new:
            return 0
        put, deleted = self.store.change_ids([entry for entry, _ in new])
        with self._writing:
            changed = self._apply_ids(list(dict.fromkeys([*put, *deleted])), new)
        return changed

    def _apply_ids(self, ids: list[str], entries: list[tuple[str, int]]) -> int:
        """Bring `ids` to their state in the store (present: upserted; absent: deleted), and drop them from
        the store's chunk cache, so the candidates' texts, metadata and vectors follow the same feed."""
        self.store.forget(ids)
        present = self.store.get(ids, include_embeddings=False) if ids else []
        found = {c.chunk_id for c in present}
        items = [(c.chunk_id, self.text_of(c), knowledge_tag_of(c.metadata)) for c in present]
        gone = [i for i in ids if i not in found]
        analysed = self.index.upsert(items)
        self.index.delete(gone)
        for entry, stamp in entries:
            self._seen[entry] = stamp
            self._watermark = max(self._watermark, stamp)
        floor = self._watermark - 2 * GRACE_NS
        self._seen = {e: s for e, s in self._seen.items() if s >= floor}
        self._journal_append([{"analysed": analysed}, {"del": gone}, {"seen": [list(e) for e in entries]}])
        return len(ids)

    # -- files -----------------------------------------------------------------------------------

    def _journal_append(self, records: list[dict[str, Any]]) -> None:
        if self._journal is None:
            return
        self._journal.append(records)
        if self._journal.size > max(SNAPSHOT_MIN_JOURNAL_BYTES, self._snapshot_bytes // 10):
            self._snapshot()

    def _snapshot(self) -> None:
        if self.directory is None:
            return
        state, tags = self.index.export_state()
        manifest = {**self._manifest, "watermark": self._watermark, "seen": self._seen}
        self._manifest = save_snapshot(self.directory, state, tags, manifest)
        self._journal = Journal(self.directory, int(self._manifest["generation"]))
        self._snapshot_bytes = sum(
            (self.directory / f"snap-{self._manifest['generation']}.{ext}").stat().st_size
            for ext in ("npz", "json")
        )

    def close(self) -> None:
        self._stop_check.set()
        if self.id_check is not None:
            self.id_check.join(timeout=30)
        with self._writing:
            if self._journal is not None and self._journal.size > CLOSE_SNAPSHOT_JOURNAL_BYTES:
                self._snapshot()
            unlock(self._lock_fd)
            self._lock_fd = None
            self._journal = None
