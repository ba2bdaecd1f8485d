"""Reconciliation: the document record is the truth, and the index catches up with it.

At start-up (a full pass) and after the write jobs (an incremental pass) the service compares the document
record with the chunk collection as `sieve store check` does (app/ingest/check.py `compare`), then indexes
the recorded documents the collection lacks or holds in another version and removes the chunks of documents
deleted through the API. Documents the collection holds and the record lacks (*unrecorded*) and chunks
without a document id are only reported: nothing else keeps them, so deleting them is left to a person
(`sieve store rebuild --drop-unrecorded`).

What a pass costs:
* **full**: every recorded document is read and its chunk ids made (no model; chunk ids are content hashes,
  so the ids a document must have are known exactly), and the collection's chunk ids are listed, ids only.
  A document whose chunk ids are all stored is indexed as it is; only stored ids that no recorded document
  makes are looked up (their metadata) to say whose they are. Chunking is most of that cost (SciFact's
  5,183 documents: about 1.7 s of 2.8 s), so the ids each document makes are kept in a file
  (`ChunkIdCache`, beside the BM25 index) under its content hash, its origin and the chunking settings:
  the next start chunks only the documents new or changed since.
* **incremental**: the record's content hashes (`hashes()`: ids and hashes, no text) against those of the
  documents the last pass found indexed and those the service ingested whole since (`indexed`; a delete
  through the service is followed too, `forget`). Only documents new, changed or gone otherwise are chunked
  and looked up in the collection (`metadata_of`); with none (`pending()` is False), the collection is not
  read at all and the write lock is not needed. In between, only this process writes an embedded store (it
  holds the lock), so what the last pass found stays true.

Nothing that matches is embedded again: the indexing is an ingest of the documents as the record holds
them, which embeds only the chunks not stored (and deletes a document's chunks of an older version).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.ingest.check import (
    ChunkIds,
    IndexComparison,
    RecordReader,
    compare,
    comparison_problems,
    expected_chunk_ids,
    first_ids,
)
from app.ingest.chunker import CHUNK_ID_VERSION
from app.ingest.types import Document
from app.settings import IngestSettings
from app.store.chroma import PROBE_ID_PREFIX
from app.store.record import content_hash

log = logging.getLogger(__name__)


class IndexReader(Protocol):
    """What a pass reads of the chunk collection (`ChromaStore`)."""

    def iter_ids(self) -> Iterator[str]: ...

    def metadata_of(self, chunk_ids: Sequence[str], doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class ReconcilePlan:
    """What a pass found: the comparison of the documents it looked at (every recorded one in a full pass),
    the chunk ids of documents deleted through the API still in the collection (`deleted_chunks`), the
    content hash of each recorded document compared (`hashes`), every document id looked at (`looked_at`:
    those and, in an incremental pass, the ones gone from the record since) and how many documents the
    record holds."""

    full: bool
    recorded: int
    comparison: IndexComparison
    hashes: dict[str, str]
    looked_at: tuple[str, ...] = ()
    deleted_chunks: list[str] = field(default_factory=list)

    @property
    def to_index(self) -> list[str]:
        """The recorded documents to index: missing from the collection, or held there in another version."""
        return sorted({*self.comparison.missing, *self.comparison.outdated})

    @property
    def matching(self) -> list[str]:
        """The documents compared that the collection holds exactly as the record makes them."""
        off = set(self.to_index)
        return [d for d in self.hashes if d not in off]


class ChunkIdCache:
    """The chunk ids each document makes, by document id, under its content hash and origin (Markdown or
    plain text is read from the origin) and the chunking settings: a pure function's results, kept in
    `path` (JSON, written whole and atomically) between starts; a full pass reads it, uses it and writes
    it, and holds no copy after (None: none kept). A file that cannot be read, or made under other
    settings, is started over; one that cannot be written is said, and the next start chunks again."""

    def __init__(self, settings: IngestSettings, path: Path | None = None):
        self.settings = settings
        self.path = path
        self._key = [CHUNK_ID_VERSION, settings.chunk_size, settings.chunk_overlap, settings.min_chunk_chars]
        self._ids: dict[str, tuple[str, str, frozenset[str]]] = {}  # doc id -> (hash, origin, chunk ids)
        self._changed = False
        if path is not None and path.is_file():
            try:
                kept = json.loads(path.read_text(encoding="utf-8"))
                if kept.get("settings") == self._key:
                    self._ids = {d: (h, o, frozenset(ids)) for d, (h, o, ids) in kept["documents"].items()}
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                log.warning("reconcile: chunk-id cache %s unreadable (%s): starting it over", path, exc)

    def chunk_ids(self, doc: Document) -> tuple[str, frozenset[str]]:
        """(`doc`'s content hash, the chunk ids it makes), chunking it only when not known."""
        digest = content_hash(doc)
        known = self._ids.get(doc.doc_id)
        if known is not None and known[:2] == (digest, doc.origin):
            return digest, known[2]
        ids = expected_chunk_ids([doc], self.settings)[doc.doc_id]
        self._ids[doc.doc_id] = (digest, doc.origin, ids)
        self._changed = True
        return digest, ids

    def keep_only(self, doc_ids: Iterable[str]) -> None:
        """Forget every document but `doc_ids` (those the record holds)."""
        kept = set(doc_ids)
        gone = [d for d in self._ids if d not in kept]
        for doc_id in gone:
            del self._ids[doc_id]
        self._changed = self._changed or bool(gone)

    def save(self) -> None:
        """Write the cache when it changed since it was read or written."""
        if self.path is None or not self._changed:
            return
        documents = {d: [h, o, sorted(ids)] for d, (h, o, ids) in self._ids.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".chunk-ids-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"settings": self._key, "documents": documents}, fh)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:  # a cache: the next start chunks again
            log.warning("reconcile: chunk-id cache %s not written (%s)", self.path, exc)
            self.path = None
            return
        self._changed = False


class Reconciler:
    """Plans the passes and remembers, between them, which recorded documents (by content hash) the last
    pass found indexed, so an incremental pass looks only at what changed since. `cache`: where the chunk
    ids of each document are kept between starts (`ChunkIdCache`; None: in memory)."""

    def __init__(self, settings: IngestSettings, cache: Path | None = None):
        self.settings = settings
        self.cache = cache
        # doc id -> the content hash found indexed (its first 64 bits: a million documents in ~100 MB)
        self._indexed: dict[str, int] = {}
        self._compared = False  # a full pass was made (an incremental one needs its findings)

    def plan(self, record: RecordReader, index: IndexReader, full: bool = False) -> ReconcilePlan:
        """Compare `record` with `index`: every document when `full` or before the first full pass, else
        only the documents whose content hash differs from what the last pass found indexed."""
        if full or not self._compared:
            return self._full(record, index)
        return self._incremental(record, index)

    def pending(self, record: RecordReader) -> bool:
        """Whether an incremental pass would look at anything: no full pass made yet, or documents new,
        changed or gone in the record since the last pass (or the last ingest, `indexed`). Reads only the
        record's hashes, so the caller need not hold the write lock to ask."""
        if not self._compared:
            return True
        now = record.hashes()
        known = self._indexed
        return len(now) != len(known) or any(known.get(d) != _short(h) for d, h in now.items())

    def indexed(self, documents: Iterable[Document]) -> None:
        """`documents` were just ingested whole (each of their chunks stored, none other): as the record
        holds them, they are indexed, and a pass need not look at them."""
        self._indexed.update((doc.doc_id, _short(content_hash(doc))) for doc in documents)

    def forget(self, doc_ids: Iterable[str]) -> None:
        """`doc_ids` left the record and the index (a delete through the API)."""
        for doc_id in doc_ids:
            self._indexed.pop(doc_id, None)

    def settle(self, plan: ReconcilePlan, indexed: dict[str, str]) -> None:
        """Remember what `plan` found indexed, and `indexed` (doc id -> content hash): the documents the
        caller indexed after it. A document left unindexed is looked at again by the next pass."""
        if plan.full:
            self._indexed = {}
            self._compared = True
        for doc_id in plan.looked_at:
            self._indexed.pop(doc_id, None)
        self._indexed.update((d, _short(plan.hashes[d])) for d in plan.matching)
        self._indexed.update((d, _short(h)) for d, h in indexed.items())

    def _full(self, record: RecordReader, index: IndexReader) -> ReconcilePlan:
        hashes: dict[str, str] = {}
        expected: dict[str, frozenset[str]] = {}
        chunked = ChunkIdCache(self.settings, self.cache)  # read, used and written by this pass only
        for doc in record.iter_documents():
            hashes[doc.doc_id], expected[doc.doc_id] = chunked.chunk_ids(doc)
        chunked.keep_only(hashes)
        chunked.save()
        stored_ids = {i for i in index.iter_ids() if not i.startswith(PROBE_ID_PREFIX)}
        stored: dict[str, frozenset[str]] = {}
        for doc_id, ids in expected.items():
            if found := ids & stored_ids:
                stored[doc_id] = found
        made = set().union(*expected.values()) if expected else set()
        others, orphans = _by_document(index.metadata_of(sorted(stored_ids - made), []))
        for doc_id, ids in others.items():
            stored[doc_id] = stored.get(doc_id, frozenset()) | ids
        tombstoned = frozenset(record.tombstones())
        comparison = compare(expected, stored, orphans, tombstoned)
        deleted = _chunks_of(stored, comparison.deleted)
        return ReconcilePlan(True, len(hashes), comparison, hashes, tuple(hashes), deleted)

    def _incremental(self, record: RecordReader, index: IndexReader) -> ReconcilePlan:
        now = record.hashes()
        changed = sorted(d for d, h in now.items() if self._indexed.get(d) != _short(h))
        gone = sorted(set(self._indexed) - set(now))
        if not changed and not gone:
            return ReconcilePlan(False, len(now), compare({}, {}), {})
        documents = record.get(changed)
        hashes = {doc.doc_id: content_hash(doc) for doc in documents}
        expected = expected_chunk_ids(documents, self.settings)
        looked_up = [*hashes, *gone]
        stored, orphans = _by_document(index.metadata_of([], looked_up))
        tombstoned = frozenset(record.tombstones(looked_up))
        comparison = compare(expected, stored, orphans, tombstoned)
        deleted = _chunks_of(stored, comparison.deleted)
        return ReconcilePlan(False, len(now), comparison, hashes, (*hashes, *gone), deleted)


def _short(content_hash: str) -> int:
    """The first 64 bits of a content hash (hex): what the reconciler keeps of each indexed document."""
    return int(content_hash[:16], 16)


def _by_document(metadata: dict[str, dict[str, Any]]) -> tuple[dict[str, frozenset[str]], int]:
    """(document id -> its chunk ids, how many chunks carry no document id) of `metadata` (chunk id ->
    metadata)."""
    by_doc: dict[str, set[str]] = {}
    orphans = 0
    for chunk_id, meta in metadata.items():
        if chunk_id.startswith(PROBE_ID_PREFIX):
            continue
        doc_id = meta.get("doc_id")
        if doc_id is None:
            orphans += 1
        else:
            by_doc.setdefault(str(doc_id), set()).add(chunk_id)
    return {d: frozenset(ids) for d, ids in by_doc.items()}, orphans


def _chunks_of(stored: ChunkIds, doc_ids: Iterable[str]) -> list[str]:
    return sorted(chunk for d in doc_ids for chunk in stored.get(d, frozenset()))


@dataclass
class ReconcileReport:
    """What a pass did: its plan, the documents it indexed (`indexed`), the new chunks that took
    (`embedded`), the chunks of deleted documents it removed, why it stopped short (`error`), and how long
    the comparison and the whole pass took."""

    plan: ReconcilePlan
    indexed: list[str] = field(default_factory=list)
    embedded: int = 0
    removed_chunks: int = 0
    error: str | None = None
    compared_in: float = 0.0
    seconds: float = 0.0

    @property
    def unindexed(self) -> list[str]:
        """The recorded documents the pass found unindexed and could not index."""
        done = set(self.indexed)
        return [d for d in self.plan.to_index if d not in done]

    @property
    def note(self) -> str | None:
        """What `/ready` says while recorded documents are not served; None when every one is."""
        left = self.unindexed
        return unindexed_note(len(left), self.error or "not indexed yet", left) if left else None


def log_plan(plan: ReconcilePlan, seconds: float) -> None:
    """Say what a pass found, a line for each kind of difference, each naming the first few documents."""
    c = plan.comparison
    if plan.full and c.matches:
        log.info(
            "reconcile: the index matches the document record (%d documents, %d chunks; %d deleted "
            "through the API), compared in %.2fs",
            plan.recorded,
            c.expected_chunks,
            c.tombstones,
            seconds,
        )
    if c.missing:
        log.warning(
            "reconcile: %s of the document record not in the index, indexing them now: %s",
            _docs(len(c.missing)),
            first_ids(c.missing),
        )
    if c.outdated:
        log.warning(
            "reconcile: %s whose chunks in the index differ from what the record makes (partly indexed, "
            "an older version or another chunking), indexing them again: %s",
            _docs(len(c.outdated)),
            first_ids(c.outdated),
        )
    if c.deleted:
        log.info(
            "reconcile: %s deleted through the API still in the index, removing their %d chunks: %s",
            _docs(len(c.deleted)),
            len(plan.deleted_chunks),
            first_ids(c.deleted),
        )
    left = IndexComparison(0, 0, 0, 0, unrecorded=c.unrecorded, orphans=c.orphans)
    for problem in comparison_problems(left):
        log.warning("reconcile: %s; left as they are (fix: %s)", problem.what, problem.fix)


def log_outcome(report: ReconcileReport) -> None:
    """Say what a pass did, or which documents it left unindexed and why."""
    if report.note is not None:
        log.error("reconcile: %s", report.note)
    elif report.indexed or report.removed_chunks:
        log.info(
            "reconcile: indexed %s (%d new chunks embedded) and removed %d chunks of deleted documents in "
            "%.1fs; every recorded document is indexed",
            _docs(len(report.indexed)),
            report.embedded,
            report.removed_chunks,
            report.seconds,
        )


def unindexed_note(count: int, why: str, ids: Sequence[str] = ()) -> str:
    """What the log and `/ready` say of recorded documents a pass could not index."""
    named = f" ({first_ids(sorted(ids))})" if ids else ""
    return (
        f"{_docs(count)} of the document record not indexed, so not served{named}: {why}; the service "
        "tries again after write jobs, at each start and every few minutes (`sieve store check` lists them)"
    )


def _docs(count: int) -> str:
    return f"{count} document{'s' if count != 1 else ''}"
