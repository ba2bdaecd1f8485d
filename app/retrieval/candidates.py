"""Candidate generation: the dense top-N from the vector store, plus (hybrid) the BM25 top-N.

A query with a knowledge tag gets both top-Ns among the chunks with that tag, taken before the cut: the
index's `knowledge_tag` for BM25; for the dense search either Chroma's `where` or, for a tag common enough,
an unfiltered search for more chunks filtered here by the index's tags (see `CandidateGenerator._dense`).

`candidate_k: 0` with `hybrid: true` makes the candidates lexical only (BM25 top-N).

Every candidate gets a dense score, including those only BM25 found (their stored vector is compared with
the query vector), so the similarity threshold and the fusion see one consistent cosine for all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from app.retrieval.blas import one_thread
from app.retrieval.types import SCORE_DENSE, Candidate, knowledge_tag_of, unit_rows, unit_vector
from app.settings import RetrievalSettings
from app.store import ChromaStore, StoredChunk


class LexicalIndex(Protocol):
    def top(self, query: str, n: int, knowledge_tag: str | None = None) -> list[tuple[str, float]]: ...

    def scores(self, query: str, ids: list[str]) -> dict[str, float]: ...


class TaggedIndex(Protocol):
    """What the tag post-filter asks of the lexical index (`Bm25Index` has it; a fake may not)."""

    def __len__(self) -> int: ...

    def tag_count(self, knowledge_tag: str) -> int: ...

    def tags_of(self, ids: list[str]) -> list[str | None]: ...


# The unfiltered search of a tagged query asks for this many times the chunks it needs, by the tag's share:
# if the tag were independent of the query, that many would hold twice `candidate_k` of the tag on average.
POST_FILTER_MARGIN = 2.0


@dataclass
class CandidateSet:
    candidates: list[Candidate]
    origins: dict[str, int]  # {"dense": n, "bm25": n, "both": n}


class CandidateGenerator:
    def __init__(
        self,
        store: ChromaStore,
        settings: RetrievalSettings,
        lexical: LexicalIndex | None,
        nearest: bool = True,
    ):
        """`nearest=False`: leave `Candidate.nearest` None (not known) instead of computing every
        candidate's largest cosine in its set (a matrix product per query), for a chain in which nothing
        reads it (no diversity stage with a max_cosine). None is always exact: the diversity stage then
        computes the cosines it needs, so a replay of such candidates with a max_cosine decides as a live
        run would, only slower."""
        self.store = store
        self.settings = settings
        self.lexical = lexical
        self.nearest = nearest

    def generate_many(
        self, queries: list[str], embeddings: np.ndarray, knowledge_tags: list[str | None]
    ) -> list[CandidateSet]:
        """Candidates for several queries; queries sharing a knowledge tag go to the store in one call.

        The store's dense search returns ids and distances only; the texts, metadata and vectors of every
        query's candidates (dense and BM25-only) come from the store's chunk cache, the ones not cached read
        with one `get` for the whole batch (`ChromaStore.chunks`)."""
        refresh = getattr(self.lexical, "refresh", None)
        if refresh is not None:
            refresh()  # other processes' writes, at most every rag.lexical.refresh_seconds
        dense: list[list[tuple[str, float]]] = [[] for _ in queries]
        if self.settings.candidate_k > 0:  # 0: lexical candidates only
            for tag in dict.fromkeys(knowledge_tags):
                idx = [i for i, t in enumerate(knowledge_tags) if t == tag]
                for i, h in zip(idx, self._dense(embeddings[idx], tag), strict=True):
                    dense[i] = h
        lexical: list[list[str]] = [[] for _ in queries]
        if self.settings.hybrid and self.lexical is not None:
            # The tag restricts BM25 before its cut, as `where` does for the dense search.
            n = self.settings.bm25_candidate_k
            lexical = [
                [chunk_id for chunk_id, _ in self.lexical.top(q, n, tag)]
                for q, tag in zip(queries, knowledge_tags, strict=True)
            ]
        wanted = dict.fromkeys(cid for ids in dense for cid, _ in ids)
        wanted.update(dict.fromkeys(cid for ids in lexical for cid in ids))
        chunks = self.store.chunks(list(wanted))
        return [
            self._merge(embeddings[i], knowledge_tags[i], dense[i], lexical[i], chunks)
            for i in range(len(queries))
        ]

    def _dense(self, embeddings: np.ndarray, tag: str | None) -> list[list[tuple[str, float]]]:
        """The dense top `candidate_k` of each query vector, among the chunks tagged `tag` if not None.

        Chroma's search with `where` (its filtered HNSW search) costs far more than an unfiltered one at
        scale: 0.5-2.3 s a query at 1M chunks, against 86 ms for the nearest 4,000 (docs/benchmarks.md).
        So, when the lexical index knows that `tag` has `count` of its `live` chunks, the nearest
        n = ceil(POST_FILTER_MARGIN * candidate_k * live / count) chunks are fetched unfiltered, if n is at
        most `tag_post_filter_max`, and the first `candidate_k` of them with the tag (by the index's tags)
        are kept. A query for which fewer are left, while the search may have stopped short of some chunks
        of the tag (it returned all n), asks Chroma's filtered search after all; so the post-filter never
        returns fewer candidates than `where` would. When n reaches the whole collection, one more than
        `live` is asked for: every chunk comes back and nothing is left to ask for.

        A store that searches exactly (`ChromaStore.exact_search_active`, app/store/exact.py) filters by
        tag exactly and cheaply itself: it gets the `where`.

        The tags are the index's, which follows other processes' writes at most
        `rag.lexical.refresh_seconds` late, as BM25 does; `_merge` checks each kept chunk's stored tag."""
        k = self.settings.candidate_k
        exact = getattr(self.store, "exact_search_active", False)
        if tag is None or exact or (n := self._post_filter_n(tag)) is None:
            return self.store.query_ids(embeddings, k, _where(tag))
        index = cast("TaggedIndex", self.lexical)
        wide = self.store.query_ids(embeddings, n, None)
        out: list[list[tuple[str, float]]] = []
        short: list[int] = []
        for i, hits in enumerate(wide):
            tags = index.tags_of([chunk_id for chunk_id, _ in hits])
            kept = [hit for hit, t in zip(hits, tags, strict=True) if t == tag][:k]
            out.append(kept)
            if len(kept) < k and len(hits) >= n:
                short.append(i)
        if short:
            again = self.store.query_ids(embeddings[short], k, _where(tag))
            for i, hits in zip(short, again, strict=True):
                out[i] = hits
        return out

    def _post_filter_n(self, tag: str | None) -> int | None:
        """How many chunks a query tagged `tag` fetches unfiltered, or None for Chroma's `where`."""
        limit = self.settings.tag_post_filter_max
        index = self.lexical
        if tag is None or limit <= 0 or not hasattr(index, "tag_count"):
            return None
        tagged = cast("TaggedIndex", index)
        count, live = tagged.tag_count(tag), len(tagged)
        if count <= 0:  # a tag the index does not know (yet): Chroma's filter decides
            return None
        n = min(math.ceil(POST_FILTER_MARGIN * self.settings.candidate_k * live / count), live + 1)
        return n if n <= limit else None

    def _merge(
        self,
        embedding: np.ndarray,
        tag: str | None,
        dense_hits: list[tuple[str, float]],
        lexical_ids: list[str],
        chunks: dict[str, StoredChunk],
    ) -> CandidateSet:
        def current(chunk_id: str) -> StoredChunk | None:
            """The stored chunk, or None when it was deleted or retagged since the search or the index
            (post-filtered dense hits were picked by the index's tags): left out."""
            hit = chunks.get(chunk_id)
            if hit is None or (tag is not None and knowledge_tag_of(hit.metadata) != tag):
                return None
            return hit

        hits: dict[str, tuple[StoredChunk, float, set[str]]] = {}
        for chunk_id, similarity in dense_hits:
            if (hit := current(chunk_id)) is not None:
                hits[chunk_id] = (hit, float(similarity or 0.0), {"dense"})
        for chunk_id in lexical_ids:
            if chunk_id in hits:
                hits[chunk_id][2].add("bm25")
                continue
            if (hit := current(chunk_id)) is None:
                continue
            vec = hit.embedding if hit.embedding is not None else np.zeros_like(embedding)
            hits[chunk_id] = (hit, float(np.dot(vec, embedding)), {"bm25"})
        stored = [hit for hit, _, _ in hits.values()]
        units, nearest = _geometry([h.embedding for h in stored], [h.norm for h in stored], self.nearest)
        made = [
            _candidate(hit, dense, origin, unit, near)
            for (hit, dense, origin), unit, near in zip(hits.values(), units, nearest, strict=True)
        ]
        ordered = sorted(made, key=lambda c: (-c.scores[SCORE_DENSE], c.doc_id, c.chunk_id))
        origins = {"dense": 0, "bm25": 0, "both": 0}
        for c in ordered:
            origins["both" if len(c.origin) == 2 else next(iter(c.origin))] += 1
        return CandidateSet(ordered, origins)


def _geometry(
    vectors: list[np.ndarray | None], norms: list[float | None] | None = None, with_nearest: bool = True
) -> tuple[list[np.ndarray | None], list[float | None]]:
    """Per vector: `unit_vector` of it, and the largest cosine of that with any other unit vector of the
    list (`Candidate.nearest`; -inf when it is the only one, None when the vectors differ in length, or
    for all with `with_nearest=False`).

    `norms`: each vector's `vector_norm` when known (the store's chunk cache keeps it), so only the missing
    ones are computed; the units are the same bits either way (`unit_rows`)."""
    units: list[np.ndarray | None] = [None] * len(vectors)
    nearest: list[float | None] = [None] * len(vectors)
    present = [i for i, v in enumerate(vectors) if v is not None]
    shapes = {v.shape if isinstance(v, np.ndarray) else np.shape(v) for v in vectors if v is not None}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        for i in present:
            units[i] = unit_vector(vectors[i])
        return units, nearest
    known = None if norms is None else [norms[i] for i in present]
    # one conversion to float64 (exact) of all the rows, as unit_rows would make of their stack
    matrix = unit_rows(np.array([vectors[i] for i in present], dtype=float), known)
    usable = np.isfinite(matrix).all(axis=1)
    every = bool(usable.all())
    rows = matrix if every else matrix[usable]
    if with_nearest:
        with one_thread():  # the bound needs no particular rounding (`cosine_slack`), only speed
            cosines = rows @ rows.T
        np.fill_diagonal(cosines, -np.inf)
        best = (cosines.max(axis=1) if len(rows) > 1 else np.full(len(rows), -np.inf)).tolist()
    else:
        best = [None] * len(rows)
    row_views = list(rows)
    if every:
        for at, i in enumerate(present):
            units[i], nearest[i] = row_views[at], best[at]
        return units, nearest
    at = 0
    for i, ok in zip(present, usable.tolist(), strict=True):
        if ok:
            units[i], nearest[i] = row_views[at], best[at]
            at += 1
        else:  # of no length or not finite: whatever unit_vector makes of it, and no bound
            units[i] = unit_vector(vectors[i])
    return units, nearest


_new_candidate = object.__new__


def _candidate(
    hit: StoredChunk, dense: float, origin: set[str], unit: np.ndarray | None, nearest: float | None
) -> Candidate:
    """`Candidate(...)` with these fields, made without `__init__` (a hot path: every candidate of every
    query; its `__post_init__` would only compute `unit`, given here). Its metadata is its own copy: the
    chunk is the chunk cache's."""
    meta: dict[str, Any] = dict(hit.metadata)
    made = _new_candidate(Candidate)
    made.__dict__ = {
        "chunk_id": hit.chunk_id,
        "doc_id": str(meta.get("doc_id", hit.chunk_id)),
        "text": hit.text,
        "metadata": meta,
        "embedding": hit.embedding,
        "scores": {SCORE_DENSE: dense},
        "origin": frozenset(origin),
        "unit": unit,
        "nearest": nearest,
    }
    return made


def _where(tag: str | None) -> dict[str, Any] | None:
    return {"knowledge": tag} if tag is not None else None
