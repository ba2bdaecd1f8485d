"""Reference values for the metrics, each written as the arithmetic of its definition."""

from math import log2

import pytest

from app.evaluation.scoring.measures import case_metrics
from app.evaluation.scoring.metrics import (
    CONVENTIONS,
    UndefinedMetricError,
    best_alternative,
    condensed,
    conventions,
    counted_alternative,
    duplicate_rate_at_k,
    has_relevant,
    has_relevant_alternative,
    hit_counts,
    hit_rate_at_k,
    judged_at_k,
    latency_summary,
    mrr_at_k,
    ndcg_at_k,
    percentile,
    precision_at_k,
    recall_at_k,
    top1_accuracy,
    unjudged_at_k,
)

RANKED = ["d1", "a", "d2", "b", "c", "d3", "d4"]
FIVE_RELEVANT = {"d1": 1, "d2": 1, "d3": 1, "d4": 1, "d5": 1}


def test_recall_at_5_counts_relevant_in_top_5_over_all_relevant():
    assert recall_at_k(RANKED, FIVE_RELEVANT, 5) == pytest.approx(2 / 5)


def test_recall_at_k_larger_than_list_keeps_the_whole_list():
    assert recall_at_k(RANKED, FIVE_RELEVANT, 100) == pytest.approx(4 / 5)


def test_mrr_over_four_queries():
    queries = [
        (["r", "x", "y", "z"], {"r": 1}),  # first relevant at rank 1
        (["x", "r", "y", "z"], {"r": 1}),  # rank 2
        (["x", "y", "z", "r"], {"r": 1}),  # rank 4
        (["x", "y", "z", "w"], {"r": 1}),  # none
    ]
    mrr = sum(mrr_at_k(ranked, rel, 10) for ranked, rel in queries) / len(queries)
    assert mrr == pytest.approx((1 + 0.5 + 0.25 + 0) / 4)
    assert mrr == pytest.approx(0.4375)


def test_mrr_ignores_relevant_below_k():
    assert mrr_at_k(["x", "y", "r"], {"r": 1}, 2) == 0.0
    assert mrr_at_k(["x", "y", "r"], {"r": 1}, 3) == pytest.approx(1 / 3)


def test_ndcg_at_5_binary_relevant_at_ranks_2_and_3_of_3_relevant():
    ranked = ["x", "r1", "r2", "y", "z"]
    relevance = {"r1": 1, "r2": 1, "r3": 1}
    expected = (1 / log2(3) + 1 / log2(4)) / (1 + 1 / log2(3) + 1 / log2(4))
    assert ndcg_at_k(ranked, relevance, 5) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.531, abs=5e-4)


def test_ndcg_graded_uses_grade_as_gain_and_ideal_from_all_judged():
    ranked = ["b", "x", "a"]
    relevance = {"a": 3, "b": 1, "c": 2, "n": 0}
    dcg = 1 / log2(2) + 0 / log2(3) + 3 / log2(4)
    idcg = 3 / log2(2) + 2 / log2(3) + 1 / log2(4)  # a, c, b — c is relevant though never retrieved
    assert ndcg_at_k(ranked, relevance, 3) == pytest.approx(dcg / idcg, abs=1e-12)


def test_ndcg_ideal_is_cut_at_k():
    relevance = {"a": 3, "b": 2, "c": 1}
    assert ndcg_at_k(["b", "a"], relevance, 2) == pytest.approx(
        (2 / log2(2) + 3 / log2(3)) / (3 / log2(2) + 2 / log2(3)), abs=1e-12
    )


def test_ndcg_perfect_ranking_is_one():
    assert ndcg_at_k(["a", "b", "c"], {"a": 2, "b": 1}, 3) == pytest.approx(1.0)


def test_precision_divides_by_k_even_when_fewer_results():
    assert precision_at_k(["r1", "x"], {"r1": 1, "r2": 1}, 5) == pytest.approx(1 / 5)


def test_top1_accuracy():
    assert top1_accuracy(["r", "x"], {"r": 1}) == 1.0
    assert top1_accuracy(["x", "r"], {"r": 1}) == 0.0


def test_grade_zero_or_negative_is_not_relevant():
    relevance = {"z": 0, "n": -1, "r": 2}
    assert recall_at_k(["z", "n"], relevance, 2) == 0.0
    assert mrr_at_k(["z", "n", "r"], relevance, 3) == pytest.approx(1 / 3)
    assert ndcg_at_k(["z", "n", "r"], relevance, 3) == pytest.approx((2 / log2(4)) / (2 / log2(2)))


def test_duplicate_keeps_its_position_and_counts_once():
    ranked = ["c1", "c1", "c2"]
    relevance = {"c1": 1, "c2": 1}
    assert recall_at_k(ranked, relevance, 2) == pytest.approx(1 / 2)  # only c1; c2 is pushed out of the top 2
    assert precision_at_k(ranked, relevance, 2) == pytest.approx(1 / 2)
    assert duplicate_rate_at_k(ranked, 2) == pytest.approx(1 / 2)
    assert recall_at_k(ranked, relevance, 3) == pytest.approx(2 / 2)
    # c2 gains at rank 3, the duplicate at rank 2 gains nothing.
    assert ndcg_at_k(ranked, relevance, 3) == pytest.approx(
        (1 / log2(2) + 1 / log2(4)) / (1 / log2(2) + 1 / log2(3)), abs=1e-12
    )


@pytest.mark.parametrize(
    ("ranked", "k", "expected"),
    [
        ([], 5, 0.0),
        (["a", "b", "c"], 3, 0 / 3),
        (["a", "a", "a"], 3, 2 / 3),
        (["a", "b", "a", "b"], 4, 2 / 4),
        (["a", "b", "a", "b"], 2, 0 / 2),
        (["a", "a"], 10, 1 / 2),  # denominator is the positions present, min(K, len)
    ],
)
def test_duplicate_rate(ranked, k, expected):
    assert duplicate_rate_at_k(ranked, k) == pytest.approx(expected)


def test_empty_ranking_scores_zero():
    relevance = {"r": 1}
    assert case_metrics([], relevance, 5) == {
        "recall": 0.0,
        "hitRate": 0.0,
        "mrr": 0.0,
        "ndcg": 0.0,
        "precision": 0.0,
        "top1Accuracy": 0.0,
        "duplicateRate": 0.0,
    }


def test_case_metrics_has_every_metric():
    ranked = ["x", "r1", "r1", "r2"]
    relevance = {"r1": 2, "r2": 1, "r3": 1}
    assert case_metrics(ranked, relevance, 3) == pytest.approx(
        {
            "recall": 1 / 3,
            "hitRate": 1.0,
            "mrr": 1 / 2,
            "ndcg": (2 / log2(3)) / (2 / log2(2) + 1 / log2(3) + 1 / log2(4)),
            "precision": 1 / 3,
            "top1Accuracy": 0.0,
            "duplicateRate": 1 / 3,
        }
    )


@pytest.mark.parametrize("relevance", [{}, {"a": 0}, {"a": -1, "b": 0}])
@pytest.mark.parametrize(
    "metric", [recall_at_k, hit_rate_at_k, mrr_at_k, ndcg_at_k, precision_at_k, case_metrics]
)
def test_no_relevant_document_is_undefined(metric, relevance):
    assert not has_relevant(relevance)
    with pytest.raises(UndefinedMetricError, match="no relevant document"):
        metric(["a", "b"], relevance, 3)
    with pytest.raises(ValueError):
        top1_accuracy(["a"], relevance)


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_k_must_be_a_positive_int(k):
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(["a"], {"a": 1}, k)
    with pytest.raises(ValueError, match="k must be"):
        duplicate_rate_at_k(["a"], k)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        (list(range(1, 21)), 95, 19),  # ceil(0.95 * 20) = 19th value
        (list(range(1, 21)), 50, 10),  # ceil(0.50 * 20) = 10th value
        ([1, 2, 3, 4], 50, 2),
        ([4, 1, 3, 2], 75, 3),  # unsorted input
        ([1, 2, 3, 4, 5], 50, 3),
        ([7.5], 95, 7.5),
        ([3, 1, 2], 0, 1),
        ([3, 1, 2], 100, 3),
        (list(range(1, 101)), 95, 95),
        (list(range(1, 102)), 95, 96),  # ceil(0.95 * 101) = ceil(95.95) = 96
    ],
)
def test_percentile_nearest_rank(values, p, expected):
    assert percentile(values, p) == expected


@pytest.mark.parametrize(("values", "p"), [([], 50), ([1.0], -1), ([1.0], 101), ([float("nan")], 50)])
def test_percentile_rejects(values, p):
    with pytest.raises(ValueError):
        percentile(values, p)


def test_latency_summary():
    values = [float(v) for v in range(20, 0, -1)]
    assert latency_summary(values) == {"p50": 10.0, "p95": 19.0, "max": 20.0}
    with pytest.raises(ValueError):
        latency_summary([])


def test_conventions_text_states_the_rules():
    for phrase in ["cut at K first", "counts once", "duplicate", "<= 0 is not relevant", "nearest-rank"]:
        assert phrase in CONVENTIONS


@pytest.mark.parametrize(
    ("ranked", "texts", "k", "expected"),
    [
        # the same text under another id (a mirrored page) is a duplicate: 1 of 2 positions
        (["vpn", "vpn-mirror"], ["Connect with GlobalProtect.", "connect  with\nGlobalProtect."], 2, 1 / 2),
        # different texts, different ids: none
        (["a", "b", "c"], ["one", "two", "three"], 3, 0 / 3),
        # an id repeat and a content repeat: 2 of 4
        (["a", "a", "b", "c"], ["x", "y", "z", "x"], 4, 2 / 4),
        # beyond K nothing counts
        (["a", "b", "c"], ["x", "y", "x"], 2, 0 / 2),
        # empty texts are never content duplicates
        (["a", "b"], ["", ""], 2, 0 / 2),
    ],
)
def test_duplicate_rate_counts_content_duplicates(ranked, texts, k, expected):
    assert duplicate_rate_at_k(ranked, k, texts) == pytest.approx(expected)


def test_hit_counts_are_the_numbers_behind_the_ratios():
    relevance = {"a": 1.0, "b": 2.0, "c": 1.0, "x": 0.0}
    assert hit_counts(["z", "b", "b", "a", "c"], relevance, 4) == {
        "expectedCount": 3,
        "hitCount": 2,
        "firstHitRank": 2,
    }
    assert hit_counts(["z"], relevance, 1) == {"expectedCount": 3, "hitCount": 0, "firstHitRank": None}
    assert hit_counts(["z"], {}, 1) == {"expectedCount": 0, "hitCount": 0, "firstHitRank": None}


# -- nDCG's gain -------------------------------------------------------------------------------------------


def test_exponential_gain_is_two_to_the_grade_minus_one_in_dcg_and_ideal():
    ranked = ["b", "x", "a"]
    relevance = {"a": 3, "b": 1, "c": 2, "n": 0}
    dcg = (2**1 - 1) / log2(2) + 0 / log2(3) + (2**3 - 1) / log2(4)
    idcg = (2**3 - 1) / log2(2) + (2**2 - 1) / log2(3) + (2**1 - 1) / log2(4)  # a, c, b
    assert ndcg_at_k(ranked, relevance, 3, gain="exponential") == pytest.approx(dcg / idcg, abs=1e-12)
    # linear: the same ranking with gain = grade
    linear = (1 / log2(2) + 3 / log2(4)) / (3 / log2(2) + 2 / log2(3) + 1 / log2(4))
    assert ndcg_at_k(ranked, relevance, 3) == pytest.approx(linear, abs=1e-12)


def test_binary_judgments_score_the_same_with_either_gain():
    relevance = {"r1": 1, "r2": 1, "r3": 1}
    ranked = ["x", "r1", "r2", "y", "z"]
    expected = (1 / log2(3) + 1 / log2(4)) / (1 + 1 / log2(3) + 1 / log2(4))
    assert ndcg_at_k(ranked, relevance, 5, gain="exponential") == pytest.approx(expected, abs=1e-12)
    assert ndcg_at_k(ranked, relevance, 5, gain="linear") == pytest.approx(expected, abs=1e-12)


def test_case_metrics_pass_the_gain_to_ndcg_only():
    relevance = {"a": 2, "b": 1}
    linear = case_metrics(["b", "a"], relevance, 2)
    exponential = case_metrics(["b", "a"], relevance, 2, gain="exponential")
    assert exponential["ndcg"] == pytest.approx(
        ((2**1 - 1) / log2(2) + (2**2 - 1) / log2(3)) / ((2**2 - 1) / log2(2) + (2**1 - 1) / log2(3))
    )
    assert linear["ndcg"] == pytest.approx((1 / log2(2) + 2 / log2(3)) / (2 / log2(2) + 1 / log2(3)))
    assert {k: v for k, v in exponential.items() if k != "ndcg"} == {
        k: v for k, v in linear.items() if k != "ndcg"
    }


def test_an_unknown_gain_is_refused():
    with pytest.raises(ValueError, match="gain must be one of linear, exponential"):
        ndcg_at_k(["a"], {"a": 1}, 1, gain="log")  # type: ignore[arg-type]


def test_the_conventions_name_the_gain():
    assert "gain = grade" in conventions("linear")
    assert "gain = 2^grade - 1" in conventions("exponential")
    assert CONVENTIONS == conventions("linear")


# -- a rank that returns several ids (a chunk and the chunks attached to it) --------------------------------


def test_a_rank_returns_its_attached_ids_for_every_figure():
    # rank 1 is chunk x with a attached; rank 2 is y: a is found at rank 1
    ranked = [("x", "a"), "y"]
    relevance = {"a": 1, "b": 1}
    assert recall_at_k(ranked, relevance, 2) == pytest.approx(1 / 2)
    assert mrr_at_k(ranked, relevance, 2) == pytest.approx(1 / 1)
    assert hit_rate_at_k(ranked, relevance, 1) == 1.0
    assert ndcg_at_k(ranked, relevance, 2) == pytest.approx((1 / log2(2)) / (1 / log2(2) + 1 / log2(3)))
    assert precision_at_k(ranked, relevance, 2) == pytest.approx(1 / 2)
    assert top1_accuracy(ranked, relevance) == 1.0


def test_several_relevant_ids_of_one_rank_take_consecutive_positions_from_it():
    relevance = {"a": 1, "b": 2, "c": 1}
    # rank 1 returns a and b: b (grade 2) at position 1, a at 2; c at rank 3 -> position 3
    ranked = [("x", "a", "b"), "y", "c"]
    dcg = 2 / log2(2) + 1 / log2(3) + 1 / log2(4)
    idcg = 2 / log2(2) + 1 / log2(3) + 1 / log2(4)
    assert ndcg_at_k(ranked, relevance, 3) == pytest.approx(dcg / idcg)  # = 1: the ideal order
    assert precision_at_k(ranked, relevance, 3) == pytest.approx(3 / 3)
    assert recall_at_k(ranked, relevance, 3) == pytest.approx(3 / 3)
    # rank 2 returns a and b, rank 3 returns c: positions 2, 3 and then 4 > K=3 for c
    later = ["y", ("x", "b", "a"), "c"]
    assert ndcg_at_k(later, relevance, 3) == pytest.approx((2 / log2(3) + 1 / log2(4)) / idcg)
    assert precision_at_k(later, relevance, 3) == pytest.approx(2 / 3)
    assert recall_at_k(later, relevance, 3) == pytest.approx(3 / 3)  # all three are returned in the top 3


def test_recall_counts_every_id_the_top_k_returns_while_ndcg_keeps_k_positions():
    relevance = {"a": 1, "b": 1, "c": 1}
    ranked = [("a", "b")]
    assert recall_at_k(ranked, relevance, 1) == pytest.approx(2 / 3)
    assert ndcg_at_k(ranked, relevance, 1) == pytest.approx((1 / log2(2)) / (1 / log2(2)))
    assert precision_at_k(ranked, relevance, 1) == pytest.approx(1 / 1)


def test_a_rank_of_ids_is_judged_when_one_of_them_is_and_duplicates_compare_own_ids():
    assert judged_at_k([("x", "a"), "y"], {"a"}, 2) == pytest.approx(1 / 2)
    assert unjudged_at_k([("x", "a"), "y"], {"a"}, 2) == ["y"]
    assert condensed([("x", "a"), "y", "b"], {"a", "b"}) == [("x", "a"), "b"]
    assert duplicate_rate_at_k([("x", "a"), "x"], 2) == pytest.approx(1 / 2)


# -- alternatives (anyOf: any one evidence group answers) --------------------------------------------------


def test_each_figure_is_the_best_over_the_alternatives():
    alternatives = [{"a": 1}, {"b": 1}]
    # a at rank 1 answers the first alternative wholly; all required ({a, b}) would give recall 1/2
    assert case_metrics(["a", "x"], alternatives, 2) == pytest.approx(
        {
            "recall": max(1 / 1, 0 / 1),
            "hitRate": 1.0,
            "mrr": 1 / 1,
            "ndcg": max((1 / log2(2)) / (1 / log2(2)), 0.0),
            "precision": max(1 / 2, 0 / 2),
            "top1Accuracy": 1.0,
            "duplicateRate": 0.0,
        }
    )
    assert recall_at_k(["a", "x"], {"a": 1, "b": 1}, 2) == pytest.approx(1 / 2)
    # b at rank 2, a at rank 3: the better-served alternative is b's
    assert best_alternative(ndcg_at_k, ["x", "b", "a"], alternatives, 3) == pytest.approx(
        max(1 / log2(4), 1 / log2(3))
    )


def test_alternatives_share_the_cases_other_expectations():
    # expected document D plus one of two evidence documents
    alternatives = [{"D": 1, "A": 1}, {"D": 1, "B": 1}]
    ranked = ["D", "x", "B"]
    assert best_alternative(recall_at_k, ranked, alternatives, 3) == pytest.approx(max(1 / 2, 2 / 2))
    assert best_alternative(ndcg_at_k, ranked, alternatives, 3) == pytest.approx(
        max(
            (1 / log2(2)) / (1 / log2(2) + 1 / log2(3)),
            (1 / log2(2) + 1 / log2(4)) / (1 / log2(2) + 1 / log2(3)),
        )
    )
    assert hit_counts(ranked, alternatives, 3) == {"expectedCount": 2, "hitCount": 2, "firstHitRank": 1}


def test_counts_follow_the_best_recall_alternative_and_the_first_hit_of_any():
    alternatives = [{"a": 1, "b": 1}, {"c": 1}]
    assert hit_counts(["x", "a", "c"], alternatives, 3) == {
        "expectedCount": 1,
        "hitCount": 1,
        "firstHitRank": 2,
    }
    assert counted_alternative(["x", "a", "c"], alternatives, 3) == 1
    assert counted_alternative(["x"], alternatives, 1) == 0  # a tie (0 and 0): the first


def test_alternatives_without_a_relevant_id_are_undefined():
    with pytest.raises(UndefinedMetricError):
        best_alternative(recall_at_k, ["a"], [{}, {"a": 0}], 1)
    assert not has_relevant_alternative([{}, {"a": 0}])
    assert has_relevant_alternative([{}, {"a": 2}])
