"""Candidate generation: the dense top-N from the vector store, plus (hybrid) the BM25 top-N.

A query with a knowledge tag gets both top-Ns among the chunks with that tag, taken before the cut: the
index's `knowledge_tag` for BM25; for the dense search either Chroma's `where` or, for a tag common enough,
an unfiltered search for more chunks filtered here by the index's tags (see `CandidateGenerator._dense`).

A query with a principal (`app.access.scope.Principal`, not the admin) gets candidates only among the chunks
it may read, by the same means: its scope joins the tag in the index's filter, the post-filter and the store's
`where`. Each candidate is then checked once more by `may_read` over its stored metadata, so a stale index
can narrow a scope but never widen it.

`candidate_k: 0` with `hybrid: true` makes the candidates lexical only (BM25 top-N).

Every candidate gets a dense score, including those only BM25 found (their stored vector is compared with
the query vector), so the similarity threshold and the fusion see one consistent cosine for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from app.access.scope import Principal, may_read
from app.retrieval.blas import one_thread
from app.retrieval.types import SCORE_DENSE, Candidate, knowledge_tag_of, unit_rows, unit_vector
from app.settings import RetrievalSettings
from app.store import ChromaStore, StoredChunk


class LexicalIndex(Protocol):
    def top(
        self, query: str, n: int, knowledge_tag: str | None = None, principal: Principal | None = None
    ) -> list[tuple[str, float]]: ...

    def scores(self, query: str, ids: list[str]) -> dict[str, float]: ...


class TaggedIndex(Protocol):
    """What the post-filter asks of the lexical index (`Bm25Index` has it; a fake may not)."""

    def __len__(self) -> int: ...

    def tag_count(self, knowledge_tag: str | None, principal: Principal | None = None) -> int: ...

    def readable(
        self, ids: list[str], knowledge_tag: str | None, principal: Principal | None
    ) -> list[bool]: ...


# The unfiltered search of a tagged query asks for this many times the chunks it needs, by the tag's share:
# if the tag were independent of the query, that many would hold twice `candidate_k` of the tag on average.
POST_FILTER_MARGIN = 2.0


@dataclass
class CandidateSet:
    candidates: list[Candidate]
    origins: dict[str, int]  # {"dense": n, "bm25": n, "both": n}
    # the chunk ids each search found that became candidates, in the search's order: "dense" by cosine
    # descending as the store answered, "bm25" by BM25 score descending, ties by chunk id (`Bm25Index.top`);
    # a search that did not run has no entry
    search_hits: dict[str, list[str]] = field(default_factory=dict)


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
        self,
        queries: list[str],
        embeddings: np.ndarray,
        knowledge_tags: list[str | None],
        principals: Sequence[Principal | None] | None = None,
    ) -> list[CandidateSet]:
        """Candidates for several queries; queries sharing a knowledge tag and a scope go to the store in one
        call. `principals[i]`: whose scope query i retrieves in (None, or the admin: everything).

        The store's dense search returns ids and distances only; the texts, metadata and vectors of every
        query's candidates (dense and BM25-only) come from the store's chunk cache, the ones not cached read
        with one `get` for the whole batch (`ChromaStore.chunks`)."""
        refresh = getattr(self.lexical, "refresh", None)
        if refresh is not None:
            refresh()  # other processes' writes, at most every rag.lexical.refresh_seconds
        scopes = [None if p is None or p.admin else p for p in (principals or [None] * len(queries))]
        dense: list[list[tuple[str, float]]] = [[] for _ in queries]
        if self.settings.candidate_k > 0:  # 0: lexical candidates only
            groups: dict[tuple[object, ...], list[int]] = {}
            for i, (tag, scope) in enumerate(zip(knowledge_tags, scopes, strict=True)):
                groups.setdefault((tag, None if scope is None else scope.key), []).append(i)
            for idx in groups.values():
                hits = self._dense(embeddings[idx], knowledge_tags[idx[0]], scopes[idx[0]])
                for i, h in zip(idx, hits, strict=True):
                    dense[i] = h
        lexical: list[list[str]] = [[] for _ in queries]
        if self.settings.hybrid and self.lexical is not None:
            # The tag and the scope restrict BM25 before its cut, as `where` does for the dense search.
            n = self.settings.bm25_candidate_k
            lexical = [
                [chunk_id for chunk_id, _ in self._lexical_top(q, n, tag, scope)]
                for q, tag, scope in zip(queries, knowledge_tags, scopes, strict=True)
            ]
        wanted = dict.fromkeys(cid for ids in dense for cid, _ in ids)
        wanted.update(dict.fromkeys(cid for ids in lexical for cid in ids))
        chunks = self.store.chunks(list(wanted))
        return [
            self._merge(embeddings[i], knowledge_tags[i], dense[i], lexical[i], chunks, scopes[i])
            for i in range(len(queries))
        ]

    def _lexical_top(
        self, query: str, n: int, tag: str | None, scope: Principal | None
    ) -> list[tuple[str, float]]:
        index = cast("LexicalIndex", self.lexical)
        if scope is None:  # an index without scopes (a test's fake) is asked as before
            return index.top(query, n, tag)
        return index.top(query, n, tag, scope)

    def _dense(
        self, embeddings: np.ndarray, tag: str | None, scope: Principal | None = None
    ) -> list[list[tuple[str, float]]]:
        """The dense top `candidate_k` of each query vector, among the chunks tagged `tag` if not None and
        readable by `scope` if not None.

        Chroma's search with `where` (its filtered HNSW search) costs far more than an unfiltered one at
        scale (docs/benchmarks.md#code-figures, docs/scaling.md).
        So, when the lexical index knows that `count` of its `live` chunks match, the nearest
        n = ceil(POST_FILTER_MARGIN * candidate_k * live / count) chunks are fetched unfiltered, if n is at
        most `tag_post_filter_max`, and the first `candidate_k` of them that match (by the index's labels)
        are kept. A query for which fewer are left, while the search may have stopped short of some
        matching chunks (it returned all n), asks Chroma's filtered search after all; so the post-filter
        never returns fewer candidates than `where` would. When n reaches the whole collection, one more
        than `live` is asked for: every chunk comes back and nothing is left to ask for.

        A store that searches exactly (`ChromaStore.exact_search_active`, app/store/exact.py), or that holds
        the vectors of the few chunks this filter matches (`exact_search_covers`), filters by tag and scope
        exactly and cheaply itself: it gets the `where` and the principal.

        The labels are the index's, which follows other processes' writes at most
        `rag.lexical.refresh_seconds` late, as BM25 does; `_merge` checks each kept chunk's stored tag and
        scope."""
        k = self.settings.candidate_k
        covers = getattr(self.store, "exact_search_covers", None)
        exact = getattr(self.store, "exact_search_active", False) or (
            covers is not None and covers(tag, scope)
        )
        if (tag is None and scope is None) or exact or (n := self._post_filter_n(tag, scope)) is None:
            return self._query(embeddings, k, tag, scope)
        index = cast("TaggedIndex", self.lexical)
        wide = self.store.query_ids(embeddings, n, None)
        out: list[list[tuple[str, float]]] = []
        short: list[int] = []
        for i, hits in enumerate(wide):
            matching = index.readable([chunk_id for chunk_id, _ in hits], tag, scope)
            kept = [hit for hit, ok in zip(hits, matching, strict=True) if ok][:k]
            out.append(kept)
            if len(kept) < k and len(hits) >= n:
                short.append(i)
        if short:
            again = self._query(embeddings[short], k, tag, scope)
            for i, hits in zip(short, again, strict=True):
                out[i] = hits
        return out

    def _query(
        self, embeddings: np.ndarray, n: int, tag: str | None, scope: Principal | None
    ) -> list[list[tuple[str, float]]]:
        if scope is None:  # a store without scopes (a test's fake) is asked as before
            return self.store.query_ids(embeddings, n, _where(tag))
        return self.store.query_ids(embeddings, n, _where(tag), scope)

    def _post_filter_n(self, tag: str | None, scope: Principal | None = None) -> int | None:
        """How many chunks a filtered query fetches unfiltered, or None for the store's filtered search."""
        limit = self.settings.tag_post_filter_max
        index = self.lexical
        if limit <= 0 or not hasattr(index, "tag_count") or not hasattr(index, "readable"):
            return None
        tagged = cast("TaggedIndex", index)
        count, live = tagged.tag_count(tag, scope), len(tagged)
        if count <= 0:  # nothing the index knows of (yet): the store's filter decides
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
        scope: Principal | None = None,
    ) -> CandidateSet:
        """One query's candidates: its dense hits, then its lexical-only ones with the cosine of their stored
        vector, each the stored chunk, ordered by dense score descending, ties by doc id, then chunk id.

        A hit whose chunk is not in `chunks` (deleted since the search), or no longer carries the query's
        tag (retagged since the search or the index: post-filtered dense hits were picked by the index's
        tags), or that `scope` may not read by its stored metadata (`may_read`), is left out. A hot path
        (84 candidates a query on SciFact), so it keeps parallel lists.

        Its `search_hits` are the dense hits and the lexical ids that became candidates, each in the order
        its search gave them."""
        got = _Gathered()
        got.add_dense(dense_hits, chunks, tag, scope)
        searched = {"dense": [h.chunk_id for h in got.picked]} if self.settings.candidate_k > 0 else {}
        lexical_hits = got.add_lexical(lexical_ids, chunks, tag, scope, embedding)
        if self.settings.hybrid and self.lexical is not None:
            searched["bm25"] = lexical_hits
        picked, origins = got.picked, got.origins
        units, nearest = _geometry([h.embedding for h in picked], [h.unit for h in picked], self.nearest)
        made = list(map(_candidate, picked, got.dense, origins, units, nearest))
        made.sort(key=lambda c: (-c.scores[SCORE_DENSE], c.doc_id, c.chunk_id))
        counts = {"dense": origins.count(DENSE), "bm25": origins.count(LEXICAL), "both": origins.count(BOTH)}
        return CandidateSet(made, counts, searched)


DENSE, LEXICAL, BOTH = frozenset({"dense"}), frozenset({"bm25"}), frozenset({"dense", "bm25"})


@dataclass
class _Gathered:
    """One query's candidates as `_merge` gathers them, in parallel lists (a hot path): each stored chunk,
    its dense score and which searches found it, and each chunk id's place in the lists."""

    picked: list[StoredChunk] = field(default_factory=list)
    dense: list[float] = field(default_factory=list)
    origins: list[frozenset[str]] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)

    def add_dense(
        self,
        hits: list[tuple[str, float]],
        chunks: dict[str, StoredChunk],
        tag: str | None,
        scope: Principal | None,
    ) -> None:
        get, position = chunks.get, self.position
        for chunk_id, similarity in hits:
            hit = get(chunk_id)
            if hit is None or not _admitted(hit, tag, scope):
                continue
            if chunk_id in position:  # a store never repeats a hit; if one did, its last score counts
                self.dense[position[chunk_id]] = float(similarity or 0.0)
                continue
            position[chunk_id] = len(self.picked)
            self.picked.append(hit)
            self.dense.append(float(similarity or 0.0))
            self.origins.append(DENSE)

    def add_lexical(
        self,
        ids: list[str],
        chunks: dict[str, StoredChunk],
        tag: str | None,
        scope: Principal | None,
        embedding: np.ndarray,
    ) -> list[str]:
        """Add the lexical hits not found by the dense search, scored by their stored vector's cosine;
        returns the lexical ids that became (or already were) candidates, in the search's order."""
        get, position, origins = chunks.get, self.position, self.origins
        found: list[str] = []
        for chunk_id in ids:
            at = position.get(chunk_id)
            if at is not None:
                if origins[at] is DENSE:
                    origins[at] = BOTH
                found.append(chunk_id)
                continue
            hit = get(chunk_id)
            if hit is None or not _admitted(hit, tag, scope):
                continue
            vector = hit.embedding if hit.embedding is not None else np.zeros_like(embedding)
            position[chunk_id] = len(self.picked)
            self.picked.append(hit)
            self.dense.append(float(np.dot(vector, embedding)))
            origins.append(LEXICAL)
            found.append(chunk_id)
        return found


def _admitted(hit: StoredChunk, tag: str | None, scope: Principal | None) -> bool:
    """The stored chunk carries the query's tag (when it has one) and `scope` may read it (`may_read`)."""
    if tag is not None and knowledge_tag_of(hit.metadata) != tag:
        return False
    return scope is None or may_read(scope, hit.metadata)


def _geometry(
    vectors: list[np.ndarray | None], known: list[np.ndarray | None] | None = None, with_nearest: bool = True
) -> tuple[list[np.ndarray | None], Sequence[float | None]]:
    """Per vector: `unit_vector` of it, and the largest cosine of that with any other unit vector of the
    list (`Candidate.nearest`; -inf when it is the only one, None when the vectors differ in length, or
    for all with `with_nearest=False`).

    `known`: each vector's unit vector where known (the store's chunk cache keeps it, `StoredChunk.unit`),
    so only the missing ones are computed (`unit_rows`, the same bits).

    The nearest cosines come from one float32 product of the units rounded to float32, on one BLAS
    thread: faster than the float64 product (docs/benchmarks.md#code-figures), and only a bound is
    needed, within `nearest_slack` of the float64 cosine (the diversity stage allows for it)."""
    if with_nearest and known is not None and len(known) > 1 and all(u is not None for u in known):
        try:  # the usual case: every unit known (so 1-D); a ValueError: they differ in length
            single = np.array(known, dtype=np.float32)
        except ValueError:
            pass
        else:
            return list(known), _nearest(single)
    units: list[np.ndarray | None] = list(known) if known is not None else [None] * len(vectors)
    nearest: list[float | None] = [None] * len(vectors)
    present = [i for i, v in enumerate(vectors) if v is not None]
    shapes = {v.shape if isinstance(v, np.ndarray) else np.shape(v) for v in vectors if v is not None}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        for i in present:
            units[i] = unit_vector(vectors[i])
        return units, nearest
    bounded = present  # the vectors that get a nearest cosine: of some length and finite
    missing = [i for i in present if units[i] is None]
    if missing:
        # one conversion to float64 (exact) of the rows, as unit_rows would make of their stack
        matrix = unit_rows(np.array([vectors[i] for i in missing], dtype=float))
        usable = np.isfinite(matrix).all(axis=1).tolist()
        for i, row, ok in zip(missing, matrix, usable, strict=True):
            # of no length or not finite: whatever unit_vector makes of it, and no bound
            units[i] = row if ok else unit_vector(vectors[i])
        if not all(usable):
            unusable = {i for i, ok in zip(missing, usable, strict=True) if not ok}
            bounded = [i for i in present if i not in unusable]
    if not with_nearest or not bounded:
        return units, nearest
    for i, best in zip(
        bounded, _nearest(np.array([units[i] for i in bounded], dtype=np.float32)), strict=True
    ):
        nearest[i] = best
    return units, nearest


def _nearest(single: np.ndarray) -> list[float]:
    """Each float32 unit row's largest cosine with another row of `single` (-inf for a lone row)."""
    if len(single) == 1:
        return [-math.inf]
    with one_thread():  # small: more threads only wait for each other (app/retrieval/blas.py)
        cosines = single @ single.T
    np.fill_diagonal(cosines, -np.inf)
    return cosines.max(axis=1).tolist()


_new_candidate = object.__new__


def _candidate(
    hit: StoredChunk,
    dense: float,
    origin: frozenset[str],
    unit: np.ndarray | None,
    nearest: float | None,
) -> Candidate:
    """`Candidate(...)` with these fields, made without `__init__` (a hot path: every candidate of every
    query; its `__post_init__` would only compute `unit`, given here). Its metadata is its own copy: the
    chunk is the chunk cache's."""
    meta: dict[str, Any] = hit.metadata.copy()
    doc_id = meta.get("doc_id", hit.chunk_id)
    made = _new_candidate(Candidate)
    made.__dict__ = {
        "chunk_id": hit.chunk_id,
        "doc_id": doc_id if type(doc_id) is str else str(doc_id),
        "text": hit.text,
        "metadata": meta,
        "embedding": hit.embedding,
        "scores": {SCORE_DENSE: dense},
        "origin": origin,
        "unit": unit,
        "nearest": nearest,
    }
    return made


def _where(tag: str | None) -> dict[str, Any] | None:
    return {"knowledge": tag} if tag is not None else None
