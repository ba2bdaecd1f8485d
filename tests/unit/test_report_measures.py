"""The measure registry: one entry per JSON key, labels as the reports print them, the number formats, and
each definition checked against the value the scoring functions compute, written as arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.measures import BY_KEY, MEASURES, fmt, fmt_ms, fmt_p, k_label, label


def test_every_measure_has_one_key_a_name_a_direction_and_a_definition() -> None:
    keys = [m.key for m in MEASURES]
    assert len(keys) == len(set(keys)) == len(BY_KEY)
    for m in MEASURES:
        assert m.name and m.definition and m.digits == 3
        assert m.direction in ("higher", "lower")
    assert [m.key for m in MEASURES if m.direction == "lower"] == ["duplicateRate", "falseAnswerRate"]


def test_the_lists_the_report_uses_are_registry_keys() -> None:
    for group in (measures.RANKING, measures.HEADLINE, measures.COMPARED, measures.AFTER_STAGE):
        assert all(key in BY_KEY for key in group)
    assert measures.RANKING == ("recall", "hitRate", "mrr", "ndcg", "precision")
    assert measures.HEADLINE == (*measures.RANKING, "top1Accuracy", "duplicateRate")
    assert measures.GATED == ("recall", "hitRate", "mrr", "ndcg")
    assert measures.POINT == measures.TUNE == (*measures.GATED, "correctAbstention", "falseAnswerRate")
    for m in MEASURES:
        measures.check_roles(m)


@pytest.mark.parametrize(
    ("key", "k_text", "expected"),
    [
        ("ndcg", "@10", "nDCG@10"),
        ("recall", "@5", "Recall@5"),
        ("mrr", "@K", "MRR@K"),
        ("precision", "@3", "Precision@3"),
        ("judged", "@5", "Judged@5"),
        ("top1Accuracy", "@5", "Top1Accuracy"),
        ("correctAbstention", "@5", "CorrectAbstention"),
        ("somethingElse", "@5", "somethingElse"),
    ],
)
def test_labels(key: str, k_text: str, expected: str) -> None:
    assert label(key, k_text) == expected


def test_ir_measures_names_of_the_ranking_measures() -> None:
    assert {k: BY_KEY[k].ir_measures for k in measures.RANKING} == {
        "recall": "R",
        "hitRate": "Success",
        "mrr": "RR",
        "ndcg": "nDCG",
        "precision": "P",
    }


def test_k_label_and_number_formats() -> None:
    assert (k_label(5), k_label(5, mixed=True), k_label(None)) == ("@5", "@K", "@K")
    assert (fmt(None), fmt(0.12345), fmt(2.5, 2), fmt(1)) == ("n/a", "0.123", "2.50", "1.000")
    assert (fmt_ms(None), fmt_ms(19.6)) == ("n/a", "20 ms")
    assert [fmt_p(p) for p in (None, 0.0004, 0.0012, 0.19, 1.0)] == ["n/a", "< 0.001", "0.0012", "0.19", "1"]
    assert BY_KEY["ndcg"].format(0.97827) == "0.978"


def test_definitions_agree_with_the_scoring_functions() -> None:
    # ranked x, a, a (duplicate), b at K=4; relevant a (grade 1), b (grade 2), c (grade 1)
    ranked = ["x", "a", "a", "b"]
    relevance = {"a": 1.0, "b": 2.0, "c": 1.0, "x": 0.0}
    got = measures.case_metrics(ranked, relevance, 4)
    assert set(got) == set(measures.HEADLINE)
    expected = {
        # |{a, b}| / |{a, b, c}|
        "recall": 2 / 3,
        # a relevant id in the top 4
        "hitRate": 1.0,
        # first relevant at rank 2
        "mrr": 1 / 2,
        # first hits a at rank 2 (gain 1), b at rank 4 (gain 2); ideal grades 2, 1, 1 at ranks 1..3
        "ndcg": (1 / math.log2(3) + 2 / math.log2(5))
        / (2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)),
        # first occurrences of relevant ids over K slots (the duplicate keeps its slot)
        "precision": 2 / 4,
        # x is not relevant
        "top1Accuracy": 0.0,
        # rank 3 repeats rank 2
        "duplicateRate": 1 / 4,
    }
    assert got == pytest.approx(expected)
    # Judged@K: the share of the top K carrying a judgment (x, a, a, b all judged here; y is not)
    assert metrics.judged_at_k(["x", "y", "a"], set(relevance), 3) == pytest.approx(2 / 3)
    # EvidenceRecall@K: max over groups of the share of the group among the returned chunks
    groups = [{"c1", "c2"}, {"c3"}]
    assert metrics.evidence_recall_at_k([["c1"], ["z"]], groups, 2) == pytest.approx(max(1 / 2, 0 / 1))
    assert metrics.evidence_hit_at_k([["z", "c3"]], groups, 1) == 1.0


def test_docs_report_lists_every_measure_as_the_registry_defines_it() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text(encoding="utf-8")
    block = docs.split("<!-- measures:")[1].split("<!-- end of measures -->")[0]
    lines = [line for line in block.splitlines() if line.startswith("- ")]
    expected = []
    for m in MEASURES:
        names = f"`{m.key}`" + (f"; ir_measures `{m.ir_measures}`" if m.ir_measures else "")
        direction = "higher is better" if m.direction == "higher" else "lower is better"
        expected.append(f"- **{m.label('@K')}** ({names}; {direction}): {m.definition}")
    assert lines == expected
