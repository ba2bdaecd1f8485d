"""A delete through the API stays deleted: the documents an ingest loads from files are held against the
tombstones of the document record (app/store/record.py) before anything is kept or indexed.

A loaded document whose tombstone holds its content hash (its file unchanged since the delete) is left out:
it is neither put into the record nor indexed, and a chunk of it still in the index is stale like that of any
document gone from a file that loaded cleanly. A document whose content changed since the delete is kept:
putting it into the record lifts its tombstone, and the log says so. The content hash is the record's own
(`content_hash`: title, text and metadata), so a file of many documents (JSONL) brings back only the
deleted documents that changed in it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.ingest.check import first_ids
from app.ingest.types import Document
from app.store.record import DocumentRecord, content_hash

log = logging.getLogger(__name__)


def without_deleted(
    documents: Sequence[Document], record: DocumentRecord, say: bool = True
) -> list[Document]:
    """`documents` less those deleted through the API and unchanged since, in their order. `say`: log the
    ones left out, in one line, and each one whose tombstone its changed content lifts."""
    stones = record.tombstones([doc.doc_id for doc in documents]) if documents else {}
    if not stones:
        return list(documents)
    kept: list[Document] = []
    left_out: list[str] = []
    for doc in documents:
        stone = stones.get(doc.doc_id)
        if stone is None:
            kept.append(doc)
        elif content_hash(doc) == stone.content_hash:
            left_out.append(f"{doc.doc_id} ({doc.origin or stone.origin})")
        else:
            kept.append(doc)
            if say:
                log.info(
                    "ingest: '%s' changed in %s since it was deleted through the API at %s: its tombstone "
                    "is lifted and the new version indexed",
                    doc.doc_id,
                    doc.origin or "its file",
                    stone.deleted_at,
                )
    if left_out and say:
        log.info(
            "ingest: %d document(s) deleted through the API left out, unchanged in their files since "
            "(tombstones in the document record): %s. A change to the document in its file, or writing it "
            "again (POST /api/documents), brings it back",
            len(left_out),
            first_ids(sorted(left_out)),
        )
    return kept
