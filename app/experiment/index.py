"""Which index a variant needs, what its collection is called, and whether a stored one can be reused.

A variant's *index settings* are those that change what the collection holds: the chunking (rag.ingest
chunk_size, chunk_overlap, min_chunk_chars), the embedder and its passage prompt (rag.models), and the HNSW
parameters fixed at creation (rag.store hnsw_*). A variant whose index settings equal the base's runs on
the base collection (read only); any other gets a collection of its own, named
`<base collection>-exp-<hash>`, the hash (sha256, first 12 hex digits) of its index settings and of the
document record's content (every document's content hash and every tombstone), so a changed record or
chunking names another collection and an unchanged one finds its own again.

A collection is usable only once its build finished: the build writes `sieve_experiment_complete: true`
into the collection metadata last, so a build stopped anywhere is resumed (its committed chunks are kept;
chunk ids are content hashes) and never read as complete.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.settings import Settings

EXPERIMENT_KEY = "sieve_experiment"  # collection metadata: the index hash of an experiment collection
COMPLETE_KEY = "sieve_experiment_complete"  # ... written true last, once the build is complete
SECONDS_KEY = "sieve_experiment_ingest_seconds"  # ... how long the build took
BYTES_KEY = "sieve_experiment_bytes"  # ... its estimated size (`estimated_bytes`)
NAME_MARK = "-exp-"
FLOAT_BYTES = 4

Decision = Literal["base", "reuse", "resume", "build"]


def index_settings(settings: Settings) -> dict[str, Any]:
    """The settings that change what a collection holds (the module docstring)."""
    rag = settings.rag
    return {
        "chunk_size": rag.ingest.chunk_size,
        "chunk_overlap": rag.ingest.chunk_overlap,
        "min_chunk_chars": rag.ingest.min_chunk_chars,
        "embedder": rag.models.embedder,
        "passage_prompt": rag.models.passage_prompt,
        "hnsw_m": rag.store.hnsw_m,
        "hnsw_construction_ef": rag.store.hnsw_construction_ef,
        "hnsw_search_ef": rag.store.hnsw_search_ef,
    }


def model_settings(settings: Settings) -> dict[str, Any]:
    """The settings that make a variant load an embedder of its own (queries included)."""
    models = settings.rag.models
    return {"embedder": models.embedder, "query": models.query_prompt, "passage": models.passage_prompt}


def record_digest(hashes: Mapping[str, str], tombstones: Mapping[str, object]) -> str:
    """sha256 of the record's content: every (document id, content hash) and every tombstoned id, sorted."""
    body = json.dumps([sorted(hashes.items()), sorted(tombstones)], ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def index_hash(settings: Settings, digest: str) -> str:
    """The first 12 hex digits of sha256 over the index settings and the record digest."""
    body = json.dumps({"index": index_settings(settings), "record": digest}, sort_keys=True)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:12]


def collection_name(base_collection: str, hashed: str) -> str:
    return f"{base_collection}{NAME_MARK}{hashed}"


def is_experiment_collection(base_collection: str, name: str, metadata: Mapping[str, Any] | None) -> bool:
    """Whether collection `name` is one of `base_collection`'s experiment collections (name and mark)."""
    return name.startswith(f"{base_collection}{NAME_MARK}") and EXPERIMENT_KEY in (metadata or {})


def experiment_collections_note(
    base_collection: str, collections: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """`sieve store check`'s line on `base_collection`'s experiment collections (known, never strays):
    how many, how many finished their build, their estimated bytes and how to drop them; None without any."""
    mine = {n: m for n, m in collections.items() if is_experiment_collection(base_collection, n, m)}
    if not mine:
        return None
    complete = sum(1 for m in mine.values() if m.get(COMPLETE_KEY) is True)
    unfinished = len(mine) - complete
    stored = sum(int(m.get(BYTES_KEY) or 0) for m in mine.values())
    resumed = f", {unfinished} unfinished (the next experiment resumes them)" if unfinished else ""
    return (
        f"experiment collections: {len(mine)} ({complete} complete{resumed}; ~{stored:,} bytes estimated), "
        "never served; `sieve experiment --clean` drops them"
    )


def decide(base: Settings, variant: Settings, stored: Mapping[str, Any] | None) -> Decision:
    """What a variant's index takes: `base` (index settings equal the base's: the base collection),
    `reuse` (its collection exists, marked complete), `resume` (it exists, its build stopped) or `build`."""
    if index_settings(variant) == index_settings(base):
        return "base"
    if stored is None:
        return "build"
    return "reuse" if stored.get(COMPLETE_KEY) is True else "resume"


def estimated_bytes(text_bytes: int, metadata_bytes: int, chunks: int, dimension: int) -> int:
    """What a collection stores, estimated: its texts and metadata (UTF-8 JSON) and a float32 vector per
    chunk; the HNSW graph and SQLite pages add to it, so this is a floor, the same for every variant."""
    return text_bytes + metadata_bytes + chunks * dimension * FLOAT_BYTES


@dataclass(frozen=True)
class Budget:
    """The experiment collections' bytes against `rag.experiment.max_store_bytes`."""

    limit: int
    kept: int  # bytes of the experiment collections already stored that this run keeps
    new: int  # estimated bytes of the collections this run builds

    def problem(self) -> str | None:
        total = self.kept + self.new
        if total <= self.limit:
            return None
        return (
            f"the experiment collections would hold about {total:,} bytes ({self.kept:,} stored, "
            f"{self.new:,} to build), over rag.experiment.max_store_bytes {self.limit:,}: drop old ones with "
            "`sieve experiment --clean`, run fewer index variants, or raise the limit"
        )
