"""The one registry of the report's measures: each with its JSON key, its label, its digits, its direction and
a one-line definition; every table, tile, comparison and log line takes its measure names from here.

Names: a measure at a cut-off is written as ir_measures writes one, `<Name>@<K>` (`nDCG@10`). The names are
those the reports show (`Recall@10`, `MRR@10`, `Precision@10`, `HitRate@10`), chosen over ir_measures'
short names so a reader of an older report finds the same words; `Measure.ir_measures` gives the
ir_measures name of the same quantity where there is one (`R`, `RR`, `P`, `Success`, `nDCG`, `Judged`), so
`Recall@10` here is ir_measures' `R@10`. When the cases carry their own K the label is `<Name>@K` ("at each
case's K"); a measure without a cut-off (`Top1Accuracy`) is written bare.

The formulas, the duplicate and empty-case conventions and their reference tests live with the functions in
`app.evaluation.scoring.metrics`; the definitions below are their one-line summaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Direction = Literal["higher", "lower"]


@dataclass(frozen=True)
class Measure:
    """One measure: `key` is its JSON key in `summary`, a case's `metrics` and `comparison.metrics`;
    `name` its ir_measures-style name; `at_k` whether it is cut at K; `higher`: whether more is better."""

    key: str
    name: str
    ir_measures: str | None
    at_k: bool
    digits: int
    direction: Direction
    definition: str

    def label(self, k_text: str = "") -> str:
        """`nDCG@5` for `k_text` "@5"; the bare name for a measure without a cut-off."""
        return f"{self.name}{k_text}" if self.at_k else self.name

    def format(self, value: Any) -> str:
        return fmt(value, self.digits)


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
    ),
    Measure(
        "hitRate",
        "HitRate",
        "Success",
        True,
        3,
        "higher",
        "1 when at least one relevant id is in the top K, else 0",
    ),
    Measure(
        "mrr",
        "MRR",
        "RR",
        True,
        3,
        "higher",
        "1 / rank of the first relevant id in the top K (0 when there is none)",
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
    ),
    Measure(
        "precision",
        "Precision",
        "P",
        True,
        3,
        "higher",
        "|relevant ids in the top K, first occurrences| / K (a duplicate keeps its slot)",
    ),
    Measure(
        "top1Accuracy",
        "Top1Accuracy",
        None,
        False,
        3,
        "higher",
        "1 when the first result is relevant, else 0",
    ),
    Measure(
        "duplicateRate",
        "DuplicateRate",
        None,
        True,
        3,
        "lower",
        "share of the top K that repeats a higher-ranked id or its normalised text",
    ),
    Measure(
        "judged",
        "Judged",
        "Judged",
        True,
        3,
        "higher",
        "share of the top K that carries a judgment (relevant or not) in the golden set",
    ),
    Measure(
        "correctAbstention",
        "CorrectAbstention",
        None,
        False,
        3,
        "higher",
        "over the no-answer cases: the share where the chain returned nothing",
    ),
    Measure(
        "falseAnswerRate",
        "FalseAnswerRate",
        None,
        False,
        3,
        "lower",
        "over the no-answer cases: the share where the chain returned documents (1 − CorrectAbstention)",
    ),
    Measure(
        "evidenceRecall",
        "EvidenceRecall",
        None,
        True,
        3,
        "higher",
        "max over the case's evidence groups G of |G ∩ chunks the top K returns| / |G| "
        "(attached chunks count)",
    ),
    Measure(
        "evidenceHit",
        "EvidenceHit",
        None,
        True,
        3,
        "higher",
        "1 when some evidence group is wholly among the chunks the top K returns, else 0",
    ),
)

BY_KEY: dict[str, Measure] = {m.key: m for m in MEASURES}

# The ranking measures of a case with relevant documents, in the order every table shows them.
RANKING = ("recall", "hitRate", "mrr", "ndcg", "precision")
# The headline measures of a run (the summary, the comparison's paired statistics adds nothing else).
HEADLINE = (*RANKING, "top1Accuracy", "duplicateRate")
# What the paired comparison tests (duplicates are a property of the chain, not of relevance).
COMPARED = (*RANKING, "top1Accuracy")
# The measures of the list after each stage.
AFTER_STAGE = ("recall", "mrr", "ndcg", "judged")


def measure(key: str) -> Measure:
    return BY_KEY[key]


def label(key: str, k_text: str = "") -> str:
    """The label of the measure with JSON key `key` (an unknown key is shown as itself)."""
    m = BY_KEY.get(key)
    return m.label(k_text) if m else key


def k_label(k: int | str | None, mixed: bool = False) -> str:
    """ "@5" when every case was scored at the run's K; "@K" when cases carry their own topK (the report then
    says "at each case's K")."""
    return "@K" if mixed or k is None else f"@{k}"


def fmt(value: Any, digits: int = 3) -> str:
    """The one number format of the reports: fixed `digits` decimals, "n/a" for a missing value."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def fmt_ms(value: Any) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def fmt_p(value: float | None) -> str:
    """A p-value in two significant digits (0.19, 0.0012, 1), "< 0.001" below 0.001, "n/a" when there is
    none."""
    if value is None:
        return "n/a"
    return "< 0.001" if value < 0.001 else f"{value:.2g}"
