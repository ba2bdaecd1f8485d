"""Ingest: files → documents → chunks with stable ids → embeddings → the vector store.

Idempotent: a chunk whose id is already stored is neither embedded nor written again (its id is derived
from its content). A changed document gets its new chunks written first and its stale chunks deleted
after, so a crash in between leaves extra chunks, never missing ones. Documents that disappeared from a
file that loaded cleanly, or whose file was deleted from an ingested directory, lose their chunks. A file
with errors keeps whatever it had in the index: a typo never deletes good content. Every new chunk is
embedded before anything is written, so an ingest stopped during the embedding (a shutdown) leaves the
store as it was.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.ingest.chunker import CHUNKER_VERSION, chunk_document, embedding_text
from app.ingest.loaders import load_paths
from app.ingest.types import Chunk, Document, LoadError
from app.settings import IngestSettings
from app.store import ChromaStore, StoredChunk

log = logging.getLogger(__name__)

PROGRESS_THRESHOLD = 200  # show a progress bar when embedding at least this many chunks


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
    def __init__(self, store: ChromaStore, embedder: PassageEmbedder, settings: IngestSettings):
        self.store = store
        self.embedder = embedder
        self.settings = settings

    def ingest(
        self,
        paths: Sequence[str | Path],
        progress: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> IngestReport:
        """Ingest files and directories; removes what disappeared from them (see the module docstring)."""
        loaded = load_paths(list(paths), follow_symlinks=self.settings.follow_symlinks)
        documents, too_long = self.split_too_long(loaded.documents)
        return self.ingest_documents(
            documents, [*loaded.errors, *too_long], loaded.files, paths, progress, should_stop=should_stop
        )

    def split_too_long(self, documents: Sequence[Document]) -> tuple[list[Document], list[LoadError]]:
        """(documents within `max_document_chars`, one error naming each longer one)."""
        limit = self.settings.max_document_chars
        kept: list[Document] = []
        errors: list[LoadError] = []
        for doc in documents:
            if len(doc.text) > limit:
                errors.append(
                    LoadError(
                        doc.origin,
                        doc.line,
                        f"document '{doc.doc_id}' has {len(doc.text)} characters, more than "
                        f"rag.ingest.max_document_chars={limit}",
                    )
                )
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
        progress: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> IngestReport:
        """Add or replace `documents`; `files`/`roots` (what was read) let deletions be detected.

        Nothing is written until every new chunk is embedded: `should_stop()` returning True during the
        embedding raises `EmbeddingInterrupted` with the store untouched. `on_progress(done, total)` counts
        embedded chunks."""
        start = time.perf_counter()
        titles = {doc.doc_id: doc.title for doc in documents}
        origins = {doc.doc_id: doc.origin for doc in documents}
        chunks = self.chunk(documents)

        existing = {c.chunk_id: c.metadata for c in self.store.iter_all(include_text=False)}
        new_ids = {c.chunk_id for c in chunks}
        fresh = [c for c in chunks if c.chunk_id not in existing]
        # Ids cover what is embedded (title, headings, text), not the other metadata: a document retired
        # in its front matter keeps its chunk ids, so its stored metadata is rewritten in place (no
        # re-embedding).
        retagged = [
            (c.chunk_id, {**dict.fromkeys(existing[c.chunk_id]), **meta})  # None deletes a dropped key
            for c in chunks
            if c.chunk_id in existing and existing[c.chunk_id] != (meta := _metadata(c, origins[c.doc_id]))
        ]
        vectors = None
        if fresh:
            texts = [embedding_text(c, titles[c.doc_id]) for c in fresh]
            show = progress and len(fresh) >= PROGRESS_THRESHOLD
            vectors = self.embedder.embed_passages(
                texts, show_progress=show, on_progress=on_progress, should_stop=should_stop
            )
        if retagged:
            self.store.update_metadata([cid for cid, _ in retagged], [meta for _, meta in retagged])
        if fresh:
            stored = [StoredChunk(c.chunk_id, c.text, _metadata(c, origins[c.doc_id])) for c in fresh]
            self.store.upsert(stored, vectors)

        stale = _stale_ids(existing, new_ids, documents, errors, files, roots)
        if stale:
            self.store.delete(stale)
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
    for chunk_id, meta in existing.items():
        doc_id = meta.get("doc_id")
        origin = str(meta.get("origin", ""))
        if doc_id in loaded_docs:
            if chunk_id not in new_ids:
                stale.append(chunk_id)  # an older version of a document we just loaded
        elif origin and _norm(origin) in clean_files:
            stale.append(chunk_id)  # the document was removed from a file that loaded cleanly
        elif origin and not os.path.lexists(origin) and _under(Path(_norm(origin)), root_dirs):
            # its file was deleted from an ingested directory (a file turned into a bad link is reported
            # as an error instead, and keeps its chunks)
            stale.append(chunk_id)
    return stale


def _norm(path: str) -> str:
    return os.path.realpath(path)  # unlike Path.resolve() on 3.11, never raises on a symlink loop


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)
