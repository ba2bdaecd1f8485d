"""Building a variant's collection from the document record, as `sieve store rebuild` builds its staging
collection (app/ingest/rebuild.py `build_staging`: every recorded document, API-written ones included,
chunked with the variant's settings and converged on the record), into a side collection of the same store
that is never switched in. The completion mark (app/experiment/index.py) is written last."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from app.experiment.index import BYTES_KEY, COMPLETE_KEY, EXPERIMENT_KEY, SECONDS_KEY, estimated_bytes
from app.ingest.check import RecordReader
from app.ingest.pipeline import PassageEmbedder, Progress
from app.ingest.rebuild import RebuildReport, build_staging
from app.settings import Settings
from app.store import ChromaStore

log = logging.getLogger("sieve.experiment")


@dataclass(frozen=True)
class Built:
    """A variant collection as the run found or left it: its store, how long its build took (the one that
    completed it, when reused), its chunks and estimated bytes, and the chunks this run embedded."""

    store: ChromaStore
    seconds: float
    chunks: int
    bytes: int
    embedded: int = 0


def collection_bytes(store: ChromaStore, dimension: int) -> tuple[int, int]:
    """(estimated bytes, chunks) of `store`'s collection (`index.estimated_bytes`), read chunk by chunk."""
    text = meta = chunks = 0
    for chunk in store.iter_all(include_text=True):
        text += len(chunk.text.encode("utf-8"))
        meta += len(json.dumps(chunk.metadata, ensure_ascii=False).encode("utf-8"))
        chunks += 1
    return estimated_bytes(text, meta, chunks, dimension), chunks


def identity_metadata(identity: dict[str, Any], hashed: str) -> dict[str, Any]:
    """A variant collection's metadata before its build completes: the embedder (as every Sieve collection
    records it) and the index hash, marked incomplete."""
    return {**{f"embedder_{k}": v for k, v in identity.items()}, EXPERIMENT_KEY: hashed, COMPLETE_KEY: False}


def open_variant(
    base: ChromaStore, name: str, settings: Settings, identity: dict[str, Any], hashed: str
) -> tuple[ChromaStore, bool]:
    """(the variant collection `name`, created when missing; whether it was made anew because the one
    stored was built with another embedder (same name: an embedder folder whose weights changed), which is
    dropped first)."""
    store = base.side(name, settings.rag.store, identity_metadata(identity, hashed))
    mismatch = store.embedder_mismatch(identity)
    if not mismatch:
        return store, False
    log.warning("experiment: %s: dropping it", mismatch)
    base.drop(name)
    return base.side(name, settings.rag.store, identity_metadata(identity, hashed)), True


def build(
    store: ChromaStore,
    record: RecordReader,
    embedder: PassageEmbedder,
    settings: Settings,
    identity: dict[str, Any],
    hashed: str,
    progress: Progress,
) -> Built:
    """Build (or resume) `store` from `record` under `settings`' chunking, then mark it complete, last."""
    started = time.perf_counter()
    store.set_metadata(identity_metadata(identity, hashed))
    report = RebuildReport()
    build_staging(store, record, embedder, settings.rag.ingest, progress, report)
    seconds = time.perf_counter() - started
    size, chunks = collection_bytes(store, int(identity.get("dimension", 0)))
    store.set_metadata(
        {**identity_metadata(identity, hashed), COMPLETE_KEY: True, SECONDS_KEY: seconds, BYTES_KEY: size}
    )
    return Built(store, seconds, chunks, size, report.embedded)


def reused(store: ChromaStore) -> Built:
    """A complete variant collection as stored: its build's seconds and bytes from its metadata."""
    metadata = store.metadata()
    return Built(store, float(metadata.get(SECONDS_KEY, 0.0)), store.count(), int(metadata.get(BYTES_KEY, 0)))
