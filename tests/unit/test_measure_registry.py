"""Adding a measure is one registry entry: a measure registered in one place (`measures.registered`) is
computed per case and shows in the summary, the comparison, the Markdown and the JSON of a report built from
fake cases; once the block ends it is gone again.

AP@K, registered with the roles of a gated measure shown in the tune table, is the worked example: its
function (written here, with its formula, a reference test and a cross-check against trec_eval), one
`Measure`, and it is in the tune table, the comparison's rows and the gate's drop checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.compare.gate import check_gate
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.html import report_page
from app.evaluation.render.markdown import render_markdown
from app.evaluation.render.tune import tune_markdown
from app.evaluation.report.model import Report
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import KnownIds, evaluate
from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.measures import Measure, Ranking
from app.evaluation.scoring.metrics import Rank
from app.evaluation.tune.grid import run_holdout, run_split
from app.evaluation.tune.model import HoldoutParts, HoldoutSplit
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace
from app.settings import EvaluateThresholds
from tests.fixtures.tiny_replay import tiny, tiny_document, tiny_settings


def half_recall(r: Ranking) -> float:
    """A made-up measure: half the case's Recall@K."""
    return 0.5 * metrics.best_alternative(metrics.recall_at_k, r.ranks, r.relevance, r.k)


HALF_RECALL = Measure(
    "halfRecall",
    "HalfRecall",
    None,
    True,
    3,
    "higher",
    "Recall@K / 2",
    score=half_recall,
    roles=frozenset({"headline", "compared"}),
)

# query -> the documents the chain returns, best first; every case expects document B
BEFORE = {"q1": ["A", "B", "C"], "q2": ["A", "C", "D"], "q3": ["B", "A", "C"]}
AFTER = {"q1": ["B", "A", "C"], "q2": ["B", "C", "D"], "q3": ["A", "C", "D"]}
KNOWN = KnownIds(doc={"A", "B", "C", "D"}, chunk={"cA", "cB", "cC", "cD"}, source=set())


class ListChain:
    """Returns, for each query, the documents `finals` names (one chunk each), with no stage."""

    stage_names: list[str] = []

    def __init__(self, finals: dict[str, list[str]]) -> None:
        self.finals = finals

    def retrieve_many(self, requests, today=None, on_result=None):
        out = []
        for i, request in enumerate(requests):
            docs = [
                Candidate(chunk_id=f"c{d}", doc_id=d, text=f"text of {d}", metadata={})
                for d in self.finals[request.query]
            ]
            trace = RetrievalTrace(ranked_after={"candidates": [d.chunk_id for d in docs]})
            result = RetrievalResult(request.query, docs[: request.top_k], len(docs), False, trace, 1.0, docs)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def report_of(finals: dict[str, list[str]], expected: Sequence[str] = ("B",)) -> Report:
    golden = GoldenSet(
        dataset_version="t",
        cases=[
            GoldenCase.model_validate({"id": query, "query": query, "expectedDocIds": list(expected)})
            for query in finals
        ],
        path="golden.json",
    )
    evaluation = evaluate(ListChain(finals), golden, 3, KNOWN, today=date(2030, 1, 2))
    return measure_report(evaluation, {"evaluatedAt": "2030-01-02T00:00:00+00:00"})


def test_a_measure_registered_once_is_in_the_summary_the_comparison_the_markdown_and_the_json() -> None:
    with measures.registered(HALF_RECALL):
        before = report_of(BEFORE)
        after = report_of(AFTER)
        comparison = compare_reports(before, after, "baseline.json")
        report = after.model_copy(update={"comparison": comparison})
        markdown = render_markdown(report, case_detail=True)
        view = report.to_json()

    # per case: Recall@3 is 1 where B is in the top 3, else 0
    assert [c["metrics"]["halfRecall"] for c in view["cases"]] == [0.5, 0.5, 0.0]
    assert view["summary"]["halfRecall"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert report.summary is not None and report.summary.figure("halfRecall") == pytest.approx(1 / 3)
    # before: q1 and q3 found B, q2 did not
    row = view["comparison"]["metrics"]["halfRecall"]
    assert (row["baseline"], row["current"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert row["delta"] == pytest.approx(((0.5 - 0.5) + (0.5 - 0.0) + (0.0 - 0.5)) / 3)
    assert "| HalfRecall@3 | 0.333 |" in markdown
    assert "| HalfRecall@3 | 0.333 | 0.333 | +0.000 |" in markdown
    assert [(s["kind"], s["metrics"]["halfRecall"]) for s in view["segments"]] == [
        ("language", pytest.approx(1 / 3)),
        ("origin", pytest.approx(1 / 3)),
    ]


def test_the_registration_ends_with_its_block() -> None:
    with measures.registered(HALF_RECALL):
        assert measures.HEADLINE[-1] == measures.COMPARED[-1] == "halfRecall"
        with pytest.raises(ValueError, match="registered already"):
            with measures.registered(HALF_RECALL):
                pass
    assert "halfRecall" not in measures.BY_KEY
    assert "halfRecall" not in (*measures.HEADLINE, *measures.COMPARED)
    assert "halfRecall" not in report_of(BEFORE).to_json()["summary"]


# -- AP@K: one registry entry plus its function ------------------------------------------------------------


def average_precision_at_k(ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int) -> float:
    """AP@K = (1 / |R|) · Σ_{p = 1..K, p holds a relevant id} P@p,  P@p = |relevant positions <= p| / p.

    R is {id : grade > 0}, grades counted as binary. The sum is divided by |R|, every relevant id, not by
    the relevant ids the top K returns nor by min(|R|, K): a relevant id missing from the top K adds a
    precision of 0 (trec_eval's `map_cut_K` for one query). Positions follow `metrics`' conventions, as
    Precision@K places them: a relevant id counts at the first rank that returns it, a duplicate keeps its
    position and earns nothing. Raises `UndefinedMetricError` when R is empty.
    """
    metrics.check_k(k)
    relevant = metrics.relevant_ids(relevance)
    total, before = 0.0, 0
    for p in range(1, k + 1):
        found = round(metrics.precision_at_k(ranked_ids, relevance, p) * p)  # relevant positions <= p
        if found > before:
            total += found / p
        before = found
    return total / len(relevant)


AP = Measure(
    "ap",
    "AP",
    "AP",
    True,
    3,
    "higher",
    "Σ over the positions p <= K that hold a relevant id of P@p, divided by |relevant ids|",
    score=lambda r: metrics.best_alternative(average_precision_at_k, r.ranks, r.relevance, r.k),
    roles=frozenset({"headline", "compared", "gated", "point", "tune"}),
)


def test_average_precision_at_k_by_hand() -> None:
    four = {"d1": 1, "d2": 1, "d3": 1, "d4": 1}
    ranked = ["d1", "x", "d2", "y", "d3"]
    assert average_precision_at_k(ranked, four, 5) == pytest.approx((1 / 1 + 2 / 3 + 3 / 5) / 4)
    assert average_precision_at_k(ranked, four, 2) == pytest.approx((1 / 1) / 4)
    # a duplicate keeps its position and earns nothing; a grade counts as relevant, whatever its size
    assert average_precision_at_k(["d1", "d1", "d2"], {"d1": 3, "d2": 1}, 3) == pytest.approx(
        (1 / 1 + 2 / 3) / 2
    )
    assert average_precision_at_k(["x", "y"], {"d1": 1}, 2) == 0.0
    with pytest.raises(metrics.UndefinedMetricError):
        average_precision_at_k(["d1"], {"d1": 0}, 1)


DOC_IDS = [f"d{i}" for i in range(8)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(DOC_IDS), unique=True, max_size=len(DOC_IDS)),
    st.dictionaries(st.sampled_from(DOC_IDS), st.integers(min_value=-1, max_value=3), max_size=8),
    st.integers(min_value=1, max_value=10),
)
def test_average_precision_at_k_equals_trec_eval_map_cut(
    ranked: list[str], qrels: dict[str, int], k: int
) -> None:
    if not metrics.has_relevant(qrels):
        return
    cut = ranked[:k]
    evaluator = pytrec_eval.RelevanceEvaluator({"q": qrels}, {f"map_cut.{k}"})
    scores = {doc_id: float(len(cut) - i) for i, doc_id in enumerate(cut)}  # distinct: the order is kept
    expected = evaluator.evaluate({"q": scores}).get("q", {}).get(f"map_cut_{k}", 0.0)
    assert average_precision_at_k(ranked, qrels, k) == pytest.approx(expected, abs=1e-9)


def _cells(markdown: str, first: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header starts with `first`, each as {header: cell}."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    head = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def test_ap_registered_once_is_a_column_of_the_tune_table_after_the_others() -> None:
    recording, grid = tiny()
    thresholds = EvaluateThresholds(min_recall=0.9)
    without = tune_markdown(
        tiny_document(run_split(recording, grid, tiny_settings(), thresholds, 0.005, None))
    )
    with measures.registered(AP):
        assert measures.TUNE[-1] == measures.POINT[-1] == "ap"
        out = run_split(recording, grid, tiny_settings(), thresholds, 0.005, None)
        document = tiny_document(out)
        markdown = tune_markdown(document)
        view = document.to_json()

    param = "similarity_threshold.min_dense"
    # the tune measures in registry order, AP last of them, then the point's counts, the verdict, the front
    assert next(line for line in markdown.splitlines() if line.startswith(f"| {param} |")) == (
        f"| {param} | Recall | HitRate | MRR | nDCG | Correct abst. | False answer | AP | Forbidden | "
        "Mean results | Gate | Pareto |"
    )
    rows, before = _cells(markdown, param), _cells(without, param)
    # every other column is the table without AP, cell for cell
    assert [{h: c for h, c in row.items() if h != "AP"} for row in rows] == before
    # K = 2, one relevant document per case, so AP@2 = 1/rank of it (tests/fixtures/tiny_replay.py)
    assert [row["AP"] for row in rows] == [
        f"{(1 + 1 + 1 / 2 + 1 / 2 + 1) / 5:.3f}",  # 0.0: a2 and a3 find theirs at rank 2
        f"{(1 + 1 + 1 / 2 + 0 + 1) / 5:.3f}",  # 0.55: a3 loses d3
        f"{(1 + 1 + 0 + 0 + 1) / 5:.3f}",  # 0.65: a2 loses d2 too
    ]
    assert [r["metrics"]["ap"] for r in view["rows"]] == pytest.approx([4 / 5, 3.5 / 5, 3 / 5])
    assert "| AP |" not in without


def test_ap_registered_once_has_its_row_gain_and_optimism_in_the_holdout_table() -> None:
    recording, grid = tiny()
    tune, held = ["a1", "a1b", "a4", "n1"], ["a2", "a3", "n2"]
    split = HoldoutSplit(
        seed=42,
        fraction=0.3,
        stratified_by=[],
        groups_together=True,
        parts=HoldoutParts(tuning=tune, held_out=held),
    )
    with measures.registered(AP):
        out = run_holdout(
            recording, grid, tiny_settings(), EvaluateThresholds(min_recall=0.9), 0.005, [tune, held]
        )
        markdown = tune_markdown(tiny_document(out, split))
    # abstention recommends 0.65: AP on tuning 1 -> 1 (gain 0), held out (1/2 + 1/2)/2 -> 0 (gain -0.5):
    # optimism 0 - (-0.5) = +0.5; the row sits after the measures before it, before the counts
    assert "| AP | 1.000 | 1.000 | +0.000 | 0.500 | 0.000 | -0.500 | +0.500 |" in markdown
    table = markdown.split("### Abstention", 1)[1]
    assert [row["Figure"] for row in _cells(table, "Figure")] == [
        "Recall",
        "HitRate",
        "MRR",
        "nDCG",
        "Correct abst.",
        "False answer",
        "AP",
        "Mean results",
        "Forbidden",
        "Gate",
    ]


# Two relevant documents (B and C) per case; AP@3 drops in every case, so the baseline is better
AP_BEFORE = {"q1": ["B", "C", "A"], "q2": ["B", "A", "C"], "q3": ["A", "B", "C"]}
AP_AFTER = {"q1": ["A", "B", "C"], "q2": ["A", "C", "B"], "q3": ["A", "B", "C"]}
AP_BASELINE = ((1 / 1 + 2 / 2) / 2 + (1 / 1 + 2 / 3) / 2 + (1 / 2 + 2 / 3) / 2) / 3
AP_CURRENT = ((1 / 2 + 2 / 3) / 2 + (1 / 2 + 2 / 3) / 2 + (1 / 2 + 2 / 3) / 2) / 3


def _ap_comparison() -> tuple[Report, Report]:
    """The run after the change, and the same with its comparison against the baseline, AP registered."""
    before = report_of(AP_BEFORE, expected=("B", "C"))
    after = report_of(AP_AFTER, expected=("B", "C"))
    return after, after.model_copy(update={"comparison": compare_reports(before, after, "baseline.json")})


def test_ap_registered_once_is_a_row_of_the_comparison() -> None:
    with measures.registered(AP):
        _, report = _ap_comparison()
        markdown = render_markdown(report)
        tiles = [(t.key, t.label) for t in report_page(report).tiles]
    assert report.comparison is not None
    row = report.comparison.metrics["ap"]
    assert (row.baseline, row.current) == (pytest.approx(AP_BASELINE), pytest.approx(AP_CURRENT))
    assert row.delta == pytest.approx(AP_CURRENT - AP_BASELINE)
    assert list(report.comparison.metrics)[-1] == "ap"  # after the compared measures before it
    assert f"| AP@3 | {AP_BASELINE:.3f} | {AP_CURRENT:.3f} | {AP_CURRENT - AP_BASELINE:+.3f} |" in markdown
    assert ("ap", "AP@3") in tiles  # a headline measure is a tile of the HTML report too


def test_ap_registered_once_is_a_drop_check_of_the_gate() -> None:
    with measures.registered(AP):
        _, report = _ap_comparison()
        gate = check_gate(report, EvaluateThresholds())
    check = next(c for c in gate.checks if c.name == "significant_drop.ap")
    assert check.value == pytest.approx(AP_BASELINE - AP_CURRENT)
    # three paired cases cannot make a drop significant (the smallest sign-flip p is 2/2^3): a warning
    assert not check.passed and check.severity == "warn"


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"headline", "gated"}, "role 'gated' needs role\\(s\\) compared"),
        ({"compared"}, "role 'compared' needs role\\(s\\) headline"),
        ({"headline", "compared", "tune"}, "role 'tune' needs role\\(s\\) point"),
    ],
)
def test_roles_that_do_not_hold_together_are_refused_when_registered(roles: set[str], message: str) -> None:
    measure = Measure("odd", "Odd", None, True, 3, "higher", "-", score=AP.score, roles=frozenset(roles))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"measure 'odd': {message}"):
        with measures.registered(measure):
            pass
    assert "odd" not in measures.BY_KEY


def test_a_measure_read_off_a_ranked_list_needs_its_function() -> None:
    measure = Measure("odd", "Odd", None, True, 3, "higher", "-", roles=frozenset({"headline"}))
    with pytest.raises(ValueError, match="role 'headline' needs a per-case function"):
        with measures.registered(measure):
            pass
