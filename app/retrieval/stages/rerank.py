"""rerank: rescore the best candidates with a cross-encoder and put them in its order."""

from __future__ import annotations

import math
from typing import Protocol

from app.retrieval.stages._common import ReplayFacts, format_pair, with_score
from app.retrieval.types import SCORE_RERANK, Candidate, QueryContext, Removal, StageOutcome
from app.settings import RerankSettings

SKIPPED_NO_MODEL = "skipped: no reranker model"
SKIPPED_NO_SCORES = "skipped: the reranker returned no scores"


class PassageScorer(Protocol):
    def score(self, query: str, passages: list[str]) -> list[float] | None: ...


class RerankStage:
    """Scores the first `top_n` candidates (current order) with the injected scorer and writes `rerank`.

    Those are sorted by rerank descending (ties keep their previous order); the rest follow unchanged and get
    no rerank score. `min_score` drops rescored candidates below it (`rerank=-3.10 < 0.00`).
    No scorer, or a scorer that returns None, leaves the list untouched and says so in `skipped`.
    """

    name = "rerank"

    def __init__(self, settings: RerankSettings, scorer: PassageScorer | None):
        if scorer is not None and not callable(getattr(scorer, "score", None)):
            raise TypeError(
                f"rerank: the scorer must have .score(query, passages), got {type(scorer).__name__}"
            )
        self.settings = settings
        self.scorer = scorer

    def replay_facts(self) -> ReplayFacts:
        """It writes `rerank`; without a scorer it hands its input on as it is."""
        return ReplayFacts(writes_scores=True, passes_through=self.scorer is None)

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        if self.scorer is None:
            return StageOutcome(kept=list(candidates), skipped=SKIPPED_NO_MODEL)
        if not candidates:
            return StageOutcome(kept=[], score_key=SCORE_RERANK)
        head, tail = candidates[: self.settings.top_n], candidates[self.settings.top_n :]
        values = self.scorer.score(query.text, [c.text for c in head])
        if values is None:
            return StageOutcome(kept=list(candidates), skipped=SKIPPED_NO_SCORES)
        if len(values) != len(head):
            raise RuntimeError(f"rerank: the scorer returned {len(values)} scores for {len(head)} passages")

        bad = [c.chunk_id for c, v in zip(head, values, strict=True) if not math.isfinite(v)]
        if bad:
            raise RuntimeError(f"rerank: the scorer returned a non-finite score for {bad[0]!r}")
        rescored = [with_score(c, SCORE_RERANK, float(v)) for c, v in zip(head, values, strict=True)]
        rescored.sort(key=lambda c: -c.scores[SCORE_RERANK])  # stable: ties keep the previous order
        kept: list[Candidate] = []
        removed: list[Removal] = []
        floor = self.settings.min_score
        for candidate in rescored:
            value = candidate.scores[SCORE_RERANK]
            if floor is not None and value < floor:
                shown, bound = format_pair(value, floor)
                removed.append(Removal(candidate.chunk_id, candidate.doc_id, f"rerank={shown} < {bound}"))
            else:
                kept.append(candidate)
        return StageOutcome(
            kept=kept + list(tail), removed=removed, score_key=SCORE_RERANK, model_inputs=len(head)
        )
