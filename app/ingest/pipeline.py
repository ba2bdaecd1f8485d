"""Ingest: files → documents → the document record → chunks with stable ids → embeddings → the vector store.

Every document is put into the document record (app/store/record.py) before any of its chunks is written,
so what was accepted can always be indexed again (`sieve store rebuild`); a document that leaves the index
because it left its file leaves the record first.

A document deleted through the API stays deleted: while its file is unchanged, an ingest of that file leaves
it out (app/ingest/tombstones.py).

Idempotent: a chunk whose id is already stored is neither embedded nor written again (its id is derived
from its content). Everything is read, validated and chunked before anything is written. New chunks are
then embedded and stored in committed batches of about `rag.ingest.commit_chunks`, each holding whole
documents (a document's new chunks are one write, so it is never served with part of them): an ingest
stopped (a shutdown) or killed (kill -9) keeps every batch it committed, and the rerun embeds only the chunks
still missing.
`on_commit(upserted, deleted_ids)` is called after each committed write, so an index kept beside the store
can follow it batch by batch.

A changed document gets its new chunks written first and its stale chunks deleted only at the very end,
so an ingest that stops anywhere leaves extra chunks (old and new versions side by side, until the rerun),
never missing ones. Documents that disappeared from a file that loaded cleanly, or whose file was deleted
from an ingested directory, lose their chunks at that end too. A file with errors keeps whatever it had in
the index: a typo never deletes good content.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from app.ingest.chunker import CHUNKER_VERSION, chunk_document, embedding_text
from app.ingest.loaders import load_paths
from app.ingest.tombstones import without_deleted
from app.ingest.types import Chunk, Document, LoadError
from app.models.embedder import EmbeddingInterrupted
from app.settings import IngestSettings
from app.store import ChromaStore, StoredChunk
from app.store.record import DocumentRecord

log = logging.getLogger(__name__)

PROGRESS_THRESHOLD = 200  # show progress (a bar, or log lines) when embedding at least this many chunks

Progress = Literal["off", "bar", "log"]
CommitHook = Callable[[list[StoredChunk], list[str]], None]


class IngestInterrupted(EmbeddingInterrupted):
    """An ingest was asked to stop; the batches committed before that are stored, the rest is not."""

    def __init__(self, done: int, total: int, committed: int):
        RuntimeError.__init__(
            self,
            f"ingest interrupted after embedding {done} of {total} new chunks; {committed} of them were "
            "stored in committed batches, the rest were not",
        )
        self.done = done
        self.total = total
        self.committed = committed


class PassageEmbedder(Protocol):
    def embed_passages(
        self,
        texts: list[str],
        show_progress: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray: ...


@dataclass
class IngestReport:
    files: int = 0
    documents: int = 0
    chunks: int = 0
    added: int = 0
    updated: int = 0  # metadata rewritten, text and vector unchanged
    unchanged: int = 0
    deleted: int = 0
    errors: list[LoadError] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"ingested files={self.files} documents={self.documents} chunks={self.chunks} "
            f"added={self.added} updated={self.updated} unchanged={self.unchanged} deleted={self.deleted} "
            f"errors={len(self.errors)} in {self.seconds:.1f}s"
        )


class Ingestor:
    def __init__(
        self,
        store: ChromaStore,
        embedder: PassageEmbedder,
        settings: IngestSettings,
        on_commit: CommitHook | None = None,
        record: DocumentRecord | None = None,
    ):
        """`on_commit(upserted_chunks, deleted_ids)`: called after every committed store write (new chunks,
        rewritten metadata, deletions), in the order of the writes. `record`: where accepted documents are
        kept (None: nowhere, for tests and benchmarks of the index alone)."""
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.on_commit = on_commit
        self.record = record

    def ingest(
        self,
        paths: Sequence[str | Path],
        progress: Progress | bool = False,
        should_stop: Callable[[], bool] | None = None,
        log_tombstones: bool = True,
    ) -> IngestReport:
        """Ingest files and directories; removes what disappeared from them (see the module docstring).
        Documents deleted through the API and unchanged in their files since are left out (app/ingest/
        tombstones.py; `log_tombstones`: say which, and which came back)."""
        loaded = load_paths(
            list(paths),
            follow_symlinks=self.settings.follow_symlinks,
            access_defaults=self.settings.access_defaults,
        )
        documents, too_long = self.split_too_long(loaded.documents)
        if self.record is not None:
            documents = without_deleted(documents, self.record, say=log_tombstones)
        return self.ingest_documents(
            documents, [*loaded.errors, *too_long], loaded.files, paths, progress, should_stop=should_stop
        )

    def split_too_long(self, documents: Sequence[Document]) -> tuple[list[Document], list[LoadError]]:
        """(documents within the bounds, one error naming each other one): `max_document_chars`, and for the
        metadata `max_metadata_keys`, `max_metadata_key_chars` and `max_metadata_bytes`."""
        kept: list[Document] = []
        errors: list[LoadError] = []
        for doc in documents:
            problem = bounds_problem(doc, self.settings)
            if problem:
                errors.append(LoadError(doc.origin, doc.line, f"document '{doc.doc_id}' {problem}"))
            else:
                kept.append(doc)
        return kept, errors

    def chunk(self, documents: Sequence[Document]) -> list[Chunk]:
        """The chunks `documents` make with these settings (cheap: no model, no store)."""
        s = self.settings
        return [
            c for d in documents for c in chunk_document(d, s.chunk_size, s.chunk_overlap, s.min_chunk_chars)
        ]

    def ingest_documents(
        self,
        documents: Sequence[Document],
        errors: Sequence[LoadError] = (),
        files: Sequence[str] = (),
        roots: Sequence[str | Path] = (),
        progress: Progress | bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_committed: Callable[[int, int], None] | None = None,
    ) -> IngestReport:
        """Add or replace `documents`; `files`/`roots` (what was read) let deletions be detected.

        New chunks are embedded and stored in batches of `commit_chunks`. `should_stop()` returning True
        raises `IngestInterrupted` at the next slice: the batches committed so far stay stored, stale
        chunks are not deleted yet (a rerun finishes both). `on_progress(done, total)` counts embedded new
        chunks, `on_committed(stored, total)` stored ones. `progress`: "bar" (a terminal, True) or "log"
        (a line every `progress_log_seconds`, for a server) when there are many new chunks."""
        start = time.perf_counter()
        titles = {doc.doc_id: doc.title for doc in documents}
        origins = {doc.doc_id: doc.origin for doc in documents}
        chunks = self.chunk(documents)
        if self.record is not None:
            self.record.put(documents)

        new_ids = {c.chunk_id for c in chunks}
        existing = self._stored_metadata(new_ids, sorted(titles), everywhere=bool(files or roots))
        fresh = [c for c in chunks if c.chunk_id not in existing]
        retagged = self._rewrite_metadata(chunks, existing, origins)
        if fresh:
            self._embed_and_store(fresh, titles, origins, progress, on_progress, should_stop, on_committed)

        stale = _stale_ids(existing, new_ids, documents, errors, files, roots)
        if stale:
            gone = {str(existing[i].get("doc_id")) for i in stale} - set(titles)
            if gone and self.record is not None:
                self.record.delete(sorted(gone))
            self.store.delete(stale)
            self._committed([], stale)
        for error in errors:
            log.error("ingest: %s", error)
        report = IngestReport(
            files=len(files),
            documents=len(documents),
            chunks=len(chunks),
            added=len(fresh),
            unchanged=len(chunks) - len(fresh) - len(retagged),
            updated=len(retagged),
            deleted=len(stale),
            errors=list(errors),
            seconds=time.perf_counter() - start,
        )
        log.info("%s", report.summary())
        return report

    def _stored_metadata(
        self, new_ids: set[str], doc_ids: list[str], everywhere: bool
    ) -> dict[str, dict[str, Any]]:
        """{chunk id: metadata} of the stored chunks that can be stale or unchanged: every chunk when files or
        roots were read (a removed file or document can leave stale chunks anywhere), else (documents only,
        the API) the chunks of these documents and these ids."""
        if everywhere:
            return {c.chunk_id: c.metadata for c in self.store.iter_all(include_text=False)}
        return self.store.metadata_of(sorted(new_ids), doc_ids)

    def _rewrite_metadata(
        self, chunks: list[Chunk], existing: dict[str, dict[str, Any]], origins: dict[str, str]
    ) -> list[Chunk]:
        """Rewrite in place (no re-embedding) the stored metadata of the chunks whose metadata changed, and
        return those chunks. Ids cover what is embedded (title, headings, text), not the other metadata: a
        document retired in its front matter keeps its chunk ids."""
        retagged = [
            (c, {**dict.fromkeys(existing[c.chunk_id]), **meta})  # None deletes a dropped key
            for c in chunks
            if c.chunk_id in existing and existing[c.chunk_id] != (meta := _metadata(c, origins[c.doc_id]))
        ]
        if retagged:
            self.store.update_metadata([c.chunk_id for c, _ in retagged], [meta for _, meta in retagged])
            self._committed(
                [StoredChunk(c.chunk_id, c.text, _metadata(c, origins[c.doc_id])) for c, _ in retagged], []
            )
        return [c for c, _ in retagged]

    def _embed_and_store(
        self,
        fresh: list[Chunk],
        titles: dict[str, str],
        origins: dict[str, str],
        progress: Progress | bool,
        on_progress: Callable[[int, int], None] | None,
        should_stop: Callable[[], bool] | None,
        on_committed: Callable[[int, int], None] | None,
    ) -> None:
        """Embed `fresh` (in document order) batch by batch, committing each batch before the next."""
        total = len(fresh)
        size = self.settings.commit_chunks
        mode = ("bar" if progress else "off") if isinstance(progress, bool) else progress
        shown = _ProgressView(
            mode if total >= PROGRESS_THRESHOLD else "off",
            total,
            [c.doc_id for c in fresh],
            self.settings.progress_log_seconds,
        )
        stored = 0
        try:
            for offset, batch in _whole_documents(fresh, size):
                # Identical texts (a document copied under another id) are embedded once, so they get the
                # very same vector: their scores tie exactly and the documented tie-break (doc id) decides,
                # not float noise from being embedded in different slices.
                texts = [embedding_text(c, titles[c.doc_id]) for c in batch]
                unique = list(dict.fromkeys(texts))
                row_of = {text: i for i, text in enumerate(unique)}

                def embedded(
                    done: int, _: int, offset: int = offset, n: int = len(batch), u: int = len(unique)
                ) -> None:
                    chunks_done = n if done >= u else done * n // u
                    shown.update(offset + chunks_done)
                    if on_progress is not None:
                        on_progress(offset + chunks_done, total)

                try:
                    unique_vectors = self.embedder.embed_passages(
                        unique, on_progress=embedded, should_stop=should_stop
                    )
                except EmbeddingInterrupted as exc:
                    raise IngestInterrupted(
                        offset + exc.done * len(batch) // len(unique), total, stored
                    ) from None
                vectors = unique_vectors[[row_of[text] for text in texts]]
                rows = [StoredChunk(c.chunk_id, c.text, _metadata(c, origins[c.doc_id])) for c in batch]
                self.store.upsert(rows, vectors)
                stored += len(rows)
                self._committed(rows, [])
                if on_committed is not None:
                    on_committed(stored, total)
        finally:
            shown.close()

    def _committed(self, upserted: list[StoredChunk], deleted: list[str]) -> None:
        if self.on_commit is not None:
            self.on_commit(upserted, deleted)


def bounds_problem(doc: Document, s: IngestSettings) -> str | None:
    """Why `doc` is over a bound of `rag.ingest`, or None: `max_document_chars`, and for its metadata
    `max_metadata_keys`, `max_metadata_key_chars` and `max_metadata_bytes` (UTF-8 bytes of keys and values,
    values as text). Every path in applies them: the loaders' files and the write API."""
    if len(doc.text) > s.max_document_chars:
        return (
            f"has {len(doc.text)} characters, more than rag.ingest.max_document_chars={s.max_document_chars}"
        )
    meta = doc.metadata
    if len(meta) > s.max_metadata_keys:
        return f"has {len(meta)} metadata keys, more than rag.ingest.max_metadata_keys={s.max_metadata_keys}"
    long_key = next((k for k in meta if len(k) > s.max_metadata_key_chars), None)
    if long_key is not None:
        return (
            f"has a metadata key of {len(long_key)} characters ({long_key[:40]!r}...), more than "
            f"rag.ingest.max_metadata_key_chars={s.max_metadata_key_chars}"
        )
    size = sum(
        len(str(k).encode("utf-8", "replace")) + len(str(v).encode("utf-8", "replace"))
        for k, v in meta.items()
    )
    if size > s.max_metadata_bytes:
        return f"has {size} bytes of metadata, more than rag.ingest.max_metadata_bytes={s.max_metadata_bytes}"
    return None


class _ProgressView:
    """Ingest progress (documents, chunks, chunks/s, ETA): a tqdm bar, a log line every `every` seconds,
    or nothing."""

    def __init__(self, mode: str, total: int, doc_ids: list[str], every: float):
        self.mode = mode
        self.total = total
        self.every = every
        # documents finished once this many new chunks are embedded: the index of each document's last one
        last: dict[str, int] = {}
        for i, doc_id in enumerate(doc_ids):
            last[doc_id] = i
        self.doc_ends = sorted(last.values())
        self.started = time.monotonic()
        self.logged = self.started
        self.done = 0
        self.bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="ingest", unit="chunk", dynamic_ncols=True)
        elif mode == "log":
            log.info("ingest: embedding %d new chunks of %d documents", total, len(self.doc_ends))

    def documents_done(self, chunks_done: int) -> int:
        return bisect.bisect_left(self.doc_ends, chunks_done)

    def update(self, done: int) -> None:
        step, self.done = done - self.done, done
        docs = f"{self.documents_done(done)}/{len(self.doc_ends)}"
        if self.bar is not None:
            self.bar.set_postfix_str(f"documents {docs}", refresh=False)
            self.bar.update(step)
        elif self.mode == "log" and (now := time.monotonic()) - self.logged >= self.every:
            self.logged = now
            log.info("%s", progress_line(done, self.total, docs, now - self.started))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_line(done: int, total: int, documents: str, seconds: float) -> str:
    """'ingest progress: chunks 1024/17986 (5.7%), documents 310/5183, 12.3 chunks/s, ETA 23m00s'.
    Rate = done / seconds; ETA = (total - done) / rate."""
    rate = done / seconds if seconds > 0 else 0.0
    eta = f"{int((total - done) / rate) // 60}m{int((total - done) / rate) % 60:02d}s" if rate > 0 else "?"
    return (
        f"ingest progress: chunks {done}/{total} ({100 * done / total:.1f}%), documents {documents}, "
        f"{rate:.1f} chunks/s, ETA {eta}"
    )


def _whole_documents(chunks: list[Chunk], size: int) -> Iterator[tuple[int, list[Chunk]]]:
    """(offset, batch) over `chunks` (in document order): consecutive batches of whole documents, each of at
    most `size` chunks unless one document alone has more (it is then a batch of its own)."""
    start = 0
    while start < len(chunks):
        end = min(start + size, len(chunks))
        if end < len(chunks) and chunks[end].doc_id == chunks[end - 1].doc_id:
            # `end` cuts a document: end the batch before it, or after it when it started the batch
            first = end - 1
            while first > start and chunks[first - 1].doc_id == chunks[end - 1].doc_id:
                first -= 1
            if first > start:
                end = first
            else:
                while end < len(chunks) and chunks[end].doc_id == chunks[start].doc_id:
                    end += 1
        yield start, chunks[start:end]
        start = end


def _metadata(chunk: Chunk, origin: str) -> dict[str, Any]:
    meta = {k: v for k, v in chunk.metadata.items() if v is not None}
    meta.update({"doc_id": chunk.doc_id, "origin": origin, "chunker": CHUNKER_VERSION})
    return meta


def _stale_ids(
    existing: dict[str, dict[str, Any]],
    new_ids: set[str],
    documents: Sequence[Any],
    errors: Sequence[LoadError],
    files_read: Sequence[str],
    roots: Sequence[str | Path],
) -> list[str]:
    loaded_docs = {d.doc_id for d in documents}
    dirty_files = {_norm(e.path) for e in errors}
    clean_files = {_norm(f) for f in files_read} - dirty_files
    root_dirs = [Path(r).resolve() for r in roots if Path(r).is_dir()]
    stale = []
    gone_by_origin: dict[str, bool] = {}  # origin -> its chunks are stale (a file's chunks share one origin)
    for chunk_id, meta in existing.items():
        doc_id = meta.get("doc_id")
        origin = str(meta.get("origin", ""))
        if doc_id in loaded_docs:
            if chunk_id not in new_ids:
                stale.append(chunk_id)  # an older version of a document we just loaded
            continue
        if not origin or not (clean_files or root_dirs):
            continue
        gone = gone_by_origin.get(origin)
        if gone is None:
            # the document was removed from a file that loaded cleanly, or its file was deleted from an
            # ingested directory (a file turned into a bad link is reported as an error instead, and keeps
            # its chunks)
            gone = gone_by_origin[origin] = _norm(origin) in clean_files or (
                not os.path.lexists(origin) and _under(Path(_norm(origin)), root_dirs)
            )
        if gone:
            stale.append(chunk_id)
    return stale


def _norm(path: str) -> str:
    return os.path.realpath(path)  # unlike Path.resolve() on 3.11, never raises on a symlink loop


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)
