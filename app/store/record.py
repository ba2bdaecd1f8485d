"""The document record: every document Sieve accepted, kept whole, so the index can always be made again.

The chunk collection and the BM25 index are derived from the record: `sieve store rebuild` re-chunks and
re-embeds what it holds. A write puts its documents here before anything is indexed and before it is
acknowledged (200 or 202), and a document deleted through Sieve leaves it too.

Two kinds, chosen by `rag.store.mode` (docs/design.md, "The document record"):
- embedded: `SqliteRecord`, a SQLite database in the store folder (`documents.sqlite3`, WAL journal, a full
  fsync at every commit), apart from Chroma's own files, so a collection Chroma can no longer read leaves the
  record readable;
- a Chroma server: `ChromaRecord`, a collection of its own on that server (`<collection>-documents`), which
  every replica shares and a broken chunk collection does not affect.

A record that cannot be read or written raises `RecordError` (a `StoreError`: the API answers 503 naming it).
The SQLite record is checked when it opens (`PRAGMA quick_check`): a damaged one opens with `damage` set,
serves its reads as far as they go and refuses every write (`RecordDamagedError`, naming the way back: a
backup, `restore_from`, or `sieve store rebuild --record-from-index`); one SQLite cannot open at all raises
`RecordDamagedError` at once. `backup_to` copies a record into a SQLite file with SQLite's online backup
(the server's record too, document by document), while the record serves.

A document's content hash is the SHA-256 of its title, text and metadata (`content_hash`); putting a document
whose hash and origin are those already kept writes nothing.

A document deleted through the API leaves a `Tombstone` in its place (its id, when, the file it came from and
its content hash then): an ingest of its unchanged file skips it, so a delete stays deleted across restarts
and rebuilds (app/ingest/tombstones.py). Putting a document of that id again lifts the tombstone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.settings import StoreSettings
from app.store.chroma import PROBE_ID_PREFIX, StoreError, is_connection_error, max_batch_size
from app.store.owned import RECORD_FROM_INDEX, RESTORE
from app.store.types import Document

RECORD_FILE = "documents.sqlite3"
BACKUP_DIR = Path("target") / "backups"  # where `sieve store backup` writes by default (relative to cwd)
QUICK_CHECK_LINES = 3  # of `PRAGMA quick_check`'s findings, how many a message quotes
_IN_BATCH = 500  # ids per query
_TOMBSTONE_FIELDS = ("deleted_at", "origin", "content_hash")  # a Tombstone's, after its id


@dataclass(frozen=True)
class Tombstone:
    """What the record keeps of a document deleted through the API: its id, when (UTC, ISO 8601), the file
    it came from (its origin: "api" for the write API) and its content hash (`content_hash`) then."""

    doc_id: str
    deleted_at: str
    origin: str
    content_hash: str


class DocumentRecord(Protocol):
    """What Sieve keeps of every accepted document, and a tombstone of every one deleted through the API."""

    description: str
    damage: str | None  # why the record is damaged (writes are refused), or None

    def put(self, documents: Sequence[Document]) -> int:
        """Keep `documents` (replacing those of the same id, and lifting their tombstones), durably before
        returning; the number of documents new or changed (an unchanged one costs a read, no write)."""
        ...

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        """The kept documents of `doc_ids`, in that order; ids not kept (or only tombstones) are left out."""
        ...

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        """Forget `doc_ids`; the number that were kept. `tombstone` (a delete through the API): each kept
        one leaves a `Tombstone`; without it (a document gone from its file) nothing is left, and the
        tombstones of `doc_ids` stay as they are."""
        ...

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        """The tombstones of `doc_ids` (None: every one), by document id."""
        ...

    def count(self) -> int:
        """How many documents are kept (tombstones are not documents)."""
        ...

    def hashes(self) -> dict[str, str]:
        """Every kept document's id and content hash (tombstones left out)."""
        ...

    def iter_documents(self, batch: int = _IN_BATCH) -> Iterator[Document]:
        """Every kept document, by id."""
        ...

    def put_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        """Keep `tombstones` as they are (a restore, a record rebuilt from the index)."""
        ...

    def probe(self) -> list[str]:
        """Read everything and write a scratch entry (deleted again); what failed, or an empty list."""
        ...

    def damaged_message(self, why: str) -> str:
        """What a refusal of this record, damaged for `why`, says: the record, why, and the way back."""
        ...

    def close(self) -> None: ...


class RecordError(StoreError):
    """The document record could not be read or written; the message names the record and what failed."""


class RecordDamagedError(RecordError):
    """The document record is damaged (SQLite cannot open it, or `PRAGMA quick_check` finds it corrupt):
    writes are refused; the message says what is wrong (`what`, alone) and the way back
    (`record_way_back`)."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


def backups(directory: Path = BACKUP_DIR) -> list[Path]:
    """The record backups in `directory` (`sieve store backup`'s default folder), newest first."""
    if not directory.is_dir():
        return []
    return sorted(directory.glob("documents-*.sqlite3"), key=lambda p: p.stat().st_mtime, reverse=True)


def record_way_back(directory: Path = BACKUP_DIR) -> str:
    """The way back for a damaged record: the newest backup in `directory` when there is one, and always the
    rebuild of the record from the index."""
    found = backups(directory)
    from_index = (
        f"`{RECORD_FROM_INDEX}` (keeps what the record still reads, rebuilds the rest of each document from "
        "its chunks in the collection)"
    )
    if not found:
        return f"no backup in {directory}: {from_index}"
    return f"`{RESTORE} {found[0]}` (the newest backup in {directory}), or {from_index}"


def damaged_message(description: str, why: str, backup_dir: Path = BACKUP_DIR) -> str:
    """ "<description> is damaged (<why>). Way back (with `sieve serve` stopped): <record_way_back>"."""
    way_back = record_way_back(backup_dir)
    return f"{description} is damaged ({why}). Way back (with `sieve serve` stopped): {way_back}"


def quick_check(db: sqlite3.Connection) -> str | None:
    """None when `PRAGMA quick_check` says "ok", else its first findings (or the error it raised)."""
    try:
        rows = [str(row[0]) for row in db.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    if rows == ["ok"]:
        return None
    more = f" (and {len(rows) - QUICK_CHECK_LINES} more)" if len(rows) > QUICK_CHECK_LINES else ""
    return "; ".join(rows[:QUICK_CHECK_LINES]) + more


@contextmanager
def failing_as(description: str, action: str) -> Iterator[None]:
    """Raise whatever the block raises (but a StoreError) as a `RecordError` naming `description` and
    `action`."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        raise RecordError(f"{description}: {action} failed: {type(exc).__name__}: {exc}") from exc


# what SQLite says of a damaged file (as opposed to a closed connection, a locked database, a full disk)
_CORRUPTION = ("malformed", "not a database", "corrupt")


def content_hash(doc: Document) -> str:
    """SHA-256 (hex) of the document's title, text and metadata (keys sorted), as one JSON array."""
    body = json.dumps([doc.title, doc.text, doc.metadata], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


def _changed(documents: dict[str, Document], kept: dict[str, tuple[str, str]]) -> list[tuple[Document, str]]:
    """(document, its content hash) of those whose (hash, origin) differs from the kept one, or not kept."""
    hashed = [(doc, content_hash(doc)) for doc in documents.values()]
    return [(doc, digest) for doc, digest in hashed if kept.get(doc.doc_id) != (digest, doc.origin)]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _document(doc_id: str, title: str, text: str, metadata: str, origin: str) -> Document:
    return Document(doc_id=doc_id, text=text, title=title, metadata=json.loads(metadata), origin=origin)


def _metadata_json(doc: Document) -> str:
    return json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True)


class SqliteRecord:
    """The record of an embedded store: one SQLite file, opened by the process holding the store's lock."""

    def __init__(self, path: Path, backup_dir: Path = BACKUP_DIR):
        """Open (or create) the record at `path` and check it (`PRAGMA quick_check`): a damaged one opens
        with `damage` set (writes refused); one SQLite cannot open raises `RecordDamagedError`. Both name
        the way back, with the newest backup in `backup_dir`."""
        self.path = path
        self.description = f"document record {path}"
        self.damage: str | None = None
        self._backup_dir = backup_dir
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before put returns
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS documents (doc_id TEXT PRIMARY KEY, title TEXT NOT NULL, "
                "text TEXT NOT NULL, metadata TEXT NOT NULL, origin TEXT NOT NULL, "
                "content_hash TEXT NOT NULL, accepted_at TEXT NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS tombstones (doc_id TEXT PRIMARY KEY, deleted_at TEXT NOT NULL, "
                "origin TEXT NOT NULL, content_hash TEXT NOT NULL)"
            )
            self._db.execute("CREATE TABLE IF NOT EXISTS probe (id TEXT PRIMARY KEY)")
        except sqlite3.Error as exc:
            what = f"{self.description}: open failed: {type(exc).__name__}: {exc}"
            way_back = record_way_back(backup_dir)
            raise RecordDamagedError(
                f"{what}. Way back (with `sieve serve` stopped): {way_back}", what=what
            ) from exc
        except OSError as exc:
            raise RecordError(f"{self.description}: open failed: {type(exc).__name__}: {exc}") from exc
        found = quick_check(self._db)
        if found is not None:
            self.damage = f"PRAGMA quick_check: {found}"

    def damaged_message(self, why: str) -> str:
        """ "document record X is damaged (why). Way back (with `sieve serve` stopped): ...": what every
        refusal of a damaged record says."""
        return damaged_message(self.description, why, self._backup_dir)

    @contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        """`failing_as` for this record; a failure SQLite gives for a damaged file marks the record damaged
        and names the way back (`RecordDamagedError`)."""
        try:
            yield
        except StoreError:
            raise
        except sqlite3.DatabaseError as exc:
            said = f"{self.description}: {action} failed: {type(exc).__name__}: {exc}"
            if not any(word in str(exc) for word in _CORRUPTION):
                raise RecordError(said) from exc
            self.damage = self.damage or f"{type(exc).__name__}: {exc}"
            raise RecordDamagedError(f"{said}. {self.damaged_message(self.damage)}", what=said) from exc
        except Exception as exc:
            raise RecordError(f"{self.description}: {action} failed: {type(exc).__name__}: {exc}") from exc

    def _refuse_if_damaged(self) -> None:
        if self.damage is not None:
            raise RecordDamagedError(f"writes are refused: {self.damaged_message(self.damage)}")

    def probe(self) -> list[str]:
        """What is wrong with the record, or nothing: `PRAGMA quick_check` (as at open), every document
        read, and a scratch row written and deleted in a table of its own."""
        problems = []
        if self.damage is None:
            with self._lock:
                again = quick_check(self._db)
            if again is not None:
                self.damage = f"PRAGMA quick_check: {again}"
        if self.damage is not None:
            problems.append(f"{self.description} is damaged ({self.damage})")
        try:
            sum(1 for _ in self.iter_documents())
            self.tombstones()
        except StoreError as exc:
            problems.append(str(getattr(exc, "what", exc)))
        try:
            scratch = f"{PROBE_ID_PREFIX}{uuid.uuid4().hex}"
            with self._lock, self._transaction():
                self._db.execute("INSERT INTO probe VALUES (?)", (scratch,))
                self._db.execute("DELETE FROM probe WHERE id = ?", (scratch,))
        except sqlite3.Error as exc:
            problems.append(f"writing {self.description} failed: {type(exc).__name__}: {exc}")
        return problems

    def put_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        """Keep `tombstones` as they are (a restore, a record rebuilt from the index)."""
        self._refuse_if_damaged()
        with self._failing("put tombstones"), self._lock, self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?, ?)",
                [(t.doc_id, t.deleted_at, t.origin, t.content_hash) for t in tombstones],
            )

    def put(self, documents: Sequence[Document]) -> int:
        self._refuse_if_damaged()
        with self._failing("put"):
            rows = {doc.doc_id: doc for doc in documents}  # the last of one id wins, as in the index
            kept = {
                doc_id: (digest, origin)
                for doc_id, digest, origin in self._select("doc_id, content_hash, origin", list(rows))
            }
            changed = [
                (doc.doc_id, doc.title, doc.text, _metadata_json(doc), doc.origin, digest, _now())
                for doc, digest in _changed(rows, kept)
            ]
            if changed:
                with self._lock, self._transaction():
                    self._db.executemany(
                        "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?, ?, ?)", changed
                    )
                    # a tombstoned id is never kept, so it is always among the changed: lifted here
                    self._db.executemany(
                        "DELETE FROM tombstones WHERE doc_id = ?", [(row[0],) for row in changed]
                    )
            return len(changed)

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        with self._failing("get"):
            found = {
                row[0]: _document(*row)
                for row in self._select("doc_id, title, text, metadata, origin", doc_ids)
            }
            return [found[doc_id] for doc_id in dict.fromkeys(doc_ids) if doc_id in found]

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        self._refuse_if_damaged()
        with self._failing("delete"):
            ids = list(dict.fromkeys(doc_ids))
            deleted = 0
            with self._lock, self._transaction():
                for start in range(0, len(ids), _IN_BATCH):
                    part = ids[start : start + _IN_BATCH]
                    marks = ",".join("?" * len(part))
                    if tombstone:
                        self._db.execute(
                            "INSERT OR REPLACE INTO tombstones SELECT doc_id, ?, origin, content_hash "
                            f"FROM documents WHERE doc_id IN ({marks})",
                            [_now(), *part],
                        )
                    deleted += self._db.execute(
                        f"DELETE FROM documents WHERE doc_id IN ({marks})", part
                    ).rowcount
            return deleted

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        with self._failing("tombstones"):
            columns = "doc_id, deleted_at, origin, content_hash"
            if doc_ids is None:
                with self._lock:
                    rows = self._db.execute(f"SELECT {columns} FROM tombstones").fetchall()
            else:
                rows = self._select(columns, doc_ids, table="tombstones")
            return {row[0]: Tombstone(*row) for row in rows}

    def count(self) -> int:
        with self._failing("count"):
            with self._lock:
                return int(self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def hashes(self) -> dict[str, str]:
        with self._failing("hashes"):
            with self._lock:
                return dict(self._db.execute("SELECT doc_id, content_hash FROM documents").fetchall())

    def iter_documents(self, batch: int = _IN_BATCH) -> Iterator[Document]:
        with self._failing("iter documents"):
            after = ""
            while True:
                with self._lock:
                    rows = self._db.execute(
                        "SELECT doc_id, title, text, metadata, origin FROM documents WHERE doc_id > ? "
                        "ORDER BY doc_id LIMIT ?",
                        (after, batch),
                    ).fetchall()
                yield from (_document(*row) for row in rows)
                if len(rows) < batch:
                    return
                after = rows[-1][0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _select(self, columns: str, doc_ids: Sequence[str], table: str = "documents") -> list[Any]:
        ids = list(dict.fromkeys(doc_ids))
        rows: list[Any] = []
        with self._lock:
            for start in range(0, len(ids), _IN_BATCH):
                part = ids[start : start + _IN_BATCH]
                marks = ",".join("?" * len(part))
                query = f"SELECT {columns} FROM {table} WHERE doc_id IN ({marks})"
                rows.extend(list(row) for row in self._db.execute(query, part))
        return rows

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the block raises: a put or delete lands whole or not."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")


class ChromaRecord:
    """The record on a Chroma server: a collection `<collection>-documents` whose records are the documents
    (their JSON as the record's document; their hash, origin and time as its metadata; a constant one-number
    vector, never searched). Every replica reads and writes the same one.

    A tombstone takes its document's place under the same id (one upsert, so a delete through the API lands
    whole): no body, and the metadata `{"tombstone": true, "deleted_at", "origin", "content_hash"}`. Every
    read of documents leaves tombstones out; putting the id again replaces it (and removes those keys: an
    upsert merges metadata)."""

    def __init__(self, collection: Any, description: str, max_batch: int):
        self._collection = collection
        self.description = description
        self._max_batch = max_batch
        self.damage: str | None = None  # a collection's damage shows as failing reads and writes instead

    def damaged_message(self, why: str) -> str:
        return damaged_message(self.description, why)

    @contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        """`failing_as` for this record; a failure of the server's collection itself (not of the connection
        to the server) names the way back (`RecordDamagedError`)."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            said = f"{self.description}: {action} failed: {type(exc).__name__}: {exc}"
            if is_connection_error(exc):
                raise RecordError(said) from exc
            raise RecordDamagedError(f"{said}. {self.damaged_message(str(exc))}", what=said) from exc

    def probe(self) -> list[str]:
        """Every record read and its body parsed (`iter_documents`), the tombstones read, and a scratch
        record (`PROBE_ID_PREFIX`) written and deleted."""
        problems = []
        try:
            sum(1 for _ in self.iter_documents())
            self.tombstones()
        except StoreError as exc:
            problems.append(f"reading {self.description} failed: {exc}")
        try:
            scratch = f"{PROBE_ID_PREFIX}{uuid.uuid4().hex}"
            self._collection.upsert(ids=[scratch], embeddings=[[1.0]])
            self._collection.delete(ids=[scratch])
        except Exception as exc:
            problems.append(f"writing {self.description} failed: {type(exc).__name__}: {exc}")
        return problems

    def put_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        with self._failing("put tombstones"):
            for start in range(0, len(tombstones), self._max_batch):
                part = tombstones[start : start + self._max_batch]
                self._collection.upsert(
                    ids=[t.doc_id for t in part],
                    embeddings=[[1.0]] * len(part),
                    documents=[""] * len(part),
                    metadatas=[
                        {
                            "accepted_at": None,
                            "tombstone": True,
                            "deleted_at": t.deleted_at,
                            "origin": t.origin,
                            "content_hash": t.content_hash,
                        }
                        for t in part
                    ],
                )

    def put(self, documents: Sequence[Document]) -> int:
        with self._failing("put"):
            rows = {doc.doc_id: doc for doc in documents}
            kept = {
                doc_id: (str(meta.get("content_hash")), str(meta.get("origin")))
                for doc_id, meta in self._metadata(list(rows)).items()
                if not _is_tombstone(meta)
            }
            changed = _changed(rows, kept)
            for start in range(0, len(changed), self._max_batch):
                part = changed[start : start + self._max_batch]
                self._collection.upsert(
                    ids=[doc.doc_id for doc, _ in part],
                    embeddings=[[1.0]] * len(part),
                    documents=[_body(doc) for doc, _ in part],
                    metadatas=[
                        {**_LIFTED, "content_hash": h, "origin": doc.origin, "accepted_at": _now()}
                        for doc, h in part
                    ],
                )
            return len(changed)

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        with self._failing("get"):
            found: dict[str, Document] = {}
            ids = list(dict.fromkeys(doc_ids))
            for start in range(0, len(ids), _IN_BATCH):
                page = self._collection.get(
                    ids=ids[start : start + _IN_BATCH], include=["documents", "metadatas"]
                )
                for doc_id, body, meta in zip(page["ids"], page["documents"], page["metadatas"], strict=True):
                    if not _is_tombstone(meta):
                        found[doc_id] = _from_body(doc_id, body)
            return [found[doc_id] for doc_id in ids if doc_id in found]

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        with self._failing("delete"):
            ids = list(dict.fromkeys(doc_ids))
            kept = {doc_id: meta for doc_id, meta in self._metadata(ids).items() if not _is_tombstone(meta)}
            gone = [doc_id for doc_id in ids if doc_id in kept]
            for start in range(0, len(gone), self._max_batch):
                part = gone[start : start + self._max_batch]
                if not tombstone:
                    self._collection.delete(ids=part)
                    continue
                deleted_at = _now()
                self._collection.upsert(
                    ids=part,
                    embeddings=[[1.0]] * len(part),
                    documents=[""] * len(part),
                    metadatas=[
                        {
                            "accepted_at": None,
                            "tombstone": True,
                            "deleted_at": deleted_at,
                            "origin": str(kept[doc_id].get("origin", "")),
                            "content_hash": str(kept[doc_id].get("content_hash", "")),
                        }
                        for doc_id in part
                    ],
                )
            return len(gone)

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        with self._failing("tombstones"):
            found = (
                self._all_metadata(where={"tombstone": True})
                if doc_ids is None
                else self._metadata(list(dict.fromkeys(doc_ids)))
            )
            return {
                doc_id: Tombstone(doc_id, *(str(meta.get(key, "")) for key in _TOMBSTONE_FIELDS))
                for doc_id, meta in found.items()
                if _is_tombstone(meta)
            }

    def count(self) -> int:
        with self._failing("count"):
            return int(self._collection.count()) - len(self._all_metadata(where={"tombstone": True}))

    def hashes(self) -> dict[str, str]:
        with self._failing("hashes"):
            return {
                doc_id: str(meta.get("content_hash", ""))
                for doc_id, meta in self._all_metadata().items()
                if not _is_tombstone(meta)
            }

    def iter_documents(self, batch: int = _IN_BATCH) -> Iterator[Document]:
        with self._failing("iter documents"):
            ids = sorted(self.hashes())
            for start in range(0, len(ids), batch):
                yield from self.get(ids[start : start + batch])

    def close(self) -> None:
        pass

    def _metadata(self, doc_ids: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(doc_ids), _IN_BATCH):
            page = self._collection.get(ids=doc_ids[start : start + _IN_BATCH], include=["metadatas"])
            found.update(
                (doc_id, dict(meta or {}))
                for doc_id, meta in zip(page["ids"], page["metadatas"], strict=True)
            )
        return found

    def _all_metadata(self, where: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """{id: metadata} of every record of the collection (matching `where`), read a page at a time."""
        found: dict[str, dict[str, Any]] = {}
        page_size = _IN_BATCH * 10
        offset = 0
        while True:
            page = self._collection.get(include=["metadatas"], where=where, limit=page_size, offset=offset)
            found.update(
                (doc_id, dict(meta or {}))
                for doc_id, meta in zip(page["ids"], page["metadatas"], strict=True)
                if not doc_id.startswith(PROBE_ID_PREFIX)  # another process's probe, there for milliseconds
            )
            if len(page["ids"]) < page_size:
                return found
            offset += len(page["ids"])


# an upsert merges the metadata it is given into the record's: a document put over a tombstone drops these
_LIFTED = {"tombstone": None, "deleted_at": None}


def _is_tombstone(meta: dict[str, Any] | None) -> bool:
    return bool((meta or {}).get("tombstone"))


def _body(doc: Document) -> str:
    return json.dumps(
        {"title": doc.title, "text": doc.text, "metadata": doc.metadata, "origin": doc.origin},
        ensure_ascii=False,
        sort_keys=True,
    )


def _from_body(doc_id: str, body: str | None) -> Document:
    try:
        data = json.loads(body or "{}")
    except ValueError as exc:
        raise ValueError(f"the record of document {doc_id!r} is not JSON: {exc}") from exc
    return Document(
        doc_id=doc_id,
        text=data.get("text", ""),
        title=data.get("title", ""),
        metadata=dict(data.get("metadata") or {}),
        origin=data.get("origin", ""),
    )


def record_collection_name(collection: str) -> str:
    return f"{collection}-documents"


def open_record(settings: StoreSettings, client: Any) -> DocumentRecord:
    """The record of the configured store: embedded, `documents.sqlite3` in its folder (the caller holds the
    folder's lock); on a Chroma server, the collection `<collection>-documents` (created when missing) through
    `client`, the store's own."""
    if settings.mode == "embedded":
        return SqliteRecord(record_path(settings))
    name = record_collection_name(settings.collection)
    collection = client.get_or_create_collection(
        name, configuration={"hnsw": {"space": "l2"}}, embedding_function=None
    )
    return ChromaRecord(collection, _server_description(settings), max_batch_size(client))


def record_path(settings: StoreSettings) -> Path:
    """The SQLite file of an embedded store's record."""
    return Path(settings.path) / RECORD_FILE


def _server_description(settings: StoreSettings) -> str:
    name = record_collection_name(settings.collection)
    return f"document record '{name}' on the Chroma server at http://{settings.host}:{settings.port}"


def drop_server_record(settings: StoreSettings, client: Any) -> None:
    """Delete the record collection of a Chroma server (a restore or a rebuild from the index makes it
    anew); nothing when it does not exist."""
    name = record_collection_name(settings.collection)
    if name in {c if isinstance(c, str) else c.name for c in client.list_collections()}:
        client.delete_collection(name)


# -- backup and restore --------------------------------------------------------------------------------


def backup_name(collection: str, now: datetime | None = None) -> str:
    """`documents-<collection>-<UTC time>.sqlite3`: a backup's file name in `BACKUP_DIR`."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"documents-{collection}-{stamp}.sqlite3"


def backup_sqlite(source: Path, target: Path) -> None:
    """SQLite's online backup of the record file `source` into `target` (a new file): consistent while
    another process (`sieve serve`) writes the record, read-only on `source`."""
    if not source.exists():
        raise RecordError(f"no document record at {source}")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        target.unlink(missing_ok=True)
        raise RecordDamagedError(
            f"document record {source} cannot be backed up ({type(exc).__name__}: {exc}); "
            f"way back: {record_way_back()}"
        ) from exc


def copy_documents(source: DocumentRecord, target: DocumentRecord) -> tuple[int, int]:
    """Every document and tombstone of `source` into `target`; (documents, tombstones)."""
    documents = 0
    batch: list[Document] = []
    for doc in source.iter_documents():
        batch.append(doc)
        if len(batch) >= _IN_BATCH:
            documents += len(batch)
            target.put(batch)
            batch = []
    if batch:
        documents += len(batch)
        target.put(batch)
    stones = list(source.tombstones().values())
    if stones:
        target.put_tombstones(stones)
    return documents, len(stones)


def checked_backup(path: Path) -> SqliteRecord:
    """The backup at `path`, opened, when it is a record SQLite finds intact; else `RecordError` naming
    it."""
    if not path.is_file():
        raise RecordError(f"no backup file {path}")
    try:
        backup = SqliteRecord(path)
    except RecordError as exc:
        raise RecordError(f"{path} is not a usable record backup: {exc}") from exc
    if backup.damage is not None:
        backup.close()
        raise RecordError(f"{path} is not a usable record backup: it is damaged ({backup.damage})")
    return backup


def moved_aside(path: Path, now: datetime | None = None) -> Path:
    """Rename `path` (and its SQLite `-wal` and `-shm` files) to `<path>.broken-<UTC time>`; the new path."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.broken-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            shutil.move(str(part), str(aside.with_name(aside.name + suffix)))
    return aside
