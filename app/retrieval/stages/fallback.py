"""fallback: when too few candidates survive, add back the best raw ones the business rules allow."""

from __future__ import annotations

from app.retrieval.stages._common import ReplayFacts, Rule
from app.retrieval.types import SCORE_DENSE, Candidate, QueryContext, StageOutcome
from app.settings import FallbackSettings


class FallbackStage:
    """If enabled and fewer than `min_results` remain, append raw candidates (best dense first, ties in
    candidate order) that are neither present nor removed by `hard_filter`, until `min_results` is reached.

    Added candidates go at the end of `kept` and in `added`; nothing is ever removed. Refilled candidates are
    the raw ones, so they carry only the scores they had before the chain (`dense`).
    """

    name = "fallback"

    def __init__(
        self,
        settings: FallbackSettings,
        rules: Rule | None = None,
    ):
        self.settings = settings
        # the hard filter's rules (HardFilterStage.reason): a refill must pass them even when an earlier
        # stage removed the candidate before the hard filter could see it
        self.rules = rules

    def replay_facts(self) -> ReplayFacts:
        """It brings back raw candidates (a new source of scores) and leaves a list of `min_results` or more
        as it is; what it brings back depends on the hard filter's settings and removals, and on its
        rules."""
        settings = self.settings
        return ReplayFacts(
            writes_scores=True,
            passes_from=settings.min_results if settings.enabled else 0,
            reads=("hard_filter",),
            reads_removals=("hard_filter",),
            rule=self.rules,
            rule_key="hard_filter",
            with_rule=lambda rule: FallbackStage(settings, rule),
        )

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        need = self.settings.min_results - len(candidates)
        if not self.settings.enabled or need <= 0:
            return StageOutcome(kept=list(candidates), score_key=SCORE_DENSE)
        barred = {c.chunk_id for c in candidates}
        barred |= {r.chunk_id for r in query.removed_by_stage.get("hard_filter", [])}
        pool: list[Candidate] = []
        for candidate in query.raw_candidates:
            if candidate.chunk_id not in barred and (
                self.rules is None or self.rules(query, candidate) is None
            ):
                barred.add(candidate.chunk_id)  # once each, even if the raw list repeats it
                pool.append(candidate)
        pool.sort(key=lambda c: -c.scores.get(SCORE_DENSE, float("-inf")))  # stable
        added = pool[:need]
        return StageOutcome(kept=list(candidates) + added, added=added, score_key=SCORE_DENSE)
