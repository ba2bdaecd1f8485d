"""The store's value types (apart from app/store/chroma.py, so the chunk cache can use it too)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from app.access.scope import Principal, chunk_label, parse_label

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

NO_NUMBER = -1  # a label without a knowledge tag, or without a tenant
NOBODY = -2  # a chunk's tenant no principal's tenant equals (`chunk_label`'s false)
UNSEEN = -3  # a name asked for that no label holds: equal to no label's number


class LabelMasks:
    """Per label number of a label index (`labels`, numbered in the order first seen, only ever added),
    whether a chunk so labelled has a knowledge tag (any, for None) and a principal may read it: the same
    answer as `label_matches` for each label, made at once for all of them.

    Each label is parsed once, into its tag's number, its tenant's number and its access entries' numbers
    (flat, in label order); a (tag, principal) pair's mask is then a few array passes over those numbers,
    not a parse of every label per principal: at 1M chunks with 50 tenants and 1,000 groups the labels
    number in the hundred thousands and a new principal's first query waited ~0.5 s for them
    (docs/benchmarks.md#access-scopes), now a few ms. A mask is kept by (tag, the principal's key) and
    extended by the labels added since, never recomputed. Not thread-safe: the index holding it serialises
    its calls."""

    def __init__(self) -> None:
        self._masks: dict[tuple[object, ...], np.ndarray] = {}
        self._numbers: dict[str, dict[str, int]] = {"tag": {}, "tenant": {}, "reader": {}}
        self._tag = array("i")  # per label: its knowledge tag's number, or NO_NUMBER
        self._tenant = array("i")  # per label: its tenant's number, NO_NUMBER or NOBODY
        self._entry_start = array("q", [0])  # per label: where its access entries start in the two below
        self._entry_label = array("i")  # per entry: its label's number
        self._entry_reader = array("i")  # per entry: the reader's number (`public`, `group:g`, `user:u`)

    def __call__(
        self, labels: Sequence[str], tag: str | None, principal: Principal | None, tail: Sequence[bool]
    ) -> np.ndarray:
        """The mask over `labels`, then `tail`'s answers, for the label numbers counted from the end (no
        label, a free row), so that indexing the mask with any row's label number answers for that row."""
        self.parse(labels)
        key = (tag, None if principal is None else principal.key)
        known = self._masks.get(key)
        if known is not None and len(known) == len(labels) + len(tail):
            return known
        done = 0 if known is None else len(known) - len(tail)
        head = known[:done] if known is not None else np.zeros(0, dtype=bool)
        fresh = self._match(done, len(labels), tag, principal)
        mask = np.concatenate([head, fresh, np.asarray(tail, dtype=bool)])
        if len(self._masks) >= MAX_LABEL_MASKS:
            self._masks.clear()
        self._masks[key] = mask
        return mask

    def parse(self, labels: Sequence[str]) -> None:
        """Take in the labels added to `labels` since the last call. The index holding this calls it as it
        adds labels, so that no query waits for a parse of them all."""
        for label in labels[len(self._tag) :]:
            parsed = parse_label(label)
            number = len(self._tag)
            self._tag.append(self._number("tag", parsed.knowledge))
            tenant = parsed.tenant
            if tenant is not None and not isinstance(tenant, str):
                self._tenant.append(NOBODY)  # may_read refuses a tenant of another type
            else:
                self._tenant.append(self._number("tenant", tenant or None))  # "" reads as none
            for entry in parsed.access or ():
                if isinstance(entry, str):
                    self._entry_label.append(number)
                    self._entry_reader.append(self._number("reader", entry))
            self._entry_start.append(len(self._entry_label))

    def _number(self, kind: str, name: str | None) -> int:
        if name is None:
            return NO_NUMBER
        numbers = self._numbers[kind]
        return numbers.setdefault(name, len(numbers))

    def _match(self, lo: int, hi: int, tag: str | None, principal: Principal | None) -> np.ndarray:
        """The answers for labels lo..hi-1 (`may_read`'s rule, over the parsed numbers)."""
        ok = np.ones(hi - lo, dtype=bool)
        if tag is not None:
            ok &= np.frombuffer(self._tag, dtype=np.int32)[lo:hi] == self._numbers["tag"].get(tag, UNSEEN)
        if principal is None:
            return ok
        tenants = self._numbers["tenant"]
        wanted = NO_NUMBER if principal.tenant is None else tenants.get(principal.tenant, UNSEEN)
        if principal.tenant == "":
            wanted = UNSEEN  # a chunk's "" reads as no tenant, which "" is not
        ok &= np.frombuffer(self._tenant, dtype=np.int32)[lo:hi] == wanted
        readers = self._numbers["reader"]
        mine = [readers[name] for name in principal.readers if name in readers]
        first, last = self._entry_start[lo], self._entry_start[hi]
        entries = np.frombuffer(self._entry_reader, dtype=np.int32)[first:last]
        hit = np.frombuffer(self._entry_label, dtype=np.int32)[first:last][np.isin(entries, mine)]
        readable = np.zeros(hi - lo, dtype=bool)
        readable[hit - lo] = True  # a label with no access entry stays unreadable: admins only
        return ok & readable


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
