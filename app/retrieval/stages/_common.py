"""Small helpers shared by the stages: reason formatting and score-carrying copies."""

from __future__ import annotations

from app.retrieval.types import Candidate


def format_pair(value: float, bound: float) -> tuple[str, str]:
    """`value` and `bound` with 2 decimals, or as many more as it takes for them to read differently.

    So a removal never reads "0.30 < 0.30" when the value was 0.2999.
    """
    for digits in range(2, 13):
        a, b = f"{value:.{digits}f}", f"{bound:.{digits}f}"
        if a != b:
            return a, b
    return repr(value), repr(bound)


def with_score(candidate: Candidate, key: str, value: float) -> Candidate:
    """A copy of `candidate` with one more score; the input is left as it was.

    Stages copy instead of writing into the candidate, so raw candidates reused for another run of the chain
    (another configuration, the fallback's refill) never carry scores from a stage that did not run there.
    """
    return candidate.with_scores({**candidate.scores, key: value})
