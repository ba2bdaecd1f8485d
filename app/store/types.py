"""The store's value types (apart from app/store/chroma.py, so the chunk cache can use it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


@dataclass
class StoredChunk:
    chunk_id: str
    text: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None = None
    similarity: float | None = None  # cosine similarity to the query (1 - cosine distance)
    # sqrt(v · v) of the vector in float64 (`vector_norm`), computed once when the chunk is cached, so the
    # candidate generator's unit vectors need no norm of their own; None = not computed
    norm: float | None = None


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
