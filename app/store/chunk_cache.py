"""The chunks a query needs (text, metadata, vector), kept in this process so that a query asks the store for
ids and distances only (`rag.store.cache_chunks`).

On SciFact the dense top 50 costs many times as much with documents, metadata and vectors as with distances
only, and the get of the BM25-only candidates adds about as much again (docs/benchmarks.md#code-figures).
A query's candidates are read from here; the ones not here are read with one `get` for all of them and kept.

Exact, never a stale answer the lexical index would not also give:
- chunk ids are content hashes, but a chunk's metadata can change under the same id (a retag rewrites it in
  place, `update_metadata`), and so can everything on an upsert of an existing id, and a delete removes it;
- this process's own writes drop their ids here as soon as the store call returns (`ChromaStore` calls
  `invalidate` after every upsert, metadata update and delete, also a failed one);
- other processes' writes drop their ids when the lexical index reads them from the store's change log
  (app/lexical/sync.py calls `ChromaStore.forget`), before the query that triggered the check: the
  cache is as current as the BM25 index, at most `rag.lexical.refresh_seconds` behind;
- a read that raced a write cannot put the old state back: `fill` keeps nothing read before the last
  invalidation (`epoch`), whatever the order the two threads finished in.

Bounded: at most `max_chunks` entries, the least recently used leave first (0 = no cache: every read goes to
the store). An entry holds the text, the metadata dict, the float32 vector and its float64 unit vector
(`StoredChunk.unit`: about 5.7 KB at 384 dimensions besides the text; the unit vector, 3.2 KB of it, saves
every query the conversion of its candidates' vectors: docs/benchmarks.md#code-figures).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.store.types import StoredChunk


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    invalidations: int = 0


class ChunkCache:
    def __init__(self, max_chunks: int):
        if max_chunks < 0:
            raise ValueError(f"max_chunks must be >= 0, not {max_chunks}")
        self.max_chunks = max_chunks
        self.stats = CacheStats()
        self._entries: OrderedDict[str, StoredChunk] = OrderedDict()
        self._lock = threading.Lock()
        self._epoch = 0  # advanced by every invalidation

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._entries

    @property
    def epoch(self) -> int:
        """Take it before reading the store for a `fill`."""
        return self._epoch

    def lookup(self, ids: Iterable[str]) -> tuple[dict[str, StoredChunk], list[str]]:
        """The cached chunks among `ids` (now the most recently used), and the ids not cached, in order."""
        found: dict[str, StoredChunk] = {}
        missing: list[str] = []
        entries = self._entries
        with self._lock:
            for chunk_id in ids:
                hit = entries.get(chunk_id)
                if hit is None:
                    missing.append(chunk_id)
                else:
                    entries.move_to_end(chunk_id)
                    found[chunk_id] = hit
            self.stats.hits += len(found)
            self.stats.misses += len(missing)
        return found, missing

    def fill(self, chunks: Sequence[StoredChunk], epoch: int) -> None:
        """Keep `chunks`, read from the store after `epoch` was taken; nothing is kept when an invalidation
        came in between (the read may predate a write the invalidation stands for)."""
        if self.max_chunks == 0 or not chunks:
            return
        with self._lock:
            if epoch != self._epoch:
                return
            entries = self._entries
            for chunk in chunks:
                entries[chunk.chunk_id] = chunk
                entries.move_to_end(chunk.chunk_id)
            while len(entries) > self.max_chunks:
                entries.popitem(last=False)
                self.stats.evictions += 1

    def invalidate(self, ids: Iterable[str]) -> None:
        """Drop `ids` (written or deleted: the store holds something else for them now)."""
        with self._lock:
            self._epoch += 1
            self.stats.invalidations += 1
            for chunk_id in ids:
                self._entries.pop(chunk_id, None)

    def clear(self) -> None:
        with self._lock:
            self._epoch += 1
            self._entries.clear()
