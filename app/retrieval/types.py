"""The values that flow through the retrieval chain and its trace.

A `Candidate` is one chunk under consideration for one query. Each stage writes only its own score key
(`dense`, `bm25`, `fused`, `rerank`) and never compares scores that different models produced.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol, runtime_checkable

import numpy as np

from app.store.types import knowledge_tag_of

SCORE_DENSE = "dense"
SCORE_BM25 = "bm25"
SCORE_FUSED = "fused"
SCORE_RERANK = "rerank"
# Chunk metadata written at ingest (chunker.DOC_SHA256): sha256 of the normalised document text.
META_DOC_SHA256 = "doc_sha256"


def unit_vector(vector: np.ndarray | None) -> np.ndarray | None:
    """`vector` as float64 scaled to length 1 (v / sqrt(v · v)); None when absent or of no length.

    The store's vectors are unit length already; this makes a cosine exact for any input."""
    if vector is None:
        return None
    v = np.asarray(vector, dtype=float).ravel()
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else None


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """`unit_vector` of every row of a 2-D array, bit for bit, in one pass (a row of no length, or not finite,
    comes out as NaN): each row's squared norm is the same `ddot` of the row with itself that
    `np.linalg.norm` takes of a 1-D vector, and the division is the same elementwise IEEE division
    (tests/unit/test_candidate_geometry.py checks the equality)."""
    rows = np.asarray(vectors, dtype=float)
    lengths = np.array([np.sqrt(r.dot(r)) for r in rows], dtype=float)
    return rows / np.where(lengths > 0, lengths, np.nan)[:, None]


def cosine_slack(dimension: int) -> float:
    """How far apart two float64 computations of one cosine of unit vectors of `dimension` can be, with
    room to spare: each is within γ_d·Σ|x_i·y_i| <= γ_d·(1 + 2^-50) of the exact dot product whatever its
    summation order, with or without FMA (γ_d = d·u / (1 - d·u), u = 2^-53; Higham, Accuracy and Stability of
    Numerical Algorithms, 3.1), so two of them differ by at most about 2·d·2^-53. This is 4·d·2^-53, and
    at least 1e-9."""
    return max(1e-9, 4 * dimension * 2.0**-53)


def nearest_slack(dimension: int) -> float:
    """How far `Candidate.nearest`, computed in float32 (`_geometry` in app/retrieval/candidates.py: the
    float64 unit vectors rounded to float32, then one float32 matrix product), can be from a float64
    computation of the same cosine, with room to spare; math.inf when no bound holds (d·u >= 1/2).

    With u = 2^-24: rounding each unit vector to float32 moves every component by at most u times itself,
    so the exact dot product of the rounded vectors is within (2u + u^2)·Σ|x_i·y_i| <= 2u + u^2 of the
    exact cosine (Σ|x_i·y_i| <= |x|·|y| = 1); the float32 sum is within γ_d·(1 + u)^2 of that, whatever its
    summation order (γ_d = d·u / (1 - d·u); Higham 3.1). Together at most about (d + 2)·u, doubled here;
    then `cosine_slack` for the float64 computation it is compared with."""
    u = 2.0**-24
    if dimension * u >= 0.5:
        return math.inf
    gamma = dimension * u / (1 - dimension * u)
    return 2 * ((2 * u + u * u) + gamma * (1 + u) ** 2) + cosine_slack(dimension)


@dataclass
class Candidate:
    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    # the vector from the store (unit length already); the diversity stage compares `unit`
    embedding: np.ndarray | None = None
    scores: dict[str, float] = field(default_factory=dict)
    # where the candidate came from: {"dense"}, {"bm25"} or both
    origin: frozenset[str] = frozenset({"dense"})
    # `unit_vector(embedding)`, computed once when the candidate is made (the candidate generator does it
    # for a whole candidate set at once) and shared by every copy, so no stage re-normalises it
    unit: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the largest cosine of `unit` with the unit vector of any other candidate of its candidate set (one
    # float32 matrix product for the set, made with `unit`), within `nearest_slack` of its float64 value;
    # None = not known. The diversity stage computes a candidate's exact cosines with the kept ones only
    # when this is within `nearest_slack` of max_cosine.
    nearest: float | None = field(default=None, repr=False, compare=False)
    # further chunks of its document that the diversity stage attached to it instead of giving them a rank of
    # their own (`diversity.attach_per_document`), best first; they travel with it into the result
    attached: tuple[Candidate, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.unit is None and self.embedding is not None:
            self.unit = unit_vector(self.embedding)

    def with_scores(self, scores: dict[str, float]) -> Candidate:
        """A copy carrying `scores` (the caller's own dict) and everything else of this one, unchanged.

        Stages copy instead of writing into a candidate, so raw candidates reused for another run of the
        chain (another configuration, the fallback's refill) never carry scores from a stage that did not
        run there. The copy skips `__init__` (a hot path: every stage that scores copies every
        candidate); the fields are the same objects."""
        copy = object.__new__(Candidate)
        fields = self.__dict__.copy()
        fields["scores"] = scores
        copy.__dict__ = fields
        return copy

    def with_attached(self, attached: tuple[Candidate, ...]) -> Candidate:
        """A copy carrying `attached` and everything else of this one (the same fields, as `with_scores`)."""
        copy = object.__new__(Candidate)
        fields = self.__dict__.copy()
        fields["attached"] = attached
        copy.__dict__ = fields
        return copy

    def chunk_ids_with_attached(self) -> list[str]:
        """Its own chunk id, then those of the chunks attached to it."""
        return [self.chunk_id, *(a.chunk_id for a in self.attached)]

    @property
    def source(self) -> str:
        return str(self.metadata.get("source", ""))

    @property
    def title(self) -> str:
        return str(self.metadata.get("title", ""))

    @property
    def knowledge_tag(self) -> str | None:
        return knowledge_tag_of(self.metadata)

    @property
    def doc_sha256(self) -> str | None:
        """The hash of its whole document's normalised text, written at ingest (None in older stores)."""
        value = self.metadata.get(META_DOC_SHA256)
        return str(value) if value else None


@dataclass(frozen=True)
class Removal:
    chunk_id: str
    doc_id: str
    reason: str


@dataclass
class StageOutcome:
    """What one stage did: the survivors in their new order, and every removal with its reason.

    Invariant for every stage except `fallback`: ids(kept) + ids(removed) == ids(input), as multisets.
    `fallback` may only add (`added`), never remove.
    """

    kept: list[Candidate]
    removed: list[Removal] = field(default_factory=list)
    added: list[Candidate] = field(default_factory=list)
    skipped: str | None = None  # e.g. "skipped: no reranker model"
    score_key: str | None = None  # the score this stage wrote or ordered by
    model_inputs: int = 0  # texts this stage handed a model (the cross-encoder's query-passage pairs)


@dataclass
class QueryContext:
    text: str
    knowledge_tag: str | None = None
    today: date = field(default_factory=date.today)
    # every candidate before any stage ran, in candidate order (the fallback refills from these)
    raw_candidates: list[Candidate] = field(default_factory=list)
    # removals so far in this chain run, by stage name (the fallback does not refill hard-filtered ones)
    removed_by_stage: dict[str, list[Removal]] = field(default_factory=dict)


class Stage(Protocol):
    name: str

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome: ...


@runtime_checkable
class Withholding(Protocol):
    """A stage whose rules hide some documents from readers altogether (the hard filter's status, dates and
    source rules): `withheld` says which rule hides a candidate's document, in words that name no document,
    or None.

    A stage that removes every candidate its `withheld` names may say so with a true `removes_withheld`
    attribute: the chain then never asks it about a candidate it kept (`_withheld` in chain.py)."""

    def withheld(self, query: QueryContext, candidate: Candidate) -> str | None: ...


@dataclass
class StageTrace:
    name: str
    input_count: int
    output_count: int
    removed: list[Removal]
    added: list[str]
    latency_ms: float
    score_key: str | None = None
    skipped: str | None = None
    enabled: bool = True
    model_inputs: int = 0


def new_trace_id() -> str:
    """A retrieval trace's id: 16 random hex digits (the first half of a uuid4's)."""
    return uuid.uuid4().hex[:16]


@dataclass
class RetrievalTrace:
    candidates_ms: float = 0.0
    candidate_origins: dict[str, int] = field(default_factory=dict)  # {"dense": n, "bm25": n, "both": n}
    stages: list[StageTrace] = field(default_factory=list)
    # ids after each stage, in order: lets the evaluation score the list after every stage
    ranked_after: dict[str, list[str]] = field(default_factory=dict)
    # the candidates each search found, in the search's own order (`CandidateSet.search_hits`)
    search_hits: dict[str, list[str]] = field(default_factory=dict)
    # one id per run of the chain: the evaluation's case record and its log line carry it
    trace_id: str = field(default_factory=new_trace_id)
    # removed chunks whose documents an enabled `Withholding` stage hides from readers, whichever stage
    # removed them, with that stage's kind (`status=draft`): the API shows readers these as counts only
    withheld: dict[str, str] = field(default_factory=dict)
    # the scope the candidates were taken in (`Principal.describe()`), None when unscoped: the trace says
    # that a scope applied, never what it left out
    scope: dict[str, Any] | None = None


@dataclass
class RetrievalResult:
    query: str
    documents: list[Candidate]
    original_count: int
    fallback_used: bool
    trace: RetrievalTrace
    latency_ms: float
    raw_candidates: list[Candidate] = field(default_factory=list)
