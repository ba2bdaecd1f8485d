"""The vector store: Chroma, embedded (`PersistentClient`) or a server (`HttpClient`), behind one small class.

Facts this module is built around (measured on Chroma 1.5):
- we always pass our own embeddings; Chroma never embeds anything (it would try to download a model);
- cosine space and HNSW parameters are fixed when the collection is created (defaults recall poorly);
- an embedded path must be opened by one process only: two writers silently corrupt it, so we hold an
  exclusive lock file for as long as the store is open;
- the embedder that wrote the vectors is recorded in the collection metadata, and opening the collection
  with a different embedder is an error rather than silently mixed vectors;
- every write is also recorded in a small companion collection, `<collection>-changes` (the change log: one
  entry per committed batch, its `stamp` = the writer's clock in ns, its document = the chunk ids it upserted
  and deleted), so every process sharing the store can bring its lexical index up to date by reading only
  what changed (`changes_since`, then `get` of those ids), see app/lexical/sync.py. Entries
  older than a retention are deleted (`prune_changes`) after a marker entry says so, so that a process
  that had not read them yet knows it missed something;
- a rebuild (`sieve store rebuild`) writes a staging collection, `<collection>-rebuild`, then switches: the
  staging one is marked complete in its metadata, the configured one dropped, the staging one renamed to the
  configured name (`collection.modify(name=...)`, the same collection id). A switch stopped between the drop
  and the rename is finished by the next `open`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import chromadb
import chromadb.errors
import httpx
import numpy as np
from chromadb.api.shared_system_client import SharedSystemClient
from chromadb.config import Settings as ChromaClientSettings

from app import pidlock
from app.access.scope import Principal, and_where, scope_where
from app.settings import StoreSettings
from app.store.chunk_cache import ChunkCache
from app.store.errors import StoreError
from app.store.exact import ExactSearch
from app.store.space import MIB, SpaceGuard, storage_exhausted
from app.store.types import ChangeEntry, StoredChunk, unit_of

log = logging.getLogger(__name__)

LOCK_FILE = "sieve.lock"
_PAGE = 2000
_IN_BATCH = 500  # values per `$in` filter
HEARTBEAT_TIMEOUT_S = 2.0
# Metadata keys Chroma refuses ("#document" and other '#' keys, '$' operators) or silently drops ("chroma:*").
RESERVED_KEY_PREFIXES = ("#", "$", "chroma:")
REBUILD_SUFFIX = "-rebuild"
REBUILD_OF_KEY = "sieve_rebuild_of"  # a staging collection's metadata: the collection it rebuilds
REBUILD_COMPLETE_KEY = "sieve_rebuild_complete"  # ... and whether every recorded document is in it
REBUILT_FROM_KEY = "rebuilt_from"  # a change-log entry's metadata: the collection id a rebuild replaced


class StoreUnavailableError(StoreError):
    """The Chroma server cannot be reached (or the embedded path cannot be opened)."""


FailureKind = Literal["read", "write"]
# the names of Chroma's calls that write; every other call the store makes reads
_WRITES = frozenset({"add", "upsert", "update", "delete"})
# the scratch record of `probe_write`: an id no chunk can have (chunk ids are "c_" and hex, app/ingest/ids.py)
PROBE_ID_PREFIX = "sieve-probe-"


class StoreFailedError(StoreError):
    """The store answered a read or a write with an error: `kind` ("read" or "write"), `collection` (its
    name), the message "write to collection 'sieve' failed: <Chroma's message>"."""

    def __init__(self, kind: FailureKind, collection: str, reason: str) -> None:
        doing = "write to" if kind == "write" else "read from"
        super().__init__(f"{doing} collection '{collection}' failed: {reason}")
        self.kind = kind
        self.collection = collection

    def with_remedy(self) -> str:
        """The message and the commands that diagnose and repair the index, as start-up and the CLI say it."""
        return (
            f"the vector store cannot be used: {self}. Run `sieve store check` to see what is wrong, then "
            "`sieve store rebuild` to rebuild the index from the documents Sieve kept"
        )


@dataclass(frozen=True)
class StoreFailure:
    """The store's failing state for one kind of call on one collection: failing `since` (epoch seconds, the
    first failure of the run), with `message`, the last failure's."""

    kind: FailureKind
    collection: str
    since: float
    message: str

    def describe(self) -> str:
        """The state in words: "writes fail since 2026-12-04T23:30:01Z: write to collection ..."."""
        when = datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return f"{self.kind}s fail since {when}: {self.message}"


class ChromaFilesError(StoreUnavailableError):
    """An embedded store's Chroma files cannot be opened: `what` (Chroma's reason), and the message adds the
    way back."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}. Its files may be damaged: `sieve store check` says what is wrong; "
            "`sieve store rebuild` moves Chroma's files aside and rebuilds them from the document record"
        )
        self.what = what


class ChangeLogError(StoreError):
    """A change-log entry cannot be read: its body is not JSON. The message names the collection and the
    entry."""


class StoreLockedError(StoreError):
    """Another process holds the embedded store path: `path`, `holder`, the pid written in its lock file
    ("unknown" when none is), and `address`, where it serves when it is `sieve serve` and listens already
    (`app.pidlock.announce`; None otherwise)."""

    def __init__(self, path: Path, holder: str, address: str | None = None) -> None:
        who = (
            f"`sieve serve` (pid {holder}, listening on {address})"
            if address
            else f"another process (pid {holder})"
        )
        super().__init__(
            f"the embedded store {path} is already open in {who}. "
            f"Chroma's embedded mode allows one process per path: stop the other process, or run a "
            f"Chroma server (rag.store.mode: http) to share the index."
        )
        self.path = path
        self.holder = holder
        self.address = address


class EmbedderMismatchError(StoreError):
    """The collection was built with another embedder than the one configured."""


def metadata_key_problem(key: str) -> str | None:
    """Why `key` cannot be a metadata key in the store, or None when it can. (Measured on Chroma 1.5: "" and
    keys starting with '#' or '$' are refused with an opaque "Invalid metadata at index 0", "chroma:document"
    with a ValueError, other "chroma:" keys are accepted and silently not stored.)"""
    if not key:
        return "metadata key must not be empty"
    if key.startswith(RESERVED_KEY_PREFIXES):
        reserved = ", ".join(repr(p) for p in RESERVED_KEY_PREFIXES)
        return f"metadata key {key!r} is reserved by the store (keys may not start with {reserved})"
    return unicode_problem(key)


# The most metadata keys one chunk may carry into the store, whatever path it came by: a chunk of 5,000 to
# 5,500 keys breaks Chroma 1.5's compactor for good (every later write, a restart, a server's queries:
# "Error in compaction: Failed to apply logs to the metadata segment"), so the store refuses far below that.
# Documents have tighter limits of their own (rag.ingest.max_metadata_keys, the API's bounds).
STORE_MAX_METADATA_KEYS = 1000


def store_metadata_problem(chunk_id: str, metadata: dict[str, Any] | None) -> str | None:
    """Why the store refuses a chunk's metadata, or None: more than `STORE_MAX_METADATA_KEYS` keys."""
    if metadata is not None and len(metadata) > STORE_MAX_METADATA_KEYS:
        return (
            f"chunk {chunk_id!r} carries {len(metadata)} metadata keys, more than the store takes "
            f"({STORE_MAX_METADATA_KEYS}): refused before it reaches Chroma"
        )
    return None


def metadata_value_problem(value: Any) -> str | None:
    """Why scalar `value` cannot be a metadata value in the store, or None when it can. (Measured on Chroma
    1.5: a NaN or infinite number is accepted and the chunk's whole metadata is silently stored as None.)"""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (the store cannot keep NaN or infinite values)"
    if isinstance(value, str):
        return unicode_problem(value)
    return None


def _refuse_wide_metadata(rows: Iterable[tuple[str, dict[str, Any] | None]]) -> None:
    """Raise StoreError for the first chunk `store_metadata_problem` refuses, before anything is written."""
    for chunk_id, metadata in rows:
        problem = store_metadata_problem(chunk_id, metadata)
        if problem:
            raise StoreError(problem)


def unicode_problem(text: str) -> str | None:
    """None when `text` encodes as UTF-8; else where its first lone surrogate is (a JSON "\\ud800" escape
    decodes to one; neither Chroma nor the tokenizer can take it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start} "
            f"(a \\u{ord(text[exc.start]):04x} escape without its pair)"
        )
    return None


@dataclass
class _Identity:
    fields: dict[str, Any] = field(default_factory=dict)

    def as_metadata(self) -> dict[str, Any]:
        return {f"embedder_{k}": v for k, v in self.fields.items()}


class ChromaStore:
    def __init__(
        self,
        client: Any,
        collection: Any,
        description: str,
        lock_fd: int | None = None,
        heartbeat_url: str | None = None,
        cache_chunks: int = 0,
        space: SpaceGuard | None = None,
    ):
        """`heartbeat_url`: the Chroma server's heartbeat endpoint (http mode); None for an embedded store.
        `cache_chunks`: how many chunks `chunks` keeps in memory (app/store/chunk_cache.py; 0 = none).
        `space`: the free space an embedded store's writes must leave (`_call`); None: unguarded."""
        self._client = client
        self._collection = collection
        self.description = description
        self._lock_fd = lock_fd
        self._heartbeat_url = heartbeat_url
        self._changes: Any = None  # the change-log collection, opened on first use
        self.cache = ChunkCache(cache_chunks)
        self.exact: ExactSearch | None = None  # made by `load_exact`
        self._failures_lock = threading.Lock()  # guards the two fields below
        self._failures: dict[tuple[FailureKind, str], StoreFailure] = {}
        self._failing: dict[str, Any] = {}  # collection name -> the collection a recorded failure was on
        self.space = space
        self._broken: str | None = None  # why this process no longer calls the store (`_call`)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        settings: StoreSettings,
        embedder_identity: dict[str, Any],
        check_embedder: bool = True,
        create: bool = True,
    ) -> ChromaStore:
        """Open (or create) the collection; `embedder_identity` is {"name", "dimension", "checksum"}.
        `check_embedder=False` opens a collection built with another embedder too (`sieve store check` and
        `sieve store rebuild`, which never query it with this one). `create=False`: a missing collection is
        a `StoreError` (a reader that loads no model: `sieve experiment` deciding what it can reuse)."""
        lock_fd = None
        heartbeat_url = None
        telemetry_off = ChromaClientSettings(anonymized_telemetry=False, allow_reset=False)
        try:
            if settings.mode == "embedded":
                path = Path(settings.path)
                path.mkdir(parents=True, exist_ok=True)
                lock_fd = _lock(path)
                client = chromadb.PersistentClient(path=str(path), settings=telemetry_off)
                description = f"embedded Chroma at {path}"
            else:
                description = f"Chroma server at http://{settings.host}:{settings.port}"
                client = chromadb.HttpClient(host=settings.host, port=settings.port, settings=telemetry_off)
                client.heartbeat()
                heartbeat_url = f"http://{settings.host}:{settings.port}/api/v2/heartbeat"
            if not create and not _exists(client, settings.collection):
                raise StoreError(
                    f"{description} holds no collection '{settings.collection}': ingest documents first"
                )
            collection = _get_or_create(client, settings, embedder_identity, check_embedder)
        except StoreError:
            pidlock.release(lock_fd)
            raise
        except Exception as exc:  # chromadb raises many types; wrap once, here, where we know what we did
            pidlock.release(lock_fd)
            if settings.mode == "embedded":  # its own files: a rebuild moves them aside (app/store/owned.py)
                raise ChromaFilesError(f"cannot open embedded Chroma at {settings.path}: {exc}") from exc
            where = f"Chroma server at http://{settings.host}:{settings.port}"
            raise StoreUnavailableError(f"cannot open {where}: {exc}") from exc
        reserve = int(settings.min_free_mb * MIB)
        space = SpaceGuard([settings.path], reserve) if settings.mode == "embedded" else None
        return cls(client, collection, description, lock_fd, heartbeat_url, settings.cache_chunks, space)

    @property
    def client(self) -> Any:
        """The Chroma client this store was opened with (the document record of a server shares it)."""
        return self._client

    @property
    def collection_id(self) -> str:
        """Chroma's id of the collection: a rebuilt collection (same name) has a new one."""
        return str(self._collection.id)

    def close(self) -> None:
        pidlock.release(self._lock_fd)
        self._lock_fd = None

    def heartbeat(self) -> None:
        """Raise `StoreUnavailableError` unless the store answers now, `StoreFailedError` (recorded as any
        read failure) when it answers but cannot count the collection. A Chroma server is first asked its
        heartbeat with a timeout of HEARTBEAT_TIMEOUT_S (the client's own calls have none, and a readiness
        probe must not hang); then the collection is counted: a server answers its heartbeat while a
        collection whose compactor broke fails its writes, and its reads too once they must apply the log
        (measured on Chroma 1.5: at once when the log held writes no read had applied yet, else from the
        server's next restart, which does not heal it)."""
        if self._heartbeat_url is not None:
            try:
                response = httpx.get(self._heartbeat_url, timeout=HEARTBEAT_TIMEOUT_S)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                raise StoreUnavailableError(
                    f"{self.description} is unreachable: {type(exc).__name__}: {exc}"
                ) from exc
        self._call(self._collection.count)

    def warm_up(self, dimension: int) -> float:
        """Run one nearest-neighbour query so the store loads its vector index now; returns its seconds.

        Chroma loads a collection's HNSW segment at the first query, not when the collection is opened
        (seconds at 100k chunks: docs/benchmarks.md#code-figures), so without this a service would say it
        is ready and then make its first user wait for that load. An empty collection has nothing to load."""
        started = time.perf_counter()
        if self.count() > 0:
            probe = np.zeros((1, dimension), dtype=np.float32)
            probe[0, 0] = 1.0  # any unit vector: only the load matters, not the neighbours
            self._call(self._collection.query, query_embeddings=probe, n_results=1, include=[])
        return time.perf_counter() - started

    def load_exact(self, max_chunks: int, filtered_max_chunks: int = 0) -> str:
        """Read every chunk's vector into an exact search (app/store/exact.py) when the collection holds at
        most `max_chunks` (0: never), or, for its filtered queries only, at most `filtered_max_chunks`;
        `query_ids` uses it from then on. Returns the sentence for the log."""
        if max_chunks <= 0:
            return "dense search: the store's HNSW index (rag.store.exact_search_max_chunks is 0)"
        started = time.perf_counter()
        exact = ExactSearch(max_chunks, filtered_max_chunks)
        self.exact = exact  # from here on, writes mark their ids stale
        with exact.refreshing:
            exact.take_stale()
            self._load_all(exact)
        if not exact.active:
            return f"dense search: the store's HNSW index ({exact.why_not})"
        if not exact.serves_all:
            return (
                f"dense search: the store's HNSW index, and exact for a filter that at most {max_chunks} "
                f"chunks match, over {len(exact)} vectors held in memory (read in "
                f"{time.perf_counter() - started:.1f}s; rag.store.exact_filtered_max_chunks "
                f"{filtered_max_chunks})"
            )
        return (
            f"dense search: exact, over {len(exact)} vectors held in memory "
            f"(read in {time.perf_counter() - started:.1f}s; rag.store.exact_search_max_chunks {max_chunks})"
        )

    def _load_all(self, exact: ExactSearch) -> None:
        """Read the whole collection into `exact` (with its `refreshing` held, its stale ids taken). Pages are
        read by offset: another process's write during the read can shift a chunk past a page boundary
        unread. The count then differs (or a write is in flight): the read is made once more."""
        for attempt in range(2):
            if attempt:
                exact.take_stale()  # the second read covers them
            exact.load(self.iter_all(include_text=False, include_vectors=True), self.count())
            if not exact.active or len(exact) == self.count():
                return

    @property
    def exact_search_active(self) -> bool:
        """True when `query_ids` answers from the exact search (without `where`, or with a knowledge tag)."""
        return self.exact is not None and self.exact.serves_all

    def exact_search_covers(self, tag: str | None, principal: Principal | None = None) -> bool:
        """True when `query_ids` answers a query with this knowledge tag and principal from the exact search:
        always while `exact_search_active`; for a larger collection held for filtered queries, when at most
        rag.store.exact_search_max_chunks chunks match (`ExactSearch.covers`)."""
        return self.exact is not None and self.exact.covers(tag, principal)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self._collection.name)

    def count(self) -> int:
        return int(self._call(self._collection.count))

    def metadata(self) -> dict[str, Any]:
        return dict(self._collection.metadata or {})

    def query(
        self, embeddings: np.ndarray, n: int, where: dict[str, Any] | None = None
    ) -> list[list[StoredChunk]]:
        """Nearest chunks for each query vector (rows of `embeddings`), best first."""
        if len(embeddings) == 0:
            return []
        result = self._nearest(embeddings, n, where, ["documents", "metadatas", "embeddings", "distances"])
        out = []
        for i in range(len(embeddings)):
            rows = zip(
                result["ids"][i],
                result["documents"][i],
                result["metadatas"][i],
                result["embeddings"][i],
                result["distances"][i],
                strict=True,
            )
            out.append(
                [
                    StoredChunk(
                        cid, doc or "", dict(meta or {}), np.asarray(emb, dtype=np.float32), 1.0 - dist
                    )
                    for cid, doc, meta, emb, dist in rows
                ]
            )
        return out

    def get(self, ids: Sequence[str], include_embeddings: bool = True) -> list[StoredChunk]:
        """Chunks by id, in the order asked; unknown ids are left out."""
        if not ids:
            return []
        include = ["documents", "metadatas"] + (["embeddings"] if include_embeddings else [])
        result = self._call(self._collection.get, ids=list(ids), include=include)
        found = {}
        for i, cid in enumerate(result["ids"]):
            emb = result["embeddings"][i] if include_embeddings else None
            found[cid] = StoredChunk(
                cid,
                result["documents"][i] or "",
                dict(result["metadatas"][i] or {}),
                None if emb is None else np.asarray(emb, dtype=np.float32),
            )
        return [found[cid] for cid in ids if cid in found]

    def query_ids(
        self,
        embeddings: np.ndarray,
        n: int,
        where: dict[str, Any] | None = None,
        principal: Principal | None = None,
    ) -> list[list[tuple[str, float]]]:
        """(chunk id, cosine similarity = 1 - cosine distance) of the nearest chunks for each query vector,
        best first: `query` without reading any document, metadata or vector (`chunks` has those).

        `principal`: only chunks it may read (`app.access.scope`): the exact search's own filter, or
        Chroma's `where` with the scope's clause added (`scope_where`)."""
        if len(embeddings) == 0:
            return []
        if principal is not None and principal.admin:
            principal = None
        exact = self._exact_query(embeddings, n, where, principal)
        if exact is not None:
            return exact
        if principal is not None:
            where = and_where(where, scope_where(principal))
        result = self._nearest(embeddings, n, where, ["distances"])
        return [
            [(cid, 1.0 - dist) for cid, dist in zip(ids, dists, strict=True)]
            for ids, dists in zip(result["ids"], result["distances"], strict=True)
        ]

    def _exact_query(
        self, embeddings: np.ndarray, n: int, where: dict[str, Any] | None, principal: Principal | None
    ) -> list[list[tuple[str, float]]] | None:
        """`query_ids`' answer from the exact search, or None when it cannot give one (not loaded, turned
        off, a `where` other than one knowledge tag, or ids still stale)."""
        exact = self.exact
        if exact is None or not exact.active:
            return None
        if where is None:
            tag = None
        elif set(where) == {"knowledge"} and isinstance(where["knowledge"], str):
            tag = where["knowledge"]
        else:
            return None
        self._refresh_exact(wait=False)
        return exact.search(embeddings, n, tag, principal)

    def _refresh_exact(self, wait: bool) -> None:
        """Read the exact search's stale ids back from the store. `wait=False` (a query): when another
        thread is reading them already, go on without waiting (the query then sees those chunks as they
        were, as a query concurrent with their write may)."""
        exact = self.exact
        if exact is None or not exact.active:
            return
        if not exact.refreshing.acquire(blocking=wait):
            return
        try:
            everything, ids = exact.take_stale()
            if not everything and not ids:
                return
            try:
                if everything:
                    self._load_all(exact)
                else:
                    present = self.get(ids, include_embeddings=True)
                    found = {c.chunk_id for c in present}
                    exact.apply(present, [i for i in ids if i not in found])
            except BaseException:
                exact.restale(everything, ids)
                raise
            if not exact.active:
                log.warning("exact dense search turned off: %s; the store's HNSW index serves", exact.why_not)
        finally:
            exact.refreshing.release()

    def _exact_changed(self, ids: Iterable[str] | None) -> None:
        """`ids` (None: any chunk) may differ in the store now: the exact search reads them back at once,
        so the write's caller and the next query see them. A failed read leaves them stale for the next
        query to read (it is logged, never raised: this runs after writes, also failed ones)."""
        exact = self.exact
        if exact is None:
            return
        if ids is None:
            exact.stale_all()
        else:
            exact.stale(ids)
        try:
            self._refresh_exact(wait=True)
        except Exception as exc:
            log.warning(
                "exact dense search: reading written chunks back failed (retried at the next query): %s", exc
            )

    def _nearest(
        self, embeddings: np.ndarray, n: int, where: dict[str, Any] | None, include: list[str]
    ) -> Any:
        """Chroma's query: the `n` nearest chunks of each row of `embeddings`, with the `include` fields."""
        return self._call(
            self._collection.query,
            query_embeddings=np.asarray(embeddings, dtype=np.float32),
            n_results=n,
            where=where,
            include=include,
        )

    def chunks(self, ids: Sequence[str]) -> dict[str, StoredChunk]:
        """Chunks by id with their vectors and `unit` (`unit_of`; None without a vector), from the
        chunk cache; the ones not cached are read with one `get` and cached. Ids the store does not hold
        are left out. The chunks are the cache's own objects, shared with every other reader: never modify
        one (copy its metadata to keep it; the vector is read-only)."""
        found, missing = self.cache.lookup(ids)
        if missing:
            epoch = self.cache.epoch
            read = self.get(missing, include_embeddings=True)
            for chunk in read:
                if chunk.embedding is not None:
                    chunk.embedding.flags.writeable = False
                    chunk.unit = unit_of(chunk.embedding)
            self.cache.fill(read, epoch)
            found.update((c.chunk_id, c) for c in read)
        return found

    def forget(self, ids: Iterable[str]) -> None:
        """Drop `ids` from the chunk cache and read them back into the exact search: another process wrote
        or deleted them (the change log says so)."""
        ids = list(ids)
        self.cache.invalidate(ids)
        self._exact_changed(ids)

    def forget_all(self) -> None:
        """Empty the chunk cache and re-read the exact search: this process may have missed other
        processes' writes (a pruned change log), so any cached chunk may be stale."""
        self.cache.clear()
        self._exact_changed(None)

    def metadata_of(self, chunk_ids: Sequence[str], doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Chunk id -> metadata of the stored chunks that have one of `chunk_ids` or whose `doc_id` is one
        of `doc_ids`: a `get` by ids, and one with `where: {doc_id: {$in: ...}}`. The first costs what is
        asked; the second does not: any `where` took Chroma as long at 1M chunks whatever it matched
        (docs/benchmarks.md#code-figures, docs/scaling.md), still far less than re-reading the
        collection's metadata."""
        out: dict[str, dict[str, Any]] = {}
        batch = self._max_batch()
        for start in range(0, len(chunk_ids), batch):
            page = self._call(
                self._collection.get, ids=list(chunk_ids[start : start + batch]), include=["metadatas"]
            )
            out.update(
                (cid, dict(meta or {})) for cid, meta in zip(page["ids"], page["metadatas"], strict=True)
            )
        for start in range(0, len(doc_ids), _IN_BATCH):
            part = list(doc_ids[start : start + _IN_BATCH])
            page = self._call(self._collection.get, where={"doc_id": {"$in": part}}, include=["metadatas"])
            out.update(
                (cid, dict(meta or {})) for cid, meta in zip(page["ids"], page["metadatas"], strict=True)
            )
        return out

    def iter_all(self, include_text: bool = True, include_vectors: bool = False) -> Iterator[StoredChunk]:
        """Every chunk (metadata, with its text and vector as asked), page by page."""
        include = (
            ["metadatas"]
            + (["documents"] if include_text else [])
            + (["embeddings"] if include_vectors else [])
        )
        offset = 0
        while True:
            page = self._call(self._collection.get, include=include, limit=_PAGE, offset=offset)
            ids = page["ids"]
            for i, cid in enumerate(ids):
                text = page["documents"][i] if include_text else ""
                emb = page["embeddings"][i] if include_vectors else None
                vector = None if emb is None else np.asarray(emb, dtype=np.float32)
                yield StoredChunk(cid, text or "", dict(page["metadatas"][i] or {}), vector)
            if len(ids) < _PAGE:
                return
            offset += _PAGE

    # -- writing ---------------------------------------------------------------------------------

    def upsert(self, chunks: Sequence[StoredChunk], embeddings: np.ndarray) -> None:
        if len(chunks) != len(embeddings):
            raise ValueError(f"{len(chunks)} chunks but {len(embeddings)} embeddings")
        _refuse_wide_metadata((c.chunk_id, c.metadata) for c in chunks)
        batch = self._max_batch()
        try:
            for start in range(0, len(chunks), batch):
                part = chunks[start : start + batch]
                self._call(
                    self._collection.upsert,
                    ids=[c.chunk_id for c in part],
                    embeddings=np.asarray(embeddings[start : start + batch], dtype=np.float32),
                    documents=[c.text for c in part],
                    metadatas=[c.metadata or None for c in part],
                )
        finally:  # also after a failure: some batches may be stored
            self.cache.invalidate(c.chunk_id for c in chunks)
            self._exact_changed(c.chunk_id for c in chunks)

    def update_metadata(self, ids: Sequence[str], metadatas: Sequence[dict[str, Any]]) -> None:
        """Replace the metadata of stored chunks (their text and vectors stay)."""
        _refuse_wide_metadata(zip(ids, metadatas, strict=True))
        batch = self._max_batch()
        try:
            for start in range(0, len(ids), batch):
                self._call(
                    self._collection.update,
                    ids=list(ids[start : start + batch]),
                    metadatas=list(metadatas[start : start + batch]),
                )
        finally:
            self.cache.invalidate(ids)
            self._exact_changed(ids)

    def delete(self, ids: Sequence[str]) -> None:
        batch = self._max_batch()
        try:
            for start in range(0, len(ids), batch):
                self._call(self._collection.delete, ids=list(ids[start : start + batch]))
        finally:
            self.cache.invalidate(ids)
            self._exact_changed(ids)

    # -- rebuilding: a staging collection, then the switch --------------------------------------------

    def staging(self, settings: StoreSettings, embedder_identity: dict[str, Any]) -> ChromaStore:
        """A store over this collection's staging collection (`staging_collection_name`) on the same
        client, marked incomplete: the one a stopped rebuild left, when it was built with this embedder
        (its chunks are kept: a rerun embeds only what is missing), else a new one. It holds no lock of
        its own (this store's is held until this store closes) and has no chunk cache."""
        name = staging_collection_name(self.name)
        wanted = {**_Identity(dict(embedder_identity)).as_metadata(), REBUILD_OF_KEY: self.name}
        collection = None
        if _exists(self._client, name):
            collection = self._call(self._client.get_collection, name)
            kept = {k: v for k, v in (collection.metadata or {}).items() if k != REBUILD_COMPLETE_KEY}
            unusable = _unusable(self, collection)
            if kept != wanted or unusable:
                why = unusable or f"built otherwise: {kept}"
                log.warning("staging collection '%s' cannot be resumed (%s): dropping it", name, why)
                self._call(self._client.delete_collection, name)
                collection = None
        if collection is None:
            collection = self._call(
                self._client.create_collection,
                name,
                configuration=_configuration(settings),
                metadata={**wanted, REBUILD_COMPLETE_KEY: False},
                embedding_function=None,
            )
        else:
            self._call(collection.modify, metadata={**wanted, REBUILD_COMPLETE_KEY: False})
        return ChromaStore(self._client, collection, f"{self.description}, collection '{name}'")

    def switch_to(self, staging: ChromaStore) -> None:
        """Make `staging` (from `staging`, complete) this collection: mark it complete, drop this one, rename
        it to this one's name, then take it as this store's collection (a new collection id). Stopped after
        the mark, this collection still serves and a rerun of the rebuild switches; stopped after the drop,
        the next `open` renames the complete staging collection (`_finish_switch`)."""
        name = self.name
        metadata = dict(staging.metadata())
        self._call(staging._collection.modify, metadata={**metadata, REBUILD_COMPLETE_KEY: True})
        if _exists(self._client, name):
            self._call(self._client.delete_collection, name)
        try:
            _rename_staging(staging._collection, name)
        except Exception:
            if not _exists(self._client, name):  # else a process opening the store finished the switch
                raise
        self._collection = self._call(self._client.get_collection, name)
        self.forget_all()

    def rebuilt(self, previous_id: str) -> tuple[str, int]:
        """Append the change-log entry a switch leaves for the other processes: a prune marker stamped now
        (a process reading it re-reads every chunk's metadata, `LexicalSync._resync`) that names the
        collection id it replaced (`REBUILT_FROM_KEY`: a process still on that one opens the new one first,
        `changes_since`)."""
        before = time.time_ns()
        body = {"put": [], "del": [], "pruned_before": before, "rebuilt": [previous_id, self.collection_id]}
        return self._log_entry(body, {"pruned_before": before, REBUILT_FROM_KEY: previous_id})

    def _follow_rebuild(self, current: Any = None) -> None:
        """Open the collection of this store's name again (a rebuild replaced it under another process: the
        old id is gone; `current`: it, already opened) and forget every cached chunk and vector."""
        log.warning("collection '%s' was rebuilt by another process: opening the new one", self.name)
        self._collection = current or self._call(self._client.get_collection, self.name)
        with self._failures_lock:  # a failure recorded on the dropped collection is rechecked on this one
            if self.name in self._failing:
                self._failing[self.name] = self._collection
        self.forget_all()

    def _rebuilt_under_us(self, exc: Exception) -> Any:
        """The collection that replaced this store's when `exc` says this one no longer exists and one of the
        same name and another id does (a rebuild switched while this process held the old one), else None.
        A call that lands between the rebuild's change-log entry and a read of it follows the switch at
        once instead of failing."""
        if not isinstance(exc, chromadb.errors.NotFoundError):
            return None
        try:
            current = self._client.get_collection(self.name)
        except Exception:  # no collection of that name (a switch between its drop and its rename)
            return None
        return current if str(current.id) != self.collection_id else None

    def embedder_mismatch(self, embedder_identity: dict[str, Any]) -> str | None:
        """Why this collection was not built with the embedder of `embedder_identity`, or None."""
        return _embedder_mismatch(self.name, self._collection.metadata, embedder_identity)

    def probe(self) -> list[str]:
        """Read this collection (one `get`, a count) and write it once (`probe_write`: a scratch record
        written and deleted again, under an id no chunk can have); what failed, or an empty list."""
        problems = []
        try:
            self._call(self._collection.get, include=["metadatas"], limit=1)
            self._call(self._collection.count)
        except StoreError as exc:
            problems.append(f"read probe failed ({self.description}): {exc}")
        try:
            self.probe_write()
        except StoreError as exc:
            problems.append(f"write probe failed ({self.description}): {exc}")
        return problems

    # -- the change log ----------------------------------------------------------------------------

    def _change_log(self) -> Any:
        if self._changes is None:
            self._changes = self._call(
                self._client.get_or_create_collection,
                changes_collection_name(self.name),
                metadata={"sieve_change_log_of": self.name},
                embedding_function=None,
            )
        return self._changes

    def record_change(self, upserted_ids: Sequence[str], deleted_ids: Sequence[str]) -> tuple[str, int]:
        """Append one change-log entry (after the write it describes); returns (entry id, stamp)."""
        return self._log_entry({"put": list(upserted_ids), "del": list(deleted_ids)}, {})

    def _log_entry(self, body: dict[str, Any], metadata: dict[str, Any]) -> tuple[str, int]:
        """Add an entry stamped now (this process's clock, ns) to the change log; returns (id, stamp)."""
        entry = uuid.uuid4().hex
        stamp = time.time_ns()
        self._call(
            self._change_log().add,
            ids=[entry],
            embeddings=[[1.0]],
            documents=[json.dumps(body)],
            metadatas=[{**metadata, "stamp": stamp}],
        )
        return entry, stamp

    def changes_since(self, stamp: int) -> list[ChangeEntry]:
        """Every change-log entry stamped at or after `stamp`, oldest first. An entry saying that this
        store's collection was rebuilt (`rebuilt`) makes it open the new collection of the same name first
        (`_follow_rebuild`)."""
        page = self._call(
            self._change_log().get, where={"stamp": {"$gte": int(stamp)}}, include=["metadatas"]
        )
        entries = []
        for cid, meta in zip(page["ids"], page["metadatas"], strict=True):
            meta = meta or {}
            if meta.get(REBUILT_FROM_KEY) == self.collection_id:
                self._follow_rebuild()
            pruned = meta.get("pruned_before")
            entries.append(
                ChangeEntry(cid, int(meta.get("stamp", 0)), None if pruned is None else int(pruned))
            )
        return sorted(entries, key=lambda e: (e.stamp, e.entry))

    def prune_changes(self, before: int) -> int:
        """Delete the change-log entries stamped before `before`; returns how many.

        A marker entry, `pruned_before = before`, is added first: a process whose lexical index had not yet
        read entries that old sees the marker among the newer entries and re-reads the store instead of
        trusting the log (`LexicalSync`). A crash between the two leaves a marker and the old entries: the
        next prune deletes them. Costs one `where` on the change log (O(its size) in Chroma) and the
        deletes, once per `rag.lexical.change_log_retention_seconds` / 24 per writer."""
        self._log_entry({"put": [], "del": [], "pruned_before": int(before)}, {"pruned_before": int(before)})
        old = self._call(self._change_log().get, where={"stamp": {"$lt": int(before)}}, include=[])["ids"]
        batch = self._max_batch()
        for start in range(0, len(old), batch):
            self._call(self._change_log().delete, ids=old[start : start + batch])
        return len(old)

    def change_ids(self, entry_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """The chunk ids the entries upserted and deleted (each list without repeats)."""
        if not entry_ids:
            return [], []
        page = self._call(self._change_log().get, ids=list(entry_ids), include=["documents"])
        put: dict[str, None] = {}
        deleted: dict[str, None] = {}
        for entry, doc in zip(page["ids"], page["documents"], strict=True):
            body = self._entry_body(entry, doc)
            put.update(dict.fromkeys(body.get("put", [])))
            deleted.update(dict.fromkeys(body.get("del", [])))
        return list(put), list(deleted)

    def _entry_body(self, entry: str, doc: str | None) -> dict[str, Any]:
        """A change-log entry's body: {"put": [...], "del": [...]}; `ChangeLogError` when it is not that."""
        try:
            body = json.loads(doc or "{}")
        except ValueError as exc:
            body = exc
        if not isinstance(body, dict):
            raise ChangeLogError(
                f"change log '{changes_collection_name(self.name)}' ({self.description}): entry {entry!r} "
                f"is not a JSON object ({str(body)[:80]})"
            )
        return body

    def probe_change_log(self) -> list[str]:
        """Read every change-log entry and parse its body, then write a scratch record (no stamp: no reader
        sees it) and delete it; what failed, or an empty list."""
        name = changes_collection_name(self.name)
        problems = []
        try:
            offset = 0
            while True:
                page = self._call(self._change_log().get, include=["documents"], limit=_PAGE, offset=offset)
                for entry, doc in zip(page["ids"], page["documents"], strict=True):
                    if not entry.startswith(PROBE_ID_PREFIX):
                        self._entry_body(entry, doc)
                if len(page["ids"]) < _PAGE:
                    break
                offset += _PAGE
        except StoreError as exc:
            problems.append(f"change log '{name}' cannot be read: {exc}")
        try:
            self.probe_write(self._change_log())
        except StoreError as exc:
            problems.append(f"change log '{name}' cannot be written: {exc}")
        return problems

    def reset_change_log(self) -> None:
        """Drop the change log and start it anew (a rebuild: every process re-reads the new collection
        anyway). A process still holding the dropped one opens the new one at its next read (`_call`)."""
        name = changes_collection_name(self.name)
        if _exists(self._client, name):
            self._call(self._client.delete_collection, name)
        self._changes = None
        self._change_log()

    # -- side collections: `sieve experiment`'s variant indexes on the same client ----------------------

    def collections(self) -> dict[str, dict[str, Any]]:
        """Every collection of this store's client: {name: its metadata}."""
        out = {}
        for entry in self._call(self._client.list_collections):
            collection = self._call(self._client.get_collection, entry) if isinstance(entry, str) else entry
            out[collection.name] = dict(collection.metadata or {})
        return out

    def side(self, name: str, settings: StoreSettings, metadata: dict[str, Any]) -> ChromaStore:
        """A store over collection `name` on this client, created with `settings`' HNSW configuration and
        `metadata` when missing (an existing one is opened as it is). It holds no lock of its own (this
        store's is held until this store closes) and has no chunk cache; never this store's collection."""
        if name == self.name:
            raise ValueError(f"'{name}' is this store's own collection")
        if _exists(self._client, name):
            collection = self._call(self._client.get_collection, name)
        else:
            collection = self._call(
                self._client.create_collection,
                name,
                configuration=_configuration(settings),
                metadata=metadata,
                embedding_function=None,
            )
        return ChromaStore(self._client, collection, f"{self.description}, collection '{name}'")

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace this collection's metadata with `metadata`."""
        self._call(self._collection.modify, metadata=metadata)

    def drop(self, name: str) -> None:
        """Drop collection `name` of this client (never this store's own)."""
        if name == self.name:
            raise ValueError(f"'{name}' is this store's own collection")
        if _exists(self._client, name):
            self._call(self._client.delete_collection, name)

    def leftover_staging(self) -> str | None:
        """What a stopped rebuild left (its staging collection: how many chunks, complete or not, or why it
        cannot be read), or None when there is none."""
        name = staging_collection_name(self.name)
        if not _exists(self._client, name):
            return None
        try:
            staging = self._client.get_collection(name)
            count = staging.count()
        except Exception as exc:
            return f"a stopped rebuild left the staging collection '{name}', which cannot be read: {exc}"
        return f"a stopped rebuild left the staging collection '{name}' ({count} chunks, not switched to)"

    def iter_ids(self) -> Iterator[str]:
        """Every chunk id, page by page (no text, no vectors)."""
        offset = 0
        while True:
            page = self._call(self._collection.get, include=[], limit=_PAGE * 5, offset=offset)
            yield from page["ids"]
            if len(page["ids"]) < _PAGE * 5:
                return
            offset += _PAGE * 5

    # -- helpers ---------------------------------------------------------------------------------

    def _max_batch(self) -> int:
        return max_batch_size(self._client)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Chroma's `fn(*args, **kwargs)`, its errors wrapped once, here: a server that cannot be reached is
        `StoreUnavailableError` (the heartbeat says that one), any other error `StoreFailedError` naming what
        was done and on which collection, recorded (`failures`) until a success of the same kind on the same
        collection clears it. A call is a write when `fn` is one of Chroma's writes (`_WRITES`), else a
        read.

        An embedded store guards its disk (`space`, app/store/space.py): a write that would leave less than
        the reserve is refused (`InsufficientStorage`) before Chroma is called. A call that fails while the
        disk is that full anyway (another program filled it) marks the store broken: it is not called again
        by this process (after such a failure Chroma's next call, once space is back, never returns and
        holds the interpreter lock), every call raises `StoreFailedError` saying to restart."""
        kind: FailureKind = "write" if getattr(fn, "__name__", "") in _WRITES else "read"
        target = getattr(fn, "__self__", None)
        name = getattr(target, "name", None)
        if not isinstance(name, str):  # a call on the client (opening the change log): the store's own
            target, name = self._collection, self.name
        if self._broken is not None:
            raise StoreFailedError(kind, name, self._broken)
        if kind == "write" and self.space is not None:
            self.space.check()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            if is_connection_error(exc):
                raise StoreUnavailableError(f"{self.description} is unreachable: {exc}") from exc
            if target is self._collection and (current := self._rebuilt_under_us(exc)) is not None:
                self._follow_rebuild(current)  # then the same call on the collection that replaced it
                return self._call(getattr(self._collection, fn.__name__), *args, **kwargs)
            if (
                target is not None
                and target is self._changes
                and isinstance(exc, chromadb.errors.NotFoundError)
            ):
                self._changes = None  # a rebuild made the change log anew: the same call on the new one
                return self._call(getattr(self._change_log(), fn.__name__), *args, **kwargs)
            reason = f"{type(exc).__name__}: {exc}"
            if self._out_of_space(exc):
                self._broken = (
                    f"{reason}, with the disk full ({self.space.least_free() if self.space else ''}); this "
                    "process no longer calls the store (after such a failure Chroma hangs once space is "
                    "back): free space, then restart the server (`sieve store check` afterwards)"
                )
                reason = self._broken
            error = StoreFailedError(kind, name, reason)
            self._record_failure(kind, name, target, str(error))
            raise error from exc
        if self._failures:
            self._clear_failure(kind, name)
        return result

    def _out_of_space(self, exc: BaseException) -> bool:
        """A failed call of an embedded store on a disk below its reserve (or failing for lack of space)."""
        if self.space is None:
            return False
        return storage_exhausted(exc) or self.space.nearly_full()

    # -- failures ----------------------------------------------------------------------------------

    def failures(self) -> list[StoreFailure]:
        """The recorded failures: for each kind of call (read, write) and collection, the failing state
        since its first failure, until a call of that kind on that collection succeeds."""
        with self._failures_lock:
            return sorted(self._failures.values(), key=lambda f: (f.kind, f.collection))

    def _record_failure(self, kind: FailureKind, collection: str, target: Any, message: str) -> None:
        with self._failures_lock:
            known = self._failures.get((kind, collection))
            since = time.time() if known is None else known.since
            self._failures[(kind, collection)] = StoreFailure(kind, collection, since, message)
            self._failing[collection] = target
        if known is None:
            log.error("vector store: %s", message)

    def _clear_failure(self, kind: FailureKind, collection: str) -> None:
        with self._failures_lock:
            cleared = self._failures.pop((kind, collection), None)
        if cleared is not None:
            log.info("vector store: %ss on collection '%s' succeed again", kind, collection)

    def recheck(self, kind: FailureKind) -> None:
        """Try each collection whose `kind` calls are recorded failing once more, cheaply: a count for
        reads, `probe_write` for writes. A success clears the failure; a failure updates it (not raised)."""
        for failure in self.failures():
            if failure.kind != kind:
                continue
            with self._failures_lock:
                target = self._failing.get(failure.collection, self._collection)
            try:
                if kind == "read":
                    self._call(target.count)
                else:
                    self.probe_write(target)
            except StoreError as exc:
                log.debug("vector store recheck (%s): %s", kind, exc)

    def probe_write(self, collection: Any = None) -> None:
        """Write a scratch record to `collection` (the chunk collection by default), then delete it: a unit
        vector of the collection's dimension under an id no chunk can have (`PROBE_ID_PREFIX`), no document,
        no metadata, outside the change log. Raises `StoreFailedError` when the write or the delete fails.
        A collection whose dimension is not known yet (never written) is not probed: a first write would
        fix its dimension."""
        target = self._collection if collection is None else collection
        dimension = self._dimension_of(target)
        if dimension is None:
            return
        vector = np.zeros((1, dimension), dtype=np.float32)
        vector[0, 0] = 1.0
        probe_id = f"{PROBE_ID_PREFIX}{uuid.uuid4().hex}"
        self._call(target.upsert, ids=[probe_id], embeddings=vector)
        self._call(target.delete, ids=[probe_id])

    def _dimension_of(self, collection: Any) -> int | None:
        """The vectors' dimension in `collection`: the embedder's, recorded in its metadata, else Chroma's."""
        recorded = (collection.metadata or {}).get("embedder_dimension")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
        dimension = collection.get_model().dimension
        return int(dimension) if dimension else None


def _unusable(store: ChromaStore, collection: Any) -> str | None:
    """Why `collection` cannot be read and written (a count, a scratch record), or None."""
    try:
        store._call(collection.count)
        store.probe_write(collection)
    except StoreError as exc:
        return str(exc)
    return None


CHROMA_FILE = "chroma.sqlite3"


def chroma_files_problem(path: Path) -> str | None:
    """What `PRAGMA quick_check` finds wrong with an embedded store's `chroma.sqlite3` (opened read-only),
    or None (intact, or no such file yet)."""
    file = path / CHROMA_FILE
    if not file.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
        try:
            rows = [str(r[0]) for r in db.execute("PRAGMA quick_check").fetchall()]
        finally:
            db.close()
    except sqlite3.Error as exc:
        return f"{file}: {type(exc).__name__}: {exc}"
    return None if rows == ["ok"] else f"{file}: PRAGMA quick_check: {'; '.join(rows[:3])}"


def _is_chroma_file(entry: Path) -> bool:
    """`chroma.sqlite3` (and its journal files) and the segment folders (named by a UUID)."""
    if entry.name.startswith(CHROMA_FILE):
        return True
    try:
        uuid.UUID(entry.name)
    except ValueError:
        return False
    return entry.is_dir()


def move_chroma_files_aside(path: Path, now: datetime | None = None) -> Path:
    """Move Chroma's own files out of the embedded store folder `path` into `<path>.chroma-broken-<UTC
    time>` (the record, the lock and the BM25 folder stay), so the next open makes them anew; forget this
    process's Chroma system for `path` (chromadb keeps one per path). The folder they went to."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.chroma-broken-{stamp}")
    aside.mkdir(parents=True, exist_ok=True)
    for entry in sorted(path.iterdir()):
        if _is_chroma_file(entry):
            shutil.move(str(entry), str(aside / entry.name))
    system = SharedSystemClient._identifier_to_system.pop(str(path), None)
    SharedSystemClient._identifier_to_refcount.pop(str(path), None)
    if system is not None:
        try:
            system.stop()
        except Exception as exc:  # its files are gone: whatever it says on the way out changes nothing
            log.debug("stopping the Chroma system of %s: %s", path, exc)
    return aside


def _configuration(settings: StoreSettings) -> dict[str, Any]:
    """The collection configuration every Sieve collection is created with: cosine space and HNSW parameters
    (fixed at creation)."""
    return {
        "hnsw": {
            "space": "cosine",
            "ef_construction": settings.hnsw_construction_ef,
            "ef_search": settings.hnsw_search_ef,
            "max_neighbors": settings.hnsw_m,
        }
    }


def _get_or_create(
    client: Any, settings: StoreSettings, identity: dict[str, Any], check_embedder: bool = True
) -> Any:
    """The configured collection, created when it does not exist (or renamed from a complete staging
    collection whose switch was stopped after the drop: `_finish_switch`). Replicas starting together on an
    empty Chroma server may both find it missing: the one whose create fails because the other's landed
    first opens that one (checking its embedder like any existing collection)."""
    wanted = _Identity(dict(identity)).as_metadata()
    _finish_switch(client, settings.collection)
    if not _exists(client, settings.collection):
        configuration = _configuration(settings)
        log.info("creating Chroma collection '%s' (cosine, %s)", settings.collection, configuration["hnsw"])
        try:
            return client.create_collection(
                settings.collection, configuration=configuration, metadata=wanted, embedding_function=None
            )
        except Exception:
            if not _exists(client, settings.collection):
                raise
            log.info(
                "collection '%s' was created by another process meanwhile: opening it", settings.collection
            )
    collection = client.get_collection(settings.collection)
    mismatch = _embedder_mismatch(settings.collection, collection.metadata, identity)
    if check_embedder and mismatch:
        raise EmbedderMismatchError(
            f"{mismatch}. Rebuild it with `sieve store rebuild` (every recorded document, re-embedded), or "
            f"use another rag.store.collection / rag.store.path."
        )
    return collection


def _embedder_mismatch(name: str, metadata: dict[str, Any] | None, identity: dict[str, Any]) -> str | None:
    """Why collection `name` (with `metadata`) was not built with the embedder of `identity`, or None."""
    wanted = _Identity(dict(identity)).as_metadata()
    stored = {k: v for k, v in (metadata or {}).items() if k.startswith("embedder_")}
    if not stored or stored == wanted:
        return None
    return (
        f"collection '{name}' was built with embedder {stored.get('embedder_name')} (dim "
        f"{stored.get('embedder_dimension')}, checksum {stored.get('embedder_checksum')}), but "
        f"rag.models.embedder is {wanted.get('embedder_name')} (dim {wanted.get('embedder_dimension')}, "
        f"checksum {wanted.get('embedder_checksum')})"
    )


def staging_collection_name(collection: str) -> str:
    """The collection a rebuild of `collection` writes before the switch."""
    return f"{collection}{REBUILD_SUFFIX}"


def _finish_switch(client: Any, collection: str) -> None:
    """Rename the complete staging collection of `collection` to `collection` when `collection` is missing:
    a rebuild was stopped between the drop and the rename. A staging collection not marked complete is left
    alone (a rebuild in progress, or stopped: the configured collection is then still there)."""
    name = staging_collection_name(collection)
    if _exists(client, collection) or not _exists(client, name):
        return
    staging = client.get_collection(name)
    if not (staging.metadata or {}).get(REBUILD_COMPLETE_KEY):
        return
    log.warning(
        "collection '%s' is missing and its rebuild '%s' is complete: finishing the switch a stopped "
        "`sieve store rebuild` left",
        collection,
        name,
    )
    try:
        _rename_staging(staging, collection)
    except Exception:
        if not _exists(client, collection):  # another process finished it meanwhile: nothing to do
            raise


def _rename_staging(staging: Any, name: str) -> None:
    """Rename a complete staging collection to `name`, keeping only the embedder's keys in its metadata."""
    kept = {k: v for k, v in (staging.metadata or {}).items() if k.startswith("embedder_")}
    staging.modify(name=name, metadata=kept or None)


def max_batch_size(client: Any) -> int:
    """The most records one write of `client` takes (Chroma's own limit, at most 5,000; 1,000 when it does
    not say)."""
    try:
        return max(1, min(5000, int(client.get_max_batch_size())))
    except Exception:
        return 1000


def _exists(client: Any, name: str) -> bool:
    return name in {c if isinstance(c, str) else c.name for c in client.list_collections()}


def changes_collection_name(collection: str) -> str:
    return f"{collection}-changes"


def check_not_locked(settings: StoreSettings) -> None:
    """Raise `StoreLockedError` now when another process holds the embedded store at `settings.path`, so a
    caller can fail before the slow part of opening a Sieve (loading the models). It takes nothing: `open`
    takes the lock itself later. A Chroma server is shared by design: nothing to check."""
    if settings.mode != "embedded":
        return
    path = Path(settings.path)
    holder = pidlock.held_by(path / LOCK_FILE)
    if holder is not None:
        raise StoreLockedError(path, holder.pid, holder.address)


def _lock(path: Path) -> int:
    try:
        return pidlock.acquire(path / LOCK_FILE)
    except pidlock.LockHeldError as held:
        raise StoreLockedError(path, held.holder, held.address) from None


def is_connection_error(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in _chain(exc)}
    return bool(
        names
        & {
            "ConnectError",
            "ConnectTimeout",
            "ReadTimeout",
            "RemoteProtocolError",
            "ConnectionError",
            "ConnectionRefusedError",
        }
    ) or "Could not connect" in str(exc)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
