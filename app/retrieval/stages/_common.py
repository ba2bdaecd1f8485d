"""Small helpers shared by the stages: reason formatting, score-carrying copies, and what a stage declares
for a replay (`ReplayFacts`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.retrieval.types import Candidate, QueryContext, Stage

Rule = Callable[[QueryContext, Candidate], str | None]


@dataclass(frozen=True)
class ReplayFacts:
    """What a stage declares so that a replay of the chain (`app.evaluation.tune.replay`) can reuse its
    outcomes without knowing the stage by name.

    - `writes_scores`: what it returns carries scores its input did not (scores it writes, or raw
      candidates it brings back), so its output is a new source of scores for the stages after it;
      a stage that only drops or reorders its input declares False.
    - `passes_through`: it hands its input on as it is (cheaper to run than to look up).
    - `prefix_stable`: run over the first n candidates of its input, it keeps exactly the first candidates
      a run over the whole input keeps.
    - `passes_from`: a list of at least this many candidates leaves it unchanged and it reads nothing
      else of it; None when any list may change.
    - `reads`: the `rag.chain` keys, besides its own, whose settings decide its outcome.
    - `reads_removals`: the stages whose removals (`QueryContext.removed_by_stage`) it reads.
    - `rule`: its per-candidate rule, a function of `rule_key`'s settings, the query's knowledge tag and
      date and the candidate alone (None when it has none); `with_rule` builds the same stage deciding
      by another rule of that meaning (the replay passes the rule with its answers kept).
    """

    writes_scores: bool = False
    passes_through: bool = False
    prefix_stable: bool = False
    passes_from: int | None = None
    reads: tuple[str, ...] = ()
    reads_removals: tuple[str, ...] = ()
    rule: Rule | None = None
    rule_key: str = ""
    with_rule: Callable[[Rule], Stage] | None = None


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
