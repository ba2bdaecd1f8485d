"""bm25: score every candidate lexically, then fuse that with the dense score into one order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.retrieval.stages._common import ReplayFacts, format_pair
from app.retrieval.types import (
    SCORE_BM25,
    SCORE_DENSE,
    SCORE_FUSED,
    Candidate,
    QueryContext,
    Removal,
    StageOutcome,
)
from app.settings import Bm25Settings


class LexicalScorer(Protocol):
    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]: ...


class Bm25Stage:
    """Writes `bm25` (from the injected index) and `fused` on every candidate and sorts by `fused` descending.

    Order of work: drop candidates whose raw bm25 < `min_score` (`bm25=0.00 < 0.50`), then fuse over the
    survivors, so a removed candidate never shifts the others' ranks.

    rrf:      fused = dense_weight / (rrf_k + dense_rank) + bm25_weight / (rrf_k + bm25_rank)
              ranks are 1-based within the candidate list, score descending, ties by doc_id, then chunk_id.
              Only a candidate with bm25 > 0 gets a bm25 rank and term: bm25 = 0 means no query term
              occurs in it, which is no lexical evidence, and ranking it anyway (after all the matches)
              would still add a bonus. Likewise a candidate without a dense score gets no dense term.
    weighted: fused = dense_weight * minmax(dense) + bm25_weight * minmax(bm25) over the candidate list,
              minmax(x) = (x - min) / (max - min), and 0.0 for every candidate when max == min (no spread,
              no information); a missing score counts as 0.0 after normalisation.

    Ties in `fused` are broken by doc_id, then chunk_id, so the order is deterministic (and of two
    identical copies, the document with the smaller id wins).
    """

    name = "bm25"

    def __init__(self, settings: Bm25Settings, index: LexicalScorer):
        if not callable(getattr(index, "scores", None)):
            raise TypeError(f"bm25: the index must have .scores(query, ids), got {type(index).__name__}")
        self.settings = settings
        self.index = index

    def replay_facts(self) -> ReplayFacts:
        """It writes `bm25` and `fused`."""
        return ReplayFacts(writes_scores=True)

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        if not candidates:
            return StageOutcome(kept=[], score_key=SCORE_FUSED)
        lexical = self.index.scores(query.text, [c.chunk_id for c in candidates])

        kept: list[tuple[Candidate, float]] = []  # (candidate, its bm25)
        removed: list[Removal] = []
        floor = self.settings.min_score
        if floor is None:
            kept = [(c, float(lexical.get(c.chunk_id, 0.0))) for c in candidates]
        else:
            for candidate in candidates:
                value = float(lexical.get(candidate.chunk_id, 0.0))
                if value < floor:
                    shown, bound = format_pair(value, floor)
                    removed.append(Removal(candidate.chunk_id, candidate.doc_id, f"bm25={shown} < {bound}"))
                else:
                    kept.append((candidate, value))

        if self.settings.fusion == "rrf":
            fused = rrf(kept, self.settings.dense_weight, self.settings.bm25_weight, self.settings.rrf_k)
        else:
            fused = weighted(kept, self.settings.dense_weight, self.settings.bm25_weight)
        # one copy per survivor, with both scores (the bm25 key first, as if written one after the other)
        result = [
            c.with_scores({**c.scores, SCORE_BM25: value, SCORE_FUSED: score})
            for (c, value), score in zip(kept, fused, strict=True)
        ]
        result.sort(key=lambda c: (-c.scores[SCORE_FUSED], c.doc_id, c.chunk_id))
        return StageOutcome(kept=result, removed=removed, score_key=SCORE_FUSED)


def ranks(scored: Sequence[tuple[Candidate, float | None]], positive_only: bool = False) -> dict[str, int]:
    """1-based rank by score descending, ties by doc_id then chunk_id; a candidate whose score is None (or,
    with `positive_only`, <= 0) gets none."""
    present = [(c, v) for c, v in scored if v is not None and (not positive_only or v > 0)]
    present.sort(key=lambda p: (-p[1], p[0].doc_id, p[0].chunk_id))
    return {c.chunk_id: i for i, (c, _) in enumerate(present, start=1)}


def rrf(
    scored: Sequence[tuple[Candidate, float]], dense_weight: float, bm25_weight: float, k: int
) -> list[float]:
    """`scored`: (candidate, its bm25) pairs; the dense score is the candidate's own. The fused score of
    each pair, in order."""
    dense_rank = ranks([(c, c.scores.get(SCORE_DENSE)) for c, _ in scored])
    bm25_rank = ranks(scored, positive_only=True)
    out: list[float] = []
    for c, _ in scored:
        score = 0.0
        if c.chunk_id in dense_rank:
            score += dense_weight / (k + dense_rank[c.chunk_id])
        if c.chunk_id in bm25_rank:
            score += bm25_weight / (k + bm25_rank[c.chunk_id])
        out.append(score)
    return out


def minmax(values: list[float | None]) -> list[float]:
    """(x - min) / (max - min) over the values present, 0.0 for all when max == min; a missing value
    (None) counts as 0.0."""
    present = [value for value in values if value is not None]
    if not present:
        return [0.0] * len(values)
    low, high = min(present), max(present)
    if high == low:
        return [0.0] * len(values)
    spread = high - low
    return [0.0 if value is None else (value - low) / spread for value in values]


def weighted(
    scored: Sequence[tuple[Candidate, float]], dense_weight: float, bm25_weight: float
) -> list[float]:
    """`scored`: (candidate, its bm25) pairs; the dense score is the candidate's own. The fused score of
    each pair, in order."""
    dense = minmax([c.scores.get(SCORE_DENSE) for c, _ in scored])
    lexical = minmax([value for _, value in scored])
    return [dense_weight * d + bm25_weight * b for d, b in zip(dense, lexical, strict=True)]
