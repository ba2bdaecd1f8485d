"""`sieve store rebuild --record-from-index`: the last way back for a damaged document record with no backup.

The record is the truth and the index is derived from it, but the index keeps most of each document: every
chunk's text (the stripped pieces of its sections, overlapping by at most `rag.ingest.chunk_overlap`
characters), its heading path, the document's title, metadata and origin, and `doc_sha256`, the hash of the
whole normalised text. What it does not keep is the exact whitespace between pieces and the heading lines'
exact form. So, per document:

1. what the damaged record still reads is kept as it is (exact): first every document it can list, then,
   for each document of the index not among them, a read of that id alone;
2. the rest is rebuilt from its chunks (`document_from_chunks`): each section's pieces in position order,
   the overlap of consecutive pieces removed, sections separated by their headings as Markdown lines. Its
   `doc_sha256` then says whether the text came back exactly (whitespace aside) or approximately.

The tombstones are kept when the damaged record still reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.ingest.chunker import CHAR_END, CHAR_START, DOC_SHA256, HEADING_PATH_SEPARATOR, is_markdown
from app.ingest.ids import text_sha256
from app.ingest.types import Document
from app.store import StoredChunk
from app.store.chroma import PROBE_ID_PREFIX
from app.store.record import Tombstone

log = logging.getLogger(__name__)

# chunk metadata keys that the chunker and the ingest pipeline add: not the document's own metadata
CHUNK_KEYS = frozenset(
    {"doc_id", "title", "position", "heading_path", DOC_SHA256, CHAR_START, CHAR_END, "origin", "chunker"}
)


@dataclass
class RecoveredRecord:
    """What the record is made of again: `documents`, `tombstones`, and how each document came back: read
    from the damaged record (`salvaged`), rebuilt from its chunks with its text hash matching (`exact`), or
    not matching (`approximate`, ids sorted)."""

    documents: list[Document] = field(default_factory=list)
    tombstones: list[Tombstone] = field(default_factory=list)
    salvaged: int = 0
    exact: int = 0
    approximate: list[str] = field(default_factory=list)

    def summary(self) -> str:
        shown = ", ".join(self.approximate[:5]) + (" ..." if len(self.approximate) > 5 else "")
        rough = f" ({shown})" if self.approximate else ""
        return (
            f"record rebuilt: {len(self.documents)} documents: {self.salvaged} read from the damaged record, "
            f"{self.exact} rebuilt from their chunks exactly (text hash matches), {len(self.approximate)} "
            f"approximately (whitespace or heading lines may differ){rough}; {len(self.tombstones)} "
            "tombstone(s) kept"
        )


def merge_pieces(pieces: Sequence[str], overlap: int) -> str:
    """One section's text from its pieces in order: each piece's longest prefix (at most `overlap`
    characters) that ends the text so far is the overlap and is dropped; pieces with none are joined by a
    blank line (a cut at a paragraph break)."""
    text = ""
    for piece in pieces:
        if not text:
            text = piece
            continue
        k = next(
            (k for k in range(min(overlap, len(text), len(piece)), 0, -1) if text.endswith(piece[:k])), 0
        )
        text = text + piece[k:] if k else f"{text}\n\n{piece}"
    return text


def document_from_chunks(chunks: Iterable[StoredChunk], overlap: int) -> tuple[Document, bool]:
    """A document made again from its stored chunks (one document's): title, origin and metadata from the
    first chunk's metadata, the text from `merge_pieces` per section, headings as Markdown lines for a
    Markdown document. (the document, whether its text hash matches the chunks' `doc_sha256`)."""
    ordered = sorted(chunks, key=lambda c: int(c.metadata.get("position", 0)))
    first = ordered[0].metadata
    doc_id = str(first.get("doc_id", ""))
    origin = str(first.get("origin", ""))
    sections: list[tuple[tuple[str, ...], list[str]]] = []
    for chunk in ordered:
        heading = str(chunk.metadata.get("heading_path", ""))
        path = tuple(p for p in heading.split(HEADING_PATH_SEPARATOR) if p)
        if sections and sections[-1][0] == path:
            sections[-1][1].append(chunk.text)
        else:
            sections.append((path, [chunk.text]))
    markdown = is_markdown(Document(doc_id=doc_id, text="", origin=origin))
    parts: list[str] = []
    previous: tuple[str, ...] = ()
    for path, pieces in sections:
        if markdown:
            shared = next((i for i, (a, b) in enumerate(zip(previous, path, strict=False)) if a != b), None)
            start = min(len(previous), len(path)) if shared is None else shared
            parts += [f"{'#' * (level + 1)} {path[level]}" for level in range(start, len(path))]
            previous = path
        parts.append(merge_pieces(pieces, overlap))
    text = "\n\n".join(parts)
    metadata = {k: v for k, v in first.items() if k not in CHUNK_KEYS}
    document = Document(
        doc_id=doc_id, text=text, title=str(first.get("title", "")), metadata=metadata, origin=origin
    )
    return document, text_sha256(text) == first.get(DOC_SHA256)


class SalvageSource(Protocol):
    """What a damaged record may still read (`DocumentRecord`'s reads); any of them may raise."""

    def iter_documents(self) -> Iterator[Document]: ...

    def get(self, doc_ids: Sequence[str]) -> list[Document]: ...

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]: ...


def recover_record(
    chunks: Iterable[StoredChunk], damaged: SalvageSource | None, overlap: int
) -> RecoveredRecord:
    """The record made again from `chunks` (every chunk of the collection) and what `damaged` (the damaged
    record, None when it cannot be opened at all) still reads (the module docstring's steps)."""
    found = RecoveredRecord()
    kept: dict[str, Document] = {}
    if damaged is not None:
        try:
            for doc in damaged.iter_documents():
                kept[doc.doc_id] = doc
        except Exception as exc:  # damaged pages: what was read before them stays
            log.warning("the damaged record stopped reading after %d documents: %s", len(kept), exc)
        try:
            found.tombstones = list(damaged.tombstones().values())
        except Exception as exc:
            log.warning("the damaged record's tombstones cannot be read: %s", exc)
    by_doc: dict[str, list[StoredChunk]] = {}
    for chunk in chunks:
        doc_id = chunk.metadata.get("doc_id")
        if doc_id is not None and not chunk.chunk_id.startswith(PROBE_ID_PREFIX):
            by_doc.setdefault(str(doc_id), []).append(chunk)
    tombstoned = {t.doc_id for t in found.tombstones}
    for doc_id in sorted(by_doc):
        if doc_id in kept or doc_id in tombstoned:
            continue
        if damaged is not None:
            try:
                read = damaged.get([doc_id])
            except Exception:  # this document's page is damaged: its chunks tell it
                read = []
            if read:
                kept[doc_id] = read[0]
                continue
        document, exact = document_from_chunks(by_doc[doc_id], overlap)
        kept[doc_id] = document
        if exact:
            found.exact += 1
        else:
            found.approximate.append(doc_id)
    found.salvaged = len(kept) - found.exact - len(found.approximate)
    found.documents = [kept[d] for d in sorted(kept)]
    return found
