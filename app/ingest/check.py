"""`sieve store check`: the chunk collection compared with the document record, and what fixes each
difference.

The record is the truth (every accepted document); the collection is derived from it. Chunk ids are content
hashes of (document id, chunker version, position, title, headings, text): re-chunking a recorded document
with the current settings gives exactly the ids its chunks must have in the collection, so comparing ids
document by document compares content too (a changed text, title or chunking changes them). The comparison
is a pure function of two maps (document id -> chunk ids), tested with fakes; `expected_chunk_ids` and
`stored_chunk_ids` build them from the record's documents and the store's chunks. A document deleted through
the API is in neither: the record keeps only its tombstone, and its chunks left the collection (any left
there are named, and a rebuild drops them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.ingest.chunker import CHAR_END, CHAR_START, CHUNKER_VERSION, chunk_document
from app.ingest.types import Document
from app.settings import IngestSettings
from app.store import ChromaStore, StoredChunk, StoreError
from app.store.chroma import PROBE_ID_PREFIX
from app.store.owned import COLLECTION, REBUILD, RECORD_FROM_INDEX
from app.store.record import Tombstone

SHOWN_IDS = 5  # document ids named in a problem's line (the JSON output lists them all)

ChunkIds = Mapping[str, frozenset[str]]


class RecordReader(Protocol):
    """What the check and the rebuild read of the document record (app/store/record.py)."""

    def iter_documents(self) -> Iterator[Document]: ...

    def get(self, doc_ids: Sequence[str]) -> list[Document]: ...

    def hashes(self) -> dict[str, str]: ...

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]: ...


@dataclass(frozen=True)
class IndexComparison:
    """The collection against the record, per document: `missing` recorded documents with no chunk in the
    collection, `outdated` recorded documents whose stored chunk ids differ from the ids the current
    settings make (partly indexed, an older version, another chunking), `unrecorded` documents the
    collection holds and the record lacks, `deleted` documents the collection holds that were deleted through
    the API (the record keeps their tombstones), `orphans` chunks without a document id. Ids sorted.
    `tombstones`: how many documents deleted through the API the record remembers."""

    recorded: int
    indexed: int
    expected_chunks: int
    stored_chunks: int
    missing: list[str] = field(default_factory=list)
    outdated: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)
    orphans: int = 0
    deleted: list[str] = field(default_factory=list)
    tombstones: int = 0

    @property
    def matches(self) -> bool:
        return not (self.missing or self.outdated or self.unrecorded or self.orphans or self.deleted)


def compare(
    expected: ChunkIds, stored: ChunkIds, orphans: int = 0, tombstoned: Collection[str] = frozenset()
) -> IndexComparison:
    """Compare `expected` (recorded document id -> the chunk ids the current settings make) with `stored`
    (document id -> the chunk ids the collection holds for it). A recorded document that makes no chunk
    (an empty text) is expected to have none. `tombstoned`: the ids of documents deleted through the API;
    one of them is never missing (the record does not hold it), and one still in the collection is
    `deleted`, not unrecorded."""
    return IndexComparison(
        recorded=len(expected),
        indexed=len(stored),
        expected_chunks=sum(len(ids) for ids in expected.values()),
        stored_chunks=sum(len(ids) for ids in stored.values()) + orphans,
        missing=sorted(d for d, ids in expected.items() if ids and d not in stored),
        outdated=sorted(d for d, ids in expected.items() if d in stored and stored[d] != ids),
        unrecorded=sorted(d for d in stored if d not in expected and d not in tombstoned),
        orphans=orphans,
        deleted=sorted(d for d in stored if d not in expected and d in tombstoned),
        tombstones=len(tombstoned),
    )


def expected_chunk_ids(documents: Iterable[Document], settings: IngestSettings) -> dict[str, frozenset[str]]:
    """Document id -> the ids of the chunks `settings`' chunking makes of it (no model, no store)."""
    s = settings
    return {
        doc.doc_id: frozenset(
            c.chunk_id for c in chunk_document(doc, s.chunk_size, s.chunk_overlap, s.min_chunk_chars)
        )
        for doc in documents
    }


def stored_chunk_ids(chunks: Iterable[StoredChunk]) -> tuple[dict[str, frozenset[str]], int]:
    """(document id -> the ids of its stored chunks, how many chunks carry no `doc_id`). A write probe's
    scratch record (another process's, there for milliseconds) is no chunk."""
    by_doc: dict[str, set[str]] = {}
    orphans = 0
    for chunk in chunks:
        if chunk.chunk_id.startswith(PROBE_ID_PREFIX):
            continue
        doc_id = chunk.metadata.get("doc_id")
        if doc_id is None:
            orphans += 1
        else:
            by_doc.setdefault(str(doc_id), set()).add(chunk.chunk_id)
    return {d: frozenset(ids) for d, ids in by_doc.items()}, orphans


@dataclass(frozen=True)
class Problem:
    """One thing `sieve store check` found wrong: what, the command (or action) that fixes it, and which
    collection or file Sieve owns it is about (`part`, a key of app/store/owned.py's OWNED)."""

    what: str
    fix: str
    part: str = COLLECTION


@dataclass
class CheckReport:
    """Everything `sieve store check` found: the comparison (None when the collection could not be read),
    why the collection could not be read, an embedder mismatch, the probes' failures, and the problems of
    the other collections and files Sieve owns (`others`, app/ingest/owned_checks.py: the record's first)."""

    store: str
    comparison: IndexComparison | None = None
    read_error: str | None = None
    embedder_mismatch: str | None = None
    probe_failures: list[str] = field(default_factory=list)
    others: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what else the store holds, known and not a problem

    @property
    def healthy(self) -> bool:
        return not self.problems()

    def problems(self) -> list[Problem]:
        """What is wrong, each with its fix, most serious first."""
        out = list(self.others)
        if self.read_error:
            out.append(Problem(f"the collection cannot be read: {self.read_error}", REBUILD))
        out += [Problem(failure, REBUILD) for failure in self.probe_failures]
        if self.embedder_mismatch:
            out.append(Problem(self.embedder_mismatch, REBUILD))
        if self.comparison is not None:
            out += comparison_problems(self.comparison)
        return out

    def as_json(self) -> dict[str, object]:
        """The report for `sieve store check --json`."""
        c = self.comparison
        return {
            "healthy": self.healthy,
            "store": self.store,
            "problems": [{"what": p.what, "fix": p.fix, "part": p.part} for p in self.problems()],
            "counts": None
            if c is None
            else {
                "recordedDocuments": c.recorded,
                "indexedDocuments": c.indexed,
                "expectedChunks": c.expected_chunks,
                "storedChunks": c.stored_chunks,
                "tombstones": c.tombstones,
            },
            "missing": [] if c is None else c.missing,
            "outdated": [] if c is None else c.outdated,
            "unrecorded": [] if c is None else c.unrecorded,
            "deleted": [] if c is None else c.deleted,
            "orphanChunks": 0 if c is None else c.orphans,
            "notes": list(self.notes),
        }


def comparison_problems(c: IndexComparison) -> list[Problem]:
    """The comparison's differences as problems, each naming the first few document ids and its fix."""
    out = []
    if c.missing:
        out.append(
            Problem(
                f"{_docs(c.missing)} of the record not in the collection: {first_ids(c.missing)}", REBUILD
            )
        )
    if c.outdated:
        out.append(
            Problem(
                f"{_docs(c.outdated)} whose chunks differ from what the record and the current chunking make "
                f"(partly indexed, an older version or another chunking): {first_ids(c.outdated)}",
                REBUILD,
            )
        )
    if c.unrecorded:
        out.append(
            Problem(
                f"{_docs(c.unrecorded)} in the collection but not in the record (written before the record "
                f"existed, or after the backup it was restored from): {first_ids(c.unrecorded)}",
                "send them again (POST /api/documents or `sieve ingest PATH`) so the record keeps them; "
                f"`{RECORD_FROM_INDEX}` takes them into the record from their chunks; "
                f"`{REBUILD} --drop-unrecorded` drops them",
            )
        )
    if c.deleted:
        out.append(
            Problem(
                f"{_docs(c.deleted)} deleted through the API still in the collection (the record keeps "
                f"their tombstones): {first_ids(c.deleted)}",
                REBUILD,
            )
        )
    if c.orphans:
        out.append(Problem(f"{c.orphans} chunk(s) in the collection carry no document id", REBUILD))
    return out


def _docs(ids: list[str]) -> str:
    return f"{len(ids)} document{'s' if len(ids) != 1 else ''}"


def first_ids(ids: list[str]) -> str:
    """The first `SHOWN_IDS` ids, and how many more."""
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f" (and {len(ids) - SHOWN_IDS} more)" if len(ids) > SHOWN_IDS else "")


def check_store(
    live: ChromaStore,
    record: RecordReader | None,
    settings: IngestSettings,
    identity: dict[str, Any],
) -> CheckReport:
    """What `sieve store check` looks at in the chunk collection: the embedder it was built with, every
    chunk's document id against what the record's documents make with `settings` (a document deleted through
    the API is expected nowhere), and a read and a write probe. Without a readable record (None, or one that
    fails while read: its own probe names it) there is no comparison."""
    report = CheckReport(store=f"{live.description}, collection '{live.name}'")
    report.embedder_mismatch = live.embedder_mismatch(identity)
    try:
        stored, orphans = stored_chunk_ids(live.iter_all(include_text=False))
    except Exception as exc:  # a broken collection: said, with the fix, instead of a traceback
        report.read_error = f"{type(exc).__name__}: {exc}"
    else:
        if record is not None:
            try:
                expected = expected_chunk_ids(record.iter_documents(), settings)
                tombstoned = frozenset(record.tombstones())
            except StoreError:
                pass  # a damaged record: `record_problems` says it, with its way back
            else:
                report.comparison = compare(expected, stored, orphans, tombstoned)
    report.probe_failures = live.probe()
    return report


def spanless_chunks(chunks: Iterable[StoredChunk]) -> int:
    """How many of `chunks` carry no character span (`char_start`/`char_end`: written by chunker md-v2 on;
    a store indexed before holds none until `sieve store rebuild` or a re-ingest of its files)."""
    return sum(1 for c in chunks if CHAR_START not in c.metadata or CHAR_END not in c.metadata)


def spans_missing_line(count: int, total: int) -> str:
    """The one start-up line for a store whose chunks lack spans, with the command that gives them."""
    return (
        f"{count} of {total} chunks looked at carry no character span (indexed before chunker "
        f"{CHUNKER_VERSION}): "
        "golden evidence written as quotes cannot be placed on them; run `sieve store rebuild` to give "
        "them spans from the document record"
    )
