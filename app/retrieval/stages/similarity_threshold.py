"""similarity_threshold: drop candidates whose dense (cosine) score is below the threshold for their tag."""

from __future__ import annotations

from app.retrieval.stages._common import ReplayFacts, format_pair
from app.retrieval.types import SCORE_DENSE, Candidate, QueryContext, Removal, StageOutcome
from app.settings import SimilarityThresholdSettings


class SimilarityThresholdStage:
    """Keeps a candidate when dense >= threshold (equal is kept).

    threshold = `per_knowledge_tag[candidate.knowledge_tag]` when the tag is listed, else `min_dense`.
    A candidate without a dense score is kept without comment (the candidate generator gives every
    candidate one).
    """

    name = "similarity_threshold"

    def __init__(self, settings: SimilarityThresholdSettings):
        # SimilarityThresholdSettings holds every threshold to a finite cosine in [-1, 1] at load time.
        self.settings = settings

    def replay_facts(self) -> ReplayFacts:
        """It only drops candidates, each by its own dense score."""
        return ReplayFacts()

    def threshold_for(self, candidate: Candidate) -> float:
        tag = candidate.knowledge_tag
        if tag is not None and tag in self.settings.per_knowledge_tag:
            return self.settings.per_knowledge_tag[tag]
        return self.settings.min_dense

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        kept: list[Candidate] = []
        removed: list[Removal] = []
        per_tag = bool(self.settings.per_knowledge_tag)
        for candidate in candidates:
            dense = candidate.scores.get(SCORE_DENSE)
            threshold = self.threshold_for(candidate) if per_tag else self.settings.min_dense
            if dense is not None and dense < threshold:
                shown, bound = format_pair(dense, threshold)
                removed.append(Removal(candidate.chunk_id, candidate.doc_id, f"dense={shown} < {bound}"))
            else:
                kept.append(candidate)
        return StageOutcome(kept=kept, removed=removed, score_key=SCORE_DENSE)
