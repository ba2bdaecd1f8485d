"""`sieve store rebuild`: every recorded document chunked and embedded again, under the current settings,
into a staging collection; the switch only once it holds exactly what the record makes.

1. The configured collection is read for documents the record lacks (written before the record existed):
   with any, the rebuild refuses (`UnrecordedDocumentsError`) unless they may be dropped. Documents deleted
   through the API are not among them: the record keeps their tombstones, and they are not rebuilt. A
   collection that cannot be read at all (a store broken under Sieve's feet) cannot be asked: the rebuild
   goes on, and says so.
2. The record's documents are ingested into the staging collection (`ChromaStore.staging`) by the ingest
   pipeline, in committed batches with its progress view: chunk ids are content hashes, so a rebuild stopped
   anywhere and run again embeds only what the staging collection still lacks.
3. The staging collection is compared with the record the way `sieve store check` compares (app/ingest/
   check.py): extra chunks (documents deleted meanwhile, an older run's chunking) are deleted, documents
   written meanwhile are ingested, until the two match.
4. `ChromaStore.switch_to`: staging marked complete, the old collection dropped, the staging one renamed.
   Until then the old collection serves; nothing recorded is ever dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from app.ingest.check import (
    IndexComparison,
    RecordReader,
    compare,
    expected_chunk_ids,
    first_ids,
    stored_chunk_ids,
)
from app.ingest.pipeline import Ingestor, PassageEmbedder, Progress
from app.ingest.types import Document
from app.settings import IngestSettings, StoreSettings
from app.store import ChromaStore

log = logging.getLogger(__name__)

MAX_PASSES = 5  # catch-up passes for documents written while the staging collection was built


class UnrecordedDocumentsError(RuntimeError):
    """The collection holds documents the record lacks: a rebuild from the record would drop them."""

    def __init__(self, doc_ids: list[str]):
        shown = first_ids(doc_ids)
        super().__init__(
            f"the collection holds {len(doc_ids)} document(s) the document record lacks (written before the "
            f"record existed): {shown}. A rebuild from the record would drop them: send them again "
            "(POST /api/documents or `sieve ingest PATH`) so the record keeps them, or run "
            "`sieve store rebuild --drop-unrecorded` to drop them"
        )
        self.doc_ids = doc_ids


@dataclass
class RebuildReport:
    documents: int = 0
    chunks: int = 0
    embedded: int = 0  # chunks embedded by this run (a resumed run embeds only what was missing)
    deleted: int = 0  # staging chunks deleted (documents deleted meanwhile, an older run's chunking)
    dropped_unrecorded: list[str] = field(default_factory=list)
    unreadable: str | None = None  # why the old collection could not be read for unrecorded documents
    previous_id: str = ""
    collection_id: str = ""
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"rebuilt: {self.documents} documents, {self.chunks} chunks ({self.embedded} embedded by this "
            f"run, {self.deleted} stale deleted) in {self.seconds:.1f}s; collection id {self.previous_id} -> "
            f"{self.collection_id}"
        )


def unrecorded_documents(live: ChromaStore, recorded: set[str]) -> list[str]:
    """The document ids the collection holds that are not in `recorded`, sorted (reads every chunk's
    metadata; raises what the store raises when the collection cannot be read)."""
    stored, _ = stored_chunk_ids(live.iter_all(include_text=False))
    return sorted(d for d in stored if d not in recorded)


def check_unrecorded(live: ChromaStore, recorded: set[str], drop: bool, report: RebuildReport) -> None:
    """Refuse (`UnrecordedDocumentsError`) when the live collection holds documents the record lacks, unless
    `drop`; a collection that cannot be read is noted in `report.unreadable` and logged."""
    try:
        unrecorded = unrecorded_documents(live, recorded)
    except Exception as exc:  # a broken collection: what it holds cannot be known, the record is the truth
        report.unreadable = f"{type(exc).__name__}: {exc}"
        log.warning(
            "the collection '%s' cannot be read (%s): documents it may hold beyond the record cannot be "
            "counted; rebuilding from the record",
            live.name,
            report.unreadable,
        )
        return
    if unrecorded and not drop:
        raise UnrecordedDocumentsError(unrecorded)
    if unrecorded:
        log.warning("dropping %d document(s) the record lacks (--drop-unrecorded)", len(unrecorded))
    report.dropped_unrecorded = unrecorded


def build_staging(
    staging: ChromaStore,
    record: RecordReader,
    embedder: PassageEmbedder,
    settings: IngestSettings,
    progress: Progress,
    report: RebuildReport,
) -> None:
    """Ingest every recorded document into `staging` and bring it to exactly what the record makes
    (`_converge`); counts go to `report`."""
    documents = {doc.doc_id: doc for doc in record.iter_documents()}
    ingestor = Ingestor(staging, embedder, settings)
    log.info("rebuild: %d recorded documents into '%s'", len(documents), staging.name)
    if documents:
        report.embedded += ingestor.ingest_documents(list(documents.values()), progress=progress).added
    _converge(staging, record, ingestor, settings, report)


def _converge(
    staging: ChromaStore,
    record: RecordReader,
    ingestor: Ingestor,
    settings: IngestSettings,
    report: RebuildReport,
) -> None:
    """Compare `staging` with the record, read again at each pass, until they match: delete chunks no
    recorded document makes, and ingest again the documents whose chunks differ or that were written since
    they were read."""
    for _ in range(MAX_PASSES):
        documents = {doc.doc_id: doc for doc in record.iter_documents()}
        comparison, stray = _staging_against(staging, documents, settings)
        if stray:
            staging.delete(stray)
            report.deleted += len(stray)
        redo = comparison.missing + comparison.outdated
        if not redo:
            report.documents = comparison.recorded
            report.chunks = comparison.expected_chunks
            return
        log.info("rebuild: %d document(s) written meanwhile or incomplete: indexing them", len(redo))
        report.embedded += ingestor.ingest_documents(record.get(redo), progress="log").added
    raise RuntimeError(
        f"the staging collection '{staging.name}' still differs from the record after {MAX_PASSES} passes "
        "(documents are being written faster than the rebuild follows): run `sieve store rebuild` again"
    )


def _staging_against(
    staging: ChromaStore, documents: dict[str, Document], settings: IngestSettings
) -> tuple[IndexComparison, list[str]]:
    """(`staging` compared with `documents`, the ids of its chunks that no document makes)."""
    expected = expected_chunk_ids(documents.values(), settings)
    chunks = list(staging.iter_all(include_text=False))
    stored, _ = stored_chunk_ids(chunks)
    wanted = frozenset().union(*expected.values()) if expected else frozenset()
    stray = [c.chunk_id for c in chunks if c.chunk_id not in wanted]
    kept = {d: ids & wanted for d, ids in stored.items() if ids & wanted}
    return compare(expected, kept), stray


def rebuild(
    live: ChromaStore,
    record: RecordReader,
    embedder: PassageEmbedder,
    identity: dict[str, object],
    store_settings: StoreSettings,
    settings: IngestSettings,
    progress: Progress,
    drop_unrecorded: bool = False,
) -> RebuildReport:
    """Rebuild `live` from `record` (the module docstring's steps); returns what was done."""
    started = time.perf_counter()
    report = RebuildReport(previous_id=live.collection_id)
    deleted = record.tombstones()
    # a document deleted through the API is known to the record: chunks of it left behind are dropped
    check_unrecorded(live, set(record.hashes()) | set(deleted), drop_unrecorded, report)
    if deleted:
        log.info(
            "rebuild: %d document(s) deleted through the API stay deleted (tombstones in the document "
            "record): %s",
            len(deleted),
            first_ids(sorted(deleted)),
        )
    staging = live.staging(store_settings, dict(identity))
    build_staging(staging, record, embedder, settings, progress, report)
    live.switch_to(staging)
    live.rebuilt(report.previous_id)
    report.collection_id = live.collection_id
    report.seconds = time.perf_counter() - started
    log.info("%s", report.summary())
    return report
