"""Exact nearest-neighbour search over every chunk's vector, held in this process, for a collection of up to
`rag.store.exact_search_max_chunks` chunks (`ChromaStore.query_ids` uses it when it can).

Why. On SciFact (17,986 chunks, 384 dimensions, one query at a time, scripts/bench_chain.py) one float32
matrix-vector product over all the vectors and a partial sort is faster than Chroma's HNSW search for the
50 nearest (a fixed cost per call, then the graph walk; at `ef_search` 100 it found only 97.3% of the true
top 50), and finds the true top 50 by definition. The product grows with the collection, faster once the
matrix outgrows the CPU's cache, and the graph walk much more slowly, so past the limit (30,000 by default)
Chroma's own index serves (docs/benchmarks.md#code-figures).

What it answers: what `query_ids` answers on a cosine collection, without approximation. For each query
vector q and `n`: the `n` chunks of largest cosine(q, v) = (q / |q|) · (v / |v|), computed in float32 (the
chunks are kept as unit float32 vectors; a zero vector stays zero, similarity 0 with everything), best
first, ties by chunk id (so every process orders them alike). With a knowledge tag: only the chunks whose
`knowledge` metadata is that string, as Chroma's `where={"knowledge": tag}` matches it; with a principal:
only the chunks it may read (`app.access.scope.may_read`, by each chunk's label, `index_label_of`).

As current as the chunk cache (app/store/chunk_cache.py), by the same calls: `stale(ids)` after every write
of this process (upsert, metadata update, delete, also a failed one) and for other processes' writes read
from the change log (`ChromaStore.forget`); `stale_all()` when the change log was pruned past this process.
The store reads the stale ids back (vector and metadata) and `apply`s them, right after its own writes and
before the next search. Reads and applies are serialised (`refreshing`), so an older read never lands
after a newer one.

Layout: one float32 matrix of dimension x capacity, each chunk's unit vector a column (a chunk's "row" below
is its column number), so a query's scores are the product q @ matrix: the matrix-vector kernel for a
transposed operand, faster than chunks as rows, alone and in the chain (docs/benchmarks.md#code-figures).
It sums each cosine in another order than the rows layout: scores differ by at most 3.6e-7 over the 300
SciFact test queries, no query's top 10 differs.

Memory: 4 bytes per dimension per chunk (1.5 KB at 384 dimensions; 46 MB at the default limit of 30,000),
plus the ids.

Filtered queries of a larger collection (`filtered_max_chunks`, rag.store.exact_filtered_max_chunks). A
collection of more than `max_chunks` chunks, up to `filtered_max_chunks`, has every vector held as well, for
its filtered queries only: a knowledge tag or a principal's scope that at most `max_chunks` chunks match is
searched exactly over the matching chunks alone (their rows gathered, then one product), a search no costlier
than the whole search of a collection at the limit; every other query gets None (Chroma's HNSW serves). The
matching rows of each filter, and their gathered vectors, are kept until the next change. Chroma's
filtered HNSW search costs far more than this at scale, and the unfiltered search post-filtered must fetch
~2 * n / share chunks (docs/benchmarks.md#access-scopes). Held so, the matrix is laid out with chunks as
rows: a gather of rows reads whole vectors, a gather of columns reads 4 bytes of every column's cache line
(hundreds of ms for 10,000 of 1,000,000 chunks). A collection that grows past `max_chunks` is turned to
rows on the write that crosses it; one that shrinks back keeps that layout until it is read again (`load`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from app.access.scope import Principal, chunk_label, label_matches
from app.store.types import LabelMasks, StoredChunk, vector_norm

NO_TAG = -1  # a live row without a (string) knowledge tag
DEAD = -2  # a free row


class ExactSearch:
    """A growable float32 matrix of unit vectors (columns; rows when held for filtered queries only), with
    each one's chunk id and label."""

    def __init__(self, max_chunks: int, filtered_max_chunks: int = 0):
        if max_chunks < 0 or filtered_max_chunks < 0:
            raise ValueError(f"max_chunks must be >= 0, not {min(max_chunks, filtered_max_chunks)}")
        self.max_chunks = max_chunks  # every search scores at most this many vectors
        self.filtered_max_chunks = filtered_max_chunks
        self.hold_max = max(max_chunks, filtered_max_chunks)  # the most chunks held
        self.refreshing = threading.Lock()  # held by whoever reads the store for `apply`
        self._lock = threading.Lock()  # the arrays below
        # dimension x capacity: each chunk's float32 unit vector is a column (its "row" number below is
        # that column), so a query's product is q @ matrix (docstring above); capacity x dimension
        # (`_by_rows`) when more than `max_chunks` chunks are held
        self._matrix: np.ndarray | None = None
        self._by_rows = False
        self._matching: dict[tuple[Any, ...], np.ndarray | None] = {}  # see _matching_rows
        self._gathered: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()  # see _matching_vectors
        self._gathered_rows = 0
        self._tags = np.empty(0, dtype=np.int32)  # label number per row, NO_TAG or DEAD
        self._ids: list[str | None] = []  # per row; None for a free row
        self._row_of: dict[str, int] = {}
        self._free: list[int] = []
        self._tag_number: dict[str, int] = {}  # label -> label number (`index_label_of`)
        self._labels: list[str] = []  # label number -> label
        self._masks = LabelMasks()  # see _label_mask
        self._stale: set[str] = set()
        self._stale_all = False
        self.active = False
        self.retired = False  # turned off for good (too many chunks, a vector missing): marks are ignored
        self.why_not = "not loaded"  # why it does not serve, while not `active`

    def __len__(self) -> int:
        return len(self._row_of)

    # -- filling -----------------------------------------------------------------------------------

    def load(self, chunks: Iterable[StoredChunk], count: int) -> bool:
        """Hold exactly `chunks` (the whole collection, which has `count` chunks); False, holding nothing,
        when `count` is over `hold_max` (the larger of `max_chunks` and `filtered_max_chunks`) or a vector is
        missing or of another length. The caller takes
        the stale ids (`take_stale`) before it reads the collection, so what is marked during the read
        stays stale; a read that fails leaves this index as it was."""
        if count > self.hold_max:
            with self._lock:
                self._off(f"{count} chunks > {self._limit()}")
            return False
        batch = list(chunks)
        with self._lock:
            self._clear()
            self._by_rows = count > self.max_chunks
            self.active = True
            self._put(batch)
            if len(self._row_of) > self.hold_max:
                self._off(f"{len(self._row_of)} chunks > {self._limit()}")
            self._fit_layout()
            return self.active

    def stale(self, ids: Iterable[str]) -> None:
        """`ids` may differ in the store now: read them back before the next search."""
        with self._lock:
            if not self.retired:
                self._stale.update(ids)

    def stale_all(self) -> None:
        """Anything may differ in the store now: read the whole collection back before the next search."""
        with self._lock:
            self._stale_all = not self.retired

    def take_stale(self) -> tuple[bool, list[str]]:
        """(everything?, ids) to read back, handed over once (call with `refreshing` held); `restale` them
        if the read fails."""
        with self._lock:
            everything, ids = self._stale_all, list(self._stale)
            self._stale_all, self._stale = False, set()
        return everything, ids

    def restale(self, everything: bool, ids: Sequence[str]) -> None:
        with self._lock:
            if self.retired:
                return
            self._stale_all = self._stale_all or everything
            self._stale.update(ids)

    def apply(self, present: Sequence[StoredChunk], gone: Sequence[str]) -> None:
        """`present`: chunks as the store holds them now (with vectors); `gone`: ids it no longer holds."""
        with self._lock:
            if not self.active:
                return
            self._drop(gone)
            self._put(present)
            if len(self._row_of) > self.hold_max:
                self._off(f"the collection grew to {len(self._row_of)} chunks > {self._limit()}")
            self._fit_layout()

    @property
    def serves_all(self) -> bool:
        """Every query is answered (the collection is within `max_chunks`), not only filtered ones."""
        return self.active and len(self._row_of) <= self.max_chunks

    def covers(self, tag: str | None, principal: Principal | None = None) -> bool:
        """`search` answers this filter (unless ids are stale): every query does while the collection is
        within `max_chunks`; past it, a filter (a tag, a principal's scope) that at most `max_chunks`
        chunks match."""
        if principal is not None and principal.admin:
            principal = None
        with self._lock:
            if not self.active:
                return False
            if len(self._row_of) <= self.max_chunks:
                return True
            return (tag is not None or principal is not None) and self._matching_rows(
                tag, principal
            ) is not None

    # -- searching ---------------------------------------------------------------------------------

    def search(
        self, queries: np.ndarray, n: int, tag: str | None, principal: Principal | None = None
    ) -> list[list[tuple[str, float]]] | None:
        """(chunk id, cosine similarity) of the `n` nearest chunks of each row of `queries`, best first,
        ties by chunk id; among the chunks tagged `tag` when not None and readable by `principal` when not
        None. None when this index cannot answer (not active, stale, another vector length, a query not
        finite): the store's search decides."""
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim != 2 or not np.isfinite(q).all():
            return None
        if principal is not None and principal.admin:
            principal = None
        with self._lock:
            columns = self._matrix
            if (
                not self.active
                or self._stale
                or self._stale_all
                or columns is None
                or columns.shape[1 if self._by_rows else 0] != q.shape[1]
            ):
                return None
            if n <= 0 or not self._row_of:
                return [[] for _ in q]
            used = len(self._ids)
            filtered = tag is not None or principal is not None
            lengths = np.sqrt(np.einsum("ij,ij->i", q, q))
            units = q / np.where(lengths > 0, lengths, 1.0)[:, None]
            if len(self._row_of) > self.max_chunks:  # held for filtered queries only
                rows = self._matching_rows(tag, principal) if filtered else None
                if rows is None:
                    return None
                matching = self._matching_vectors(tag, principal, rows)
                return [_top(matching @ unit, None, n, self._ids, rows) for unit in units]
            if filtered:
                usable: np.ndarray | None = self._label_mask(tag, principal)[self._tags[:used]]
            else:
                usable = self._tags[:used] != DEAD if self._free else None
            if self._by_rows:  # within max_chunks again since the rows layout was chosen
                return [_top(columns[:used] @ unit, usable, n, self._ids) for unit in units]
            # On every BLAS thread, unlike the chain's small products (app/retrieval/blas.py): this one
            # gains from a second thread, and 8 concurrent queries lost nothing measurable
            # (docs/benchmarks.md#code-figures).
            # One matrix-vector product per query, also in a batch: BLAS's matrix-matrix kernel, which a
            # batch's one product would get, sums in another order, so a query's scores would depend on
            # the batch it came in (tests/unit/test_exact_search.py). A batch's products cost a little more
            # than its one product would, and padding a lone query to a two-column product, the other way
            # to one kernel, costs more than the lone query's own product (docs/benchmarks.md#code-figures).
            matrix = columns[:, :used]
            return [_top(unit @ matrix, usable, n, self._ids) for unit in units]

    # -- internals (with `_lock` held) --------------------------------------------------------------

    def _put(self, chunks: Sequence[StoredChunk]) -> None:
        self._forget_matching()
        for chunk in chunks:
            vector = (
                None if chunk.embedding is None else np.asarray(chunk.embedding, dtype=np.float32).ravel()
            )
            if vector is None or (self._matrix is not None and len(vector) != self._dimension()):
                width = "no vector" if vector is None else f"a vector of {len(vector)} dimensions"
                self._off(f"chunk {chunk.chunk_id!r} has {width}")
                return
            row = self._row_of.get(chunk.chunk_id)
            if row is None:
                row = self._free.pop() if self._free else self._grow(len(vector))
                self._row_of[chunk.chunk_id] = row
                self._ids[row] = chunk.chunk_id
            matrix = cast("np.ndarray", self._matrix)  # made by _grow
            length = vector_norm(vector)
            unit = vector / length if length > 0 else 0.0
            if self._by_rows:
                matrix[row] = unit
            else:
                matrix[:, row] = unit
            self._tags[row] = self._tag(chunk.metadata)

    def _drop(self, ids: Sequence[str]) -> None:
        self._forget_matching()
        for chunk_id in ids:
            row = self._row_of.pop(chunk_id, None)
            if row is not None:
                self._ids[row] = None
                self._tags[row] = DEAD
                self._free.append(row)

    def _grow(self, dimension: int) -> int:
        """A new row at the end (the arrays grow by half when full)."""
        used = len(self._ids)
        if self._matrix is None or used == len(self._tags):
            capacity = max(1024, used + used // 2)
            tags = np.full(capacity, DEAD, dtype=np.int32)
            tags[:used] = self._tags[:used]
            if self._by_rows:
                matrix = np.zeros((capacity, dimension), dtype=np.float32)
                if self._matrix is not None:
                    matrix[:used] = self._matrix[:used]
            else:
                matrix = np.zeros((dimension, capacity), dtype=np.float32)
                if self._matrix is not None:
                    matrix[:, :used] = self._matrix[:, :used]
            self._matrix, self._tags = matrix, tags
        self._ids.append(None)
        return used

    def _dimension(self) -> int:
        return int(cast("np.ndarray", self._matrix).shape[1 if self._by_rows else 0])

    def _fit_layout(self) -> None:
        """Chunks as rows once more than `max_chunks` are held (filtered searches gather rows)."""
        if self.active and not self._by_rows and len(self._row_of) > self.max_chunks:
            if self._matrix is not None:
                self._matrix = np.ascontiguousarray(self._matrix.T)
            self._by_rows = True

    def _matching_rows(self, tag: str | None, principal: Principal | None) -> np.ndarray | None:
        """The rows of the live chunks this filter matches, ascending; None when more than `max_chunks`
        match. Kept per filter until the next change (a write, a delete)."""
        key = (tag, None if principal is None else principal.key)
        if key in self._matching:
            return self._matching[key]
        used = len(self._ids)
        matches = self._label_mask(tag, principal)[self._tags[:used]]
        rows = np.flatnonzero(matches) if np.count_nonzero(matches) <= self.max_chunks else None
        if len(self._matching) >= 128:  # bounded: at most 128 x max_chunks row numbers
            self._matching.clear()
        self._matching[key] = rows
        return rows

    def _matching_vectors(self, tag: str | None, principal: Principal | None, rows: np.ndarray) -> np.ndarray:
        """The unit vectors of `rows` (this filter's), as one matrix, kept until the next change: gathering
        them costs far more than the product (a copy of 1.5 KB a chunk at 384 dimensions,
        docs/benchmarks.md#access-scopes). At most 2 x `max_chunks` rows are kept over all filters (twice
        the memory of a full exact search at the limit), the least recently used filter's dropped first."""
        key = (tag, None if principal is None else principal.key)
        kept = self._gathered.get(key)
        if kept is not None:
            self._gathered.move_to_end(key)
            return kept
        matrix = cast("np.ndarray", self._matrix)[rows]  # chunks as rows (`_fit_layout`): whole vectors
        while self._gathered and self._gathered_rows + len(rows) > 2 * self.max_chunks:
            _, dropped = self._gathered.popitem(last=False)
            self._gathered_rows -= len(dropped)
        self._gathered[key] = matrix
        self._gathered_rows += len(rows)
        return matrix

    def _forget_matching(self) -> None:
        self._matching.clear()
        self._gathered.clear()
        self._gathered_rows = 0

    def _limit(self) -> str:
        if self.filtered_max_chunks > self.max_chunks:
            return f"rag.store.exact_filtered_max_chunks {self.filtered_max_chunks}"
        return f"rag.store.exact_search_max_chunks {self.max_chunks}"

    def _tag(self, metadata: dict[str, Any]) -> int:
        value = metadata.get("knowledge")
        # Chroma's where={"knowledge": "<tag>"} matches strings only
        label = chunk_label(value if isinstance(value, str) else None, metadata)
        if label is None:
            return NO_TAG
        number = self._tag_number.setdefault(label, len(self._tag_number))
        if number == len(self._labels):
            self._labels.append(label)
            self._masks.parse(self._labels)
        return number

    def _label_mask(self, tag: str | None, principal: Principal | None) -> np.ndarray:
        """Per label number whether its chunks match, then DEAD's answer (False) and NO_TAG's, so that
        indexing it with a row's label number (DEAD -2, NO_TAG -1 count from the end) answers for every
        row (`LabelMasks`)."""
        tail = [False, label_matches(None, tag, principal)]  # DEAD, NO_TAG
        return self._masks(self._labels, tag, principal, tail)

    def _off(self, why: str) -> None:
        self._clear()
        self.retired = True
        self._stale, self._stale_all = set(), False
        self.why_not = why

    def _clear(self) -> None:
        self.active = False
        self._matrix = None
        self._by_rows = False
        self._matching, self._gathered, self._gathered_rows = {}, OrderedDict(), 0
        self._tags = np.empty(0, dtype=np.int32)
        self._ids, self._row_of, self._free, self._tag_number = [], {}, [], {}
        self._labels, self._masks = [], LabelMasks()


def _top(
    scores: np.ndarray,
    usable: np.ndarray | None,
    n: int,
    ids: list[str | None],
    rows: np.ndarray | None = None,
) -> list[tuple[str, float]]:
    """The `n` best usable rows of one query's `scores`, best first, ties by chunk id. `rows`: the row of
    each score (when the scores are of some rows only)."""
    if usable is not None:
        scores = np.where(usable, scores, -np.inf)
        available = int(np.count_nonzero(usable))
    else:
        available = len(scores)
    if available == 0:
        return []
    if n >= available:
        picked = np.flatnonzero(usable) if usable is not None else np.arange(len(scores))
    else:
        nth = np.partition(scores, len(scores) - n)[len(scores) - n]  # the n-th largest
        picked = np.flatnonzero(scores >= nth)  # with every row tied with it, for the tie order below
    values = scores[picked].tolist()
    at = rows[picked] if rows is not None else picked
    named = [(ids[i], v) for i, v in zip(at.tolist(), values, strict=True)]
    named.sort(key=lambda p: (-p[1], p[0]))
    return [(str(chunk_id), float(v)) for chunk_id, v in named[:n]]
