"""The one registry of the report's measures: each with its JSON key, its label, its digits, its direction and
a one-line definition; every table, tile, comparison and log line takes its measure names from here.

Names: a measure at a cut-off is written as ir_measures writes one, `<Name>@<K>` (`nDCG@10`). The names are
those the reports show (`Recall@10`, `MRR@10`, `Precision@10`, `HitRate@10`), chosen over ir_measures'
short names so a reader of an older report finds the same words; `Measure.ir_measures` gives the
ir_measures name of the same quantity where there is one (`R`, `RR`, `P`, `Success`, `nDCG`, `Judged`), so
`Recall@10` here is ir_measures' `R@10`. When the cases carry their own K the label is `<Name>@K` ("at each
case's K"); a measure without a cut-off (`Top1Accuracy`) is written bare.

The registry computes, as ir_measures' and ranx's do: a measure scored per case carries its function
(`Measure.score`, over one case's `Ranking`), and `table` fills a case's table {key: value} from it.
What reads a measure finds it by its roles: the tuples `RANKING`, `HEADLINE`, `COMPARED`, `AFTER_STAGE`,
`GATED`, `POINT` and `TUNE` are derived from the registry, so a measure registered once (`registered`) is
computed, summarised, compared, gated and shown wherever its roles say, in registry order. A reader takes a
role tuple as `measures.<ROLE>` (or `with_role`) when it runs, never a copy made at import, and never picks
measures by their position in a tuple. A measure is a key, never a field: what holds figures of several
measures holds them by key.

The roles depend on one another, and `check_roles` refuses a measure whose roles do not hold together: a
gated measure is compared (the gate reads the comparison's rows), a compared one is a headline figure (the
comparison pairs the cases' tables), a measure of the tune table is a point figure, and a measure read off
a ranked list (`ranking`, `headline`, `afterStage`) has its per-case function.

The formulas, the duplicate and empty-case conventions and their reference tests live with the functions in
`app.evaluation.scoring.metrics`; the definitions below are their one-line summaries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from app.evaluation.scoring import metrics
from app.evaluation.scoring.metrics import Gain, Rank, RelevanceMaps

Direction = Literal["higher", "lower"]
Aggregation = Literal["mean"]
# What a measure is read for: "ranking" a figure of a case with relevant documents, also at each extra
# cut-off and on the condensed list; "headline" in the summary and a case's `metrics`; "compared" tested
# by the paired comparison; "afterStage" a figure of the list after each stage; "gated" a gate's drop
# check against the baseline (and a column of the segments' tables); "point" a figure of a tune point
# (the tune JSON, its gains and means); "tune" a column of the tune table and of the report's threshold
# sweep.
Role = Literal["ranking", "headline", "compared", "afterStage", "gated", "point", "tune"]


@dataclass(frozen=True)
class Ranking:
    """What a per-case measure reads: one case's ranked list as matched (`ranks`, best first; a measure cuts
    it at `k`), its relevance maps (one per alternative), the texts aligned with `ranks` (the duplicate rate
    reads them), nDCG's `gain` and the ids that carry a judgment of any grade."""

    ranks: Sequence[Rank]
    relevance: RelevanceMaps
    k: int
    texts: Sequence[str] | None = None
    gain: Gain = "linear"
    judged: Collection[str] = frozenset()


def _best(measure: Callable[..., float]) -> Callable[[Ranking], float]:
    """The per-case function of `measure` at K: the best over the case's alternatives
    (`metrics.best_alternative`)."""
    return lambda r: metrics.best_alternative(measure, r.ranks, r.relevance, r.k)


def _ndcg(r: Ranking) -> float:
    return metrics.best_alternative(metrics.ndcg_at_k, r.ranks, r.relevance, r.k, gain=r.gain)


def _top1(r: Ranking) -> float:
    return metrics.best_alternative(metrics.hit_rate_at_k, r.ranks, r.relevance, 1)


def _duplicates(r: Ranking) -> float:
    return metrics.duplicate_rate_at_k(r.ranks, r.k, r.texts)


def _judged(r: Ranking) -> float:
    return metrics.judged_at_k(r.ranks, r.judged, r.k)


@dataclass(frozen=True)
class Measure:
    """One measure: `key` is its JSON key in `summary`, a case's `metrics` and `comparison.metrics`;
    `name` its ir_measures-style name; `at_k` whether it is cut at K; `direction`: whether more is better;
    `score` its per-case function (None for a measure taken over something else than one ranking: the
    no-answer cases, the evidence groups); `aggregation` how the cases' values make the run's figure;
    `roles` what reads it (`Role`); `column` its header in a narrow table (the tune table) when shorter
    than `name`."""

    key: str
    name: str
    ir_measures: str | None
    at_k: bool
    digits: int
    direction: Direction
    definition: str
    score: Callable[[Ranking], float] | None = None
    roles: frozenset[Role] = field(default_factory=frozenset)
    aggregation: Aggregation = "mean"
    column: str | None = None

    def label(self, k_text: str = "") -> str:
        """`nDCG@5` for `k_text` "@5"; the bare name for a measure without a cut-off."""
        return f"{self.name}{k_text}" if self.at_k else self.name

    def header(self) -> str:
        """Its header in a narrow table: `column`, else its bare name."""
        return self.column or self.name

    def format(self, value: float | None) -> str:
        return fmt(value, self.digits)


_GAUGED: frozenset[Role] = frozenset({"ranking", "headline", "compared", "gated", "point", "tune"})

MEASURES: tuple[Measure, ...] = (
    Measure(
        "recall",
        "Recall",
        "R",
        True,
        3,
        "higher",
        "|relevant ids the top K returns| / |relevant ids| (each relevant id counted once; at chunk level a "
        "rank returns its attached chunks too)",
        score=_best(metrics.recall_at_k),
        roles=_GAUGED | {"afterStage"},
    ),
    Measure(
        "hitRate",
        "HitRate",
        "Success",
        True,
        3,
        "higher",
        "1 when at least one relevant id is in the top K, else 0",
        score=_best(metrics.hit_rate_at_k),
        roles=_GAUGED,
    ),
    Measure(
        "mrr",
        "MRR",
        "RR",
        True,
        3,
        "higher",
        "1 / rank of the first relevant id in the top K (0 when there is none)",
        score=_best(metrics.mrr_at_k),
        roles=_GAUGED | {"afterStage"},
    ),
    Measure(
        "ndcg",
        "nDCG",
        "nDCG",
        True,
        3,
        "higher",
        "Σ gain / log2(rank + 1) over the first hits of relevant ids in the top K, divided by the same sum "
        "of the ideal ranking (the gains sorted, cut at K); gain = grade, or 2^grade − 1 with "
        "rag.evaluate.gain: exponential",
        score=_ndcg,
        roles=_GAUGED | {"afterStage"},
    ),
    Measure(
        "precision",
        "Precision",
        "P",
        True,
        3,
        "higher",
        "|relevant ids in the top K, first occurrences| / K (a duplicate keeps its slot)",
        score=_best(metrics.precision_at_k),
        roles=frozenset({"ranking", "headline", "compared"}),
    ),
    Measure(
        "top1Accuracy",
        "Top1Accuracy",
        None,
        False,
        3,
        "higher",
        "1 when the first result is relevant, else 0",
        score=_top1,
        roles=frozenset({"headline", "compared"}),
    ),
    Measure(
        "duplicateRate",
        "DuplicateRate",
        None,
        True,
        3,
        "lower",
        "share of the top K that repeats a higher-ranked id or its normalised text",
        score=_duplicates,
        roles=frozenset({"headline"}),
    ),
    Measure(
        "judged",
        "Judged",
        "Judged",
        True,
        3,
        "higher",
        "share of the top K that carries a judgment (relevant or not) in the golden set",
        score=_judged,
        roles=frozenset({"afterStage"}),
    ),
    Measure(
        "correctAbstention",
        "CorrectAbstention",
        None,
        False,
        3,
        "higher",
        "over the no-answer cases: the share where the chain returned nothing",
        roles=frozenset({"point", "tune"}),
        column="Correct abst.",
    ),
    Measure(
        "falseAnswerRate",
        "FalseAnswerRate",
        None,
        False,
        3,
        "lower",
        "over the no-answer cases: the share where the chain returned documents (1 − CorrectAbstention)",
        roles=frozenset({"point", "tune"}),
        column="False answer",
    ),
    Measure(
        "evidenceRecall",
        "EvidenceRecall",
        None,
        True,
        3,
        "higher",
        "max over the case's evidence groups G of |G ∩ items the top K returns| / |G|: a chunk id when a "
        "returned chunk (or one attached to it) is that chunk, a quote when the returned chunks' spans "
        "cover it (rag.evaluate.evidence_coverage of its characters)",
    ),
    Measure(
        "evidenceHit",
        "EvidenceHit",
        None,
        True,
        3,
        "higher",
        "1 when some evidence group is wholly among the items the top K returns, else 0",
    ),
    Measure(
        "evidenceCharRecall",
        "EvidenceCharRecall",
        None,
        True,
        3,
        "higher",
        "|E ∩ R| / |E|: the evidence characters the top K returns over the evidence characters, E the spans "
        "of the best-covered evidence group and R those of the returned chunks (attached ones included), "
        "each character once",
    ),
    Measure(
        "charPrecision",
        "CharPrecision",
        None,
        True,
        3,
        "higher",
        "|E ∩ R| / |R|: the evidence characters the top K returns over the characters it returns (a big "
        "chunk cannot win by overlap alone)",
    ),
)

BY_KEY: dict[str, Measure] = {m.key: m for m in MEASURES}

# role -> the roles a measure playing it must play too (see the module docstring)
_IMPLIES: dict[Role, frozenset[Role]] = {
    "gated": frozenset({"compared"}),
    "compared": frozenset({"headline"}),
    "tune": frozenset({"point"}),
}
_SCORED: frozenset[Role] = frozenset({"ranking", "headline", "afterStage"})


def check_roles(measure: Measure) -> None:
    """Refuse (`ValueError`, naming the measure and the role) a measure whose roles do not hold together:
    each role of `_IMPLIES` needs its companions, and a measure read off a ranked list its `score`."""
    for role in sorted(measure.roles):
        missing = _IMPLIES.get(role, frozenset()) - measure.roles
        if missing:
            raise ValueError(
                f"measure {measure.key!r}: role {role!r} needs role(s) {', '.join(sorted(missing))} too"
            )
        if role in _SCORED and measure.score is None:
            raise ValueError(f"measure {measure.key!r}: role {role!r} needs a per-case function (score)")


def _check_registry() -> None:
    for m in MEASURES:
        check_roles(m)


_check_registry()


def with_role(role: Role) -> tuple[str, ...]:
    """The keys of the registered measures that play `role`, in registry order (the order every table
    shows them)."""
    return tuple(m.key for m in MEASURES if role in m.roles)


# The ranking measures of a case with relevant documents, in the order every table shows them.
RANKING = with_role("ranking")
# The headline measures of a run (the summary, and a case's `metrics`).
HEADLINE = with_role("headline")
# What the paired comparison tests (duplicates are a property of the chain, not of relevance).
COMPARED = with_role("compared")
# The measures of the list after each stage.
AFTER_STAGE = with_role("afterStage")
# The measures the gate checks for a drop against the baseline (`rag.evaluate.thresholds.max_drop`).
GATED = with_role("gated")
# The measures of a tune point that are the registry's (a point adds counts of its own).
POINT = with_role("point")
# The measures the tune table and the report's threshold sweep show, one column each.
TUNE = with_role("tune")


def _derive() -> None:
    """Rebuild the registry's index and its role tuples from `MEASURES`."""
    global RANKING, HEADLINE, COMPARED, AFTER_STAGE, GATED, POINT, TUNE
    BY_KEY.clear()
    BY_KEY.update((m.key, m) for m in MEASURES)
    RANKING, HEADLINE, COMPARED = with_role("ranking"), with_role("headline"), with_role("compared")
    AFTER_STAGE, GATED, POINT = with_role("afterStage"), with_role("gated"), with_role("point")
    TUNE = with_role("tune")


@contextmanager
def registered(extra: Measure) -> Iterator[Measure]:
    """`extra` added to the registry (after the others) for the duration of the block, then removed: the
    one place a test registers a measure. Code that reads a role tuple reads it as `measures.<ROLE>` at call
    time, so it sees the measure while the block runs."""
    global MEASURES
    if extra.key in BY_KEY:
        raise ValueError(f"a measure with key {extra.key!r} is registered already")
    check_roles(extra)
    before = MEASURES
    MEASURES = (*before, extra)
    _derive()
    try:
        yield extra
    finally:
        MEASURES = before
        _derive()


def table(ranking: Ranking, keys: Sequence[str]) -> dict[str, float]:
    """One case's table {measure key: value}: each of `keys` scored by its `Measure.score`, in the order of
    `keys`.

    Raises `metrics.UndefinedMetricError` when a measure of relevance meets a case without a relevant id
    (check `metrics.has_relevant_alternative` first), `ValueError` for a K < 1."""
    metrics.check_k(ranking.k)
    return {key: _scorer(key)(ranking) for key in keys}


def case_metrics(
    ranked_ids: Sequence[Rank],
    relevance: RelevanceMaps,
    k: int,
    texts: Sequence[str] | None = None,
    gain: Gain = "linear",
) -> dict[str, float]:
    """A case's `metrics`: the `table` of the `HEADLINE` measures at K (recall, hitRate, mrr, ndcg,
    precision, top1Accuracy, duplicateRate). Each ranking measure is the best over the alternatives
    (`metrics.best_alternative`; `relevance` is one map or one per alternative); `texts`, aligned with
    `ranked_ids`, lets the duplicate rate count content duplicates; `gain` is nDCG's.

    Raises `metrics.UndefinedMetricError` when the case has no relevant id (check
    `metrics.has_relevant_alternative` first)."""
    return table(Ranking(ranked_ids, relevance, k, texts, gain), HEADLINE)


def _scorer(key: str) -> Callable[[Ranking], float]:
    score = BY_KEY[key].score
    if score is None:
        raise ValueError(f"measure {key!r} is not scored per case")
    return score


def measure(key: str) -> Measure:
    return BY_KEY[key]


def snake_name(key: str) -> str:
    """The measure's key as a settings field names it: "hitRate" -> "hit_rate"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def label(key: str, k_text: str = "") -> str:
    """The label of the measure with JSON key `key` (an unknown key is shown as itself)."""
    m = BY_KEY.get(key)
    return m.label(k_text) if m else key


def k_label(k: int | str | None, mixed: bool = False) -> str:
    """ "@5" when every case was scored at the run's K; "@K" when cases carry their own topK (the report then
    says "at each case's K")."""
    return "@K" if mixed or k is None else f"@{k}"


def fmt(value: float | None, digits: int = 3) -> str:
    """The one number format of the reports: fixed `digits` decimals, "n/a" for a missing value."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def fmt_p(value: float | None) -> str:
    """A p-value in two significant digits (0.19, 0.0012, 1), "< 0.001" below 0.001, "n/a" when there is
    none."""
    if value is None:
        return "n/a"
    return "< 0.001" if value < 0.001 else f"{value:.2g}"
