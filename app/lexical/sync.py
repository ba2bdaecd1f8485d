"""Keeps a process's BM25 index equal to the store: loaded from disk at start, updated on every write, and
caught up with other processes' writes through the store's change log.

- Start (`open`): load the snapshot and replay the journal (app/lexical/files.py), nothing read
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
- Others' writes (`catch_up`, called before a query at most every `rag.lexical.refresh_seconds`, and by a
  server on a Chroma server in a thread of its own, `follow`): one small query of the change log for
  entries stamped since the watermark minus `GRACE_NS` (stamps come from each writer's clock, and an entry
  can land after a later-stamped one: clock skew plus write delay are assumed under `GRACE_NS`); for the
  entries not yet applied, fetch their chunk ids' current state from the store and upsert what is there,
  delete what is not. The store is the truth, so applying entries out of order or twice gives the same
  index. The same ids leave the store's chunk cache (app/store/chunk_cache.py), which is thereby as current
  as this index. The watermark then moves to the clock time the read began (every entry stamped more than
  `GRACE_NS` before it had landed and was read), so a read covers the last minutes, not every entry since
  the last one another process wrote.
- Pruning (`rag.lexical.change_log_retention_seconds`): a writer, at most once per retention / 24, catches
  up, then deletes the entries older than the retention after adding a marker entry that says so
  (`ChromaStore.prune_changes`). A process that finds a new marker whose `pruned_before` lies past its own
  read floor may have lost entries it never applied: it re-reads every chunk's metadata (no text) and brings
  each chunk whose id or tag differs to its state in the store, and empties its chunk cache (`_resync`).
  A live server never gets there (its follower reads the log every few seconds); a process stopped for
  longer than the retention does, once, at start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app import pidlock
from app.lexical.files import (
    Journal,
    LexicalFilesError,
    load_snapshot,
    lock,
    read_manifest,
    save_snapshot,
)
from app.lexical.index import ANALYZER_VERSION, Analyzer, Bm25Index
from app.store import ChangeEntry, ChromaStore, StoredChunk
from app.store.chroma import ChangeLogError
from app.store.types import index_label_of

log = logging.getLogger(__name__)

GRACE_NS = 120 * 10**9  # change-log entries re-read this far behind the watermark (clock skew, slow writes)
SNAPSHOT_MIN_JOURNAL_BYTES = 8 * 2**20  # a journal past this (and 10% of the snapshot) becomes a snapshot
CLOSE_SNAPSHOT_JOURNAL_BYTES = 2**20
EPSILON = 0.25
PRUNES_PER_RETENTION = 24  # a writer prunes the change log at most once per retention / this
MIN_PRUNE_INTERVAL_S = 60.0

TextOf = Callable[[StoredChunk], str]


def build_from_store(
    store: ChromaStore, analyzer: Analyzer, k1: float, b: float, text_of: TextOf
) -> Bm25Index:
    """A fresh in-memory index over every chunk of the store (the slow path: reads and tokenises all)."""
    ids, texts, tags = [], [], []
    for stored in store.iter_all(include_text=True):
        ids.append(stored.chunk_id)
        texts.append(text_of(stored))
        tags.append(index_label_of(stored.metadata))
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
        retention_seconds: float = 0.0,
    ):
        """`retention_seconds`: this process, when it writes, deletes change-log entries older than that
        (0: never)."""
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
        self._snapshot_put_off = False  # a snapshot waits for disk space (`_room_for_snapshot`)
        self._watermark = 0  # newest change-log stamp applied
        self._seen: dict[str, int] = {}  # change-log entries applied (those within GRACE_NS of the watermark)
        # guards _seen and _watermark only, so that a catch-up with nothing new never waits for `_writing`
        # (held for seconds by the id check's set difference at a million chunks); taken after `_writing`
        self._log_lock = threading.Lock()
        self._last_check = float("-inf")
        self._catching_up = threading.Lock()
        self._writing = threading.Lock()
        self.how_opened = ""
        self.id_check: threading.Thread | None = None  # the background id check, when one runs
        self._stop_check = threading.Event()
        self.retention_ns = int(retention_seconds * 1e9)
        self._last_prune = -(2**62)  # time.time_ns() of this process's last prune (the log's clock)
        self._pruner: threading.Thread | None = None
        self.resyncs = 0  # full metadata re-reads after a prune past this index's watermark
        self._follower: threading.Thread | None = None
        self._stop_follow = threading.Event()

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
        """`_open`; on a failure the index directory's lock is let go (the process may go on: a CLI test,
        or a command that says what failed and runs the way back)."""
        try:
            return self._open(check_ids_in_background)
        except BaseException:
            pidlock.release(self._lock_fd)
            self._lock_fd = None
            raise

    def _open(self, check_ids_in_background: bool = False) -> Bm25Index:
        """Load (or build) the index and catch it up with the store. The id check against the store (it lists
        every id: seconds at a million chunks) runs before this returns, or, with
        `check_ids_in_background` and when the index and the store hold as many chunks, in a thread of
        its own after it (the index is then current unless a write went unrecorded; the check repairs
        that within seconds, and queries meanwhile use the index as loaded)."""
        t0 = time.perf_counter()
        identity = self._identity()
        if not self._load_files(identity):
            self._build(identity)
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

    def _load_files(self, identity: dict[str, Any]) -> bool:
        """Load the index from its files when they hold this identity (locking the folder); False when there
        are none, they hold another, or they are damaged (then logged)."""
        if self.directory is None:
            return False
        self._lock_fd = lock(self.directory)
        manifest = read_manifest(self.directory)
        if manifest is None or any(manifest.get(k) != v for k, v in identity.items()):
            return False
        try:
            self._load(manifest)
        except Exception as exc:  # damaged files raise many kinds: the store has the truth
            log.warning(
                "lexical index in %s is unusable (%s); rebuilding it from the store", self.directory, exc
            )
            return False
        return True

    def _build(self, identity: dict[str, Any]) -> None:
        """Build the index from the store and write its files."""
        # A change-log entry is written after the write it records: whatever is logged now is in the
        # store the build reads, so it counts as applied; entries logged during the build are not.
        logged = self.store.changes_since(0)
        self.index = build_from_store(self.store, self.analyzer, self.k1, self.b, self.text_of)
        self._seen = {e.entry: e.stamp for e in logged}
        self._watermark = max((e.stamp for e in logged), default=0)
        self._manifest = dict(identity)
        self._snapshot()
        self.how_opened = f"built from the store ({len(self.index)} chunks)"

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
        items = [(c.chunk_id, self.text_of(c), index_label_of(c.metadata)) for c in upserted]
        with self._writing:
            analysed = self.index.upsert(items)
            self.index.delete(list(deleted_ids))
            entry, stamp = self.store.record_change([c.chunk_id for c in upserted], list(deleted_ids))
            with self._log_lock:
                self._seen[entry] = stamp
            self._journal_append(
                [{"analysed": analysed}, {"del": list(deleted_ids)}, {"seen": [[entry, stamp]]}]
            )
        self._maybe_prune()

    def _maybe_prune(self) -> None:
        """Delete change-log entries older than the retention, at most once per retention / 24 (and per
        minute), in a thread of its own: the write that triggers it does not wait (the first prune of a
        log never pruned can take seconds: docs/benchmarks.md#change-log)."""
        if self.retention_ns <= 0:
            return
        now = time.time_ns()
        interval = max(MIN_PRUNE_INTERVAL_S, self.retention_ns / 1e9 / PRUNES_PER_RETENTION)
        if now - self._last_prune < interval * 1e9:
            return
        if self._pruner is not None and self._pruner.is_alive():
            return
        self._last_prune = now
        self._pruner = threading.Thread(target=self._prune, name="change-log-pruner", daemon=True)
        self._pruner.start()

    def _prune(self) -> None:
        """Catch up first, so that nothing this process has not applied is deleted; then prune, without
        holding the catch-up lock (queries and the follower go on catching up during a long first prune).
        A failure is logged, not raised: the write that triggered it is committed, and the next write
        tries again."""
        t0 = time.perf_counter()
        try:
            with self._catching_up:
                self._catch_up_now()
            deleted = self.store.prune_changes(time.time_ns() - self.retention_ns)
        except Exception as exc:  # the store closed or unreachable
            log.warning("pruning the change log failed (a later write tries again): %s", exc)
            self._last_prune = -(2**62)
            return
        log.log(
            logging.INFO if deleted else logging.DEBUG,  # every process's first write prunes: quiet if idle
            "change log pruned: %d entries older than %.0f s deleted (%.2fs)",
            deleted,
            self.retention_ns / 1e9,
            time.perf_counter() - t0,
        )

    def wait_pruned(self, timeout: float = 60.0) -> None:
        """Wait for a prune in progress (tests, and `close`)."""
        if self._pruner is not None:
            self._pruner.join(timeout)

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
        """Apply the change-log entries not applied yet; returns how many chunk ids that touched."""
        began = time.time_ns()
        floor = self._watermark - GRACE_NS
        entries = self.store.changes_since(floor)
        new = [e for e in entries if e.entry not in self._seen]
        lost = [e.pruned_before for e in new if e.pruned_before is not None and e.pruned_before > floor]
        if lost:
            why = (
                f"the change log was pruned up to {_utc(max(lost))}, past this index's watermark (read "
                f"from {_utc(floor)})"
            )
            changed = self._resync(why, new)
        elif new:
            try:
                put, deleted = self.store.change_ids([e.entry for e in new if e.pruned_before is None])
            except ChangeLogError as exc:  # a damaged entry: the store itself says what changed
                changed = self._resync(f"{exc}; `sieve store rebuild` makes the change log anew", new)
            else:
                with self._writing:
                    changed = self._apply_ids(list(dict.fromkeys([*put, *deleted])), new)
        else:
            changed = 0
        with self._log_lock:
            seen = dict(self._seen)
            for e in entries:  # all applied now, by this process or earlier
                seen.setdefault(e.entry, e.stamp)
            self._watermark = max(self._watermark, began)
            keep = self._watermark - 2 * GRACE_NS
            self._seen = {e: s for e, s in seen.items() if s >= keep}  # replaced, never changed in place
        return changed

    def _resync(self, why: str, entries: list[ChangeEntry]) -> int:
        """The change log cannot say what changed (`why`: pruned past this index's read floor, so entries
        it never applied may be gone, and a retag leaves no other trace; or an entry is unreadable).
        Re-read every chunk's metadata (no text, no vectors), bring each chunk whose id or knowledge tag
        differs from the index's to its state in the store, and empty the chunk cache, whose metadata may
        be stale too. Texts cannot differ: chunk ids are content hashes."""
        t0 = time.perf_counter()
        stored = {c.chunk_id: index_label_of(c.metadata) for c in self.store.iter_all(include_text=False)}
        with self._writing:
            self.store.forget_all()
            in_index = set(self.index.ids)
            tags = self.index.tags_of(list(stored))  # None also for an id the index lacks
            pairs = zip(stored.items(), tags, strict=True)
            differ = [i for (i, tag), had in pairs if had != tag or i not in in_index]
            extra = [i for i in in_index if i not in stored]
            self._apply_ids(differ + extra, entries)
            self.resyncs += 1
        log.warning(
            "%s: every chunk's metadata re-read, %d chunk(s) brought to the store's state (%.1fs)",
            why,
            len(differ) + len(extra),
            time.perf_counter() - t0,
        )
        return len(differ) + len(extra)

    def follow(self) -> None:
        """Catch up every `refresh_seconds` (at least every second) in a thread of its own, until `close`:
        for a server sharing a Chroma server with other writers, so that an idle replica stays current
        (and never falls behind a prune) and queries rarely wait for the check."""
        if self._follower is not None:
            return
        interval = max(self.refresh_seconds, 1.0)

        def run() -> None:
            failing = False
            while not self._stop_follow.wait(interval):
                try:
                    self.catch_up()
                    failing = False
                except Exception as exc:  # the store unreachable: said once, tried again
                    if not failing:
                        log.warning("catching up with the change log failed (retrying): %s", exc)
                    failing = True

        self._stop_follow.clear()
        self._follower = threading.Thread(target=run, name="lexical-follower", daemon=True)
        self._follower.start()

    def _apply_ids(self, ids: list[str], entries: list[ChangeEntry]) -> int:
        """Bring `ids` to their state in the store (present: upserted; absent: deleted), and drop them from
        the store's chunk cache, so the candidates' texts, metadata and vectors follow the same feed."""
        self.store.forget(ids)
        present = self.store.get(ids, include_embeddings=False) if ids else []
        found = {c.chunk_id for c in present}
        items = [(c.chunk_id, self.text_of(c), index_label_of(c.metadata)) for c in present]
        gone = [i for i in ids if i not in found]
        analysed = self.index.upsert(items)
        self.index.delete(gone)
        with self._log_lock:
            seen = {**self._seen, **{e.entry: e.stamp for e in entries}}
            self._watermark = max([self._watermark, *(e.stamp for e in entries)])
            floor = self._watermark - 2 * GRACE_NS
            self._seen = {e: s for e, s in seen.items() if s >= floor}
        self._journal_append(
            [{"analysed": analysed}, {"del": gone}, {"seen": [[e.entry, e.stamp] for e in entries]}]
        )
        return len(ids)

    # -- files -----------------------------------------------------------------------------------

    def _journal_append(self, records: list[dict[str, Any]]) -> None:
        if self._journal is None:
            return
        self._journal.append(records)
        if self._journal.size > max(SNAPSHOT_MIN_JOURNAL_BYTES, self._snapshot_bytes // 10):
            if self._room_for_snapshot():
                self._snapshot()

    def _room_for_snapshot(self) -> bool:
        """Whether a new snapshot (about the size of the last, twice over while both exist) leaves the store's
        reserve free (`ChromaStore.space`); when not, the journal goes on and the snapshot waits for room."""
        space = getattr(self.store, "space", None)
        if space is None or self.directory is None:
            return True
        problem = space.problem(need=2 * self._snapshot_bytes)
        if problem is not None and not self._snapshot_put_off:
            log.warning("BM25 snapshot put off until there is room, the journal goes on: %s", problem)
        self._snapshot_put_off = problem is not None
        return problem is None

    def _snapshot(self) -> None:
        if self.directory is None:
            return
        state, tags = self.index.export_state()
        with self._log_lock:
            manifest = {**self._manifest, "watermark": self._watermark, "seen": dict(self._seen)}
        self._manifest = save_snapshot(self.directory, state, tags, manifest)
        self._journal = Journal(self.directory, int(self._manifest["generation"]))
        self._snapshot_bytes = sum(
            (self.directory / f"snap-{self._manifest['generation']}.{ext}").stat().st_size
            for ext in ("npz", "json")
        )

    def close(self) -> None:
        self._stop_check.set()
        self._stop_follow.set()
        if self.id_check is not None:
            self.id_check.join(timeout=30)
        if self._follower is not None:
            self._follower.join(timeout=30)
            self._follower = None
        self.wait_pruned(timeout=60)
        with self._writing:
            if (
                self._journal is not None
                and self._journal.size > CLOSE_SNAPSHOT_JOURNAL_BYTES
                and self._room_for_snapshot()
            ):
                self._snapshot()
            pidlock.release(self._lock_fd)
            self._lock_fd = None
            self._journal = None


def _utc(stamp_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp_ns / 1e9))
