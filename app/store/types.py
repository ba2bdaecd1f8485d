"""The store's value types (apart from app/store/chroma.py, so the chunk cache can use it too)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from app.access.scope import Principal, chunk_label, label_matches

# A chunk's metadata as the store holds it: scalar values by key.
ChunkMetadata = dict[str, str | int | float | bool | None]


@dataclass(frozen=True)
class Document:
    """A document as Sieve accepts it (from a file or the API) and keeps it in the document record
    (app/store/record.py); the chunks of the index are made from it (app/ingest/chunker.py)."""

    doc_id: str
    text: str
    title: str = ""
    # source, knowledge, status, effectiveFrom, effectiveTo, ... (scalar values only)
    metadata: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # the file it came from, as given to the loader ("api" for the write API)
    line: int | None = None  # 1-based line in `origin` (JSONL), None for whole-file documents


@dataclass
class StoredChunk:
    chunk_id: str
    text: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None = None
    similarity: float | None = None  # cosine similarity to the query (1 - cosine distance)
    # the vector as float64 scaled to length 1 (bit for bit `unit_vector`, app/retrieval/types.py), read-only,
    # computed once when the chunk is cached, so a candidate made of it needs no unit vector of its own;
    # None = not computed, or of no length or not finite
    unit: np.ndarray | None = None


def knowledge_tag_of(metadata: dict[str, Any]) -> str | None:
    """A chunk's knowledge tag: its `knowledge` metadata as a string, None when absent or empty."""
    tag = metadata.get("knowledge")
    return str(tag) if tag not in (None, "") else None


def index_label_of(metadata: dict[str, Any]) -> str | None:
    """What the lexical index and the exact search keep of a chunk to filter by: its knowledge tag, with
    its tenant and access list when it has them (`app.access.scope.chunk_label`)."""
    return chunk_label(knowledge_tag_of(metadata), metadata)


# the most (tag, scope) masks a label index keeps; past it they are all dropped and made again as asked
MAX_LABEL_MASKS = 4096


def label_mask(
    cache: dict[tuple[object, ...], np.ndarray],
    labels: Sequence[str],
    tag: str | None,
    principal: Principal | None,
    tail: Sequence[bool],
) -> np.ndarray:
    """Per label number of `labels`, whether a chunk so labelled has `tag` (any, for None) and `principal`
    may read it (`label_matches`), then `tail`'s answers, for the label numbers counted from the end (no
    label, a free row), so that indexing the mask with any row's label number answers for that row.

    Kept in `cache` by (tag, the principal's key): labels are only ever added, so a mask made before is
    extended by the new labels, never recomputed."""
    key = (tag, None if principal is None else principal.key)
    known = cache.get(key)
    if known is not None and len(known) == len(labels) + len(tail):
        return known
    done = 0 if known is None else len(known) - len(tail)
    head = known[:done] if known is not None else np.zeros(0, dtype=bool)
    fresh = [label_matches(label, tag, principal) for label in labels[done:]]
    mask = np.concatenate([head, np.asarray(fresh, dtype=bool), np.asarray(tail, dtype=bool)])
    if len(cache) >= MAX_LABEL_MASKS:
        cache.clear()
    cache[key] = mask
    return mask


def unit_of(vector: np.ndarray) -> np.ndarray | None:
    """`vector` / `vector_norm(vector)` in float64, read-only (bit for bit `unit_vector`); None when it
    has no length or is not finite."""
    v = np.asarray(vector, dtype=float).ravel()
    length = vector_norm(v)
    if not (length > 0 and math.isfinite(length)):  # then every |v_i| <= length: the unit is finite
        return None
    unit = v / length
    unit.flags.writeable = False
    return unit


def vector_norm(vector: np.ndarray) -> float:
    """sqrt(v · v) of `vector` as float64: the `ddot` of the 1-D float64 vector with itself that
    `np.linalg.norm` takes, and IEEE sqrt (so v / vector_norm(v) is bit for bit `unit_vector(v)`)."""
    v = np.asarray(vector, dtype=float).ravel()
    return float(np.sqrt(v.dot(v)))


class ChangeEntry(NamedTuple):
    """One entry of the store's change log: its id, its stamp (the writer's clock, ns), and for a prune
    marker the stamp before which entries were deleted (`ChromaStore.prune_changes`), else None."""

    entry: str
    stamp: int
    pruned_before: int | None = None
