"""Cross-check against trec_eval (through pytrec_eval) on random graded runs without duplicates."""

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from app.evaluation.scoring.metrics import (
    evidence_recall_at_k,
    has_relevant,
    hit_rate_at_k,
    mrr_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)
from app.evaluation.scoring.trec import evaluate_run

DOC_IDS = [f"d{i}" for i in range(12)]


@st.composite
def graded_case(draw):
    ranked = draw(st.lists(st.sampled_from(DOC_IDS), unique=True, max_size=len(DOC_IDS)))
    qrels = draw(
        st.dictionaries(st.sampled_from(DOC_IDS), st.integers(min_value=-1, max_value=3), max_size=10)
    )
    k = draw(st.integers(min_value=1, max_value=15))
    return ranked, qrels, k


def trec_scores(ranked):
    """Distinct, decreasing scores, so that pytrec_eval (which sorts by score) keeps the given order."""
    return {doc_id: float(len(ranked) - i) for i, doc_id in enumerate(ranked)}


@settings(max_examples=300, deadline=None)
@given(graded_case())
def test_metrics_equal_trec_eval_on_the_list_cut_at_k(case):
    ranked, qrels, k = case
    if not has_relevant(qrels):
        return  # undefined by design; trec_eval's mean leaves such queries out too
    cut = ranked[:k]
    measures = {f"recall.{k}", f"ndcg_cut.{k}", f"P.{k}", f"success.{k}", "recip_rank"}
    evaluator = pytrec_eval.RelevanceEvaluator({"q": qrels}, measures)
    # A query with no retrieved document is absent from pytrec_eval's output: every measure is 0 there.
    expected = evaluator.evaluate({"q": trec_scores(cut)}).get("q", {})

    def trec(name):
        return expected.get(name, 0.0)

    assert recall_at_k(ranked, qrels, k) == pytest.approx(trec(f"recall_{k}"), abs=1e-9)
    assert ndcg_at_k(ranked, qrels, k) == pytest.approx(trec(f"ndcg_cut_{k}"), abs=1e-9)
    assert precision_at_k(ranked, qrels, k) == pytest.approx(trec(f"P_{k}"), abs=1e-9)
    assert hit_rate_at_k(ranked, qrels, k) == pytest.approx(trec(f"success_{k}"), abs=1e-9)
    assert mrr_at_k(ranked, qrels, k) == pytest.approx(trec("recip_rank"), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(graded_case())
def test_exponential_gain_equals_trec_eval_on_grades_mapped_to_two_to_the_grade_minus_one(case):
    ranked, qrels, k = case
    if not has_relevant(qrels):
        return
    # trec_eval's ndcg_cut takes the grade as the gain: give it 2^grade - 1 for the relevant grades
    gains = {doc: (2**grade - 1 if grade > 0 else grade) for doc, grade in qrels.items()}
    evaluator = pytrec_eval.RelevanceEvaluator({"q": gains}, {f"ndcg_cut.{k}"})
    expected = evaluator.evaluate({"q": trec_scores(ranked[:k])}).get("q", {}).get(f"ndcg_cut_{k}", 0.0)
    assert ndcg_at_k(ranked, qrels, k, gain="exponential") == pytest.approx(expected, abs=1e-9)


@st.composite
def ranks_with_attached(draw):
    """A ranking whose ranks may return several ids (a chunk and its attached chunks), and graded qrels."""
    ids = draw(st.permutations(DOC_IDS))
    sizes = draw(st.lists(st.integers(min_value=1, max_value=3), max_size=6))
    ranked, start = [], 0
    for size in sizes:
        group = tuple(ids[start : start + size])
        start += size
        if group:
            ranked.append(group[0] if len(group) == 1 else group)
    qrels = draw(
        st.dictionaries(st.sampled_from(DOC_IDS), st.integers(min_value=0, max_value=3), max_size=10)
    )
    return ranked, qrels, draw(st.integers(min_value=1, max_value=8))


@settings(max_examples=300, deadline=None)
@given(ranks_with_attached())
def test_ranks_of_several_ids_keep_every_figure_within_zero_and_one_and_recall_as_evidence_recall(case):
    ranked, qrels, k = case
    if not has_relevant(qrels):
        return
    for gain in ("linear", "exponential"):
        assert 0.0 <= ndcg_at_k(ranked, qrels, k, gain=gain) <= 1.0 + 1e-12
    assert 0.0 <= precision_at_k(ranked, qrels, k) <= 1.0
    relevant = {doc for doc, grade in qrels.items() if grade > 0}
    groups = [[r] if isinstance(r, str) else list(r) for r in ranked]
    assert recall_at_k(ranked, qrels, k) == pytest.approx(evidence_recall_at_k(groups, [relevant], k))


@st.composite
def qrels_and_run(draw):
    qids = [f"q{i}" for i in range(6)]
    qrels = {
        qid: draw(
            st.dictionaries(st.sampled_from(DOC_IDS), st.integers(min_value=0, max_value=3), min_size=1)
        )
        for qid in draw(st.lists(st.sampled_from(qids), unique=True, min_size=1))
    }
    # Scores from a small set, so that ties occur and trec_eval's tie-break is exercised too.
    run = {
        qid: draw(
            st.dictionaries(st.sampled_from(DOC_IDS), st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=1)
        )
        for qid in draw(st.lists(st.sampled_from(qids), unique=True))
    }
    ks = draw(st.lists(st.integers(min_value=1, max_value=12), unique=True, min_size=1, max_size=3))
    return qrels, run, ks


@settings(max_examples=150, deadline=None)
@given(qrels_and_run())
def test_evaluate_run_equals_pytrec_eval_aggregated(data):
    qrels, run, ks = data
    ours = evaluate_run(qrels, {qid: list(docs.items()) for qid, docs in run.items()}, ks)

    # trec_eval's default: queries of the run that have judgements; we also leave out queries with no
    # relevant document, whose measures are undefined.
    scored = sorted(qid for qid in run if qid in qrels and has_relevant(qrels[qid]))
    assert sorted(ours["perQuery"]) == scored
    for k in ks:
        measures = {f"recall.{k}", f"ndcg_cut.{k}", f"P.{k}", f"success.{k}"}
        full = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
        # recip_rank has no cut-off in trec_eval: evaluate it on each run cut at K (in trec_eval order).
        cut_run = {
            qid: dict(sorted(docs.items(), key=lambda pair: (pair[1], pair[0]), reverse=True)[:k])
            for qid, docs in run.items()
        }
        cut = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(cut_run)
        for ours_name, trec_name, source in [
            ("recall", f"recall_{k}", full),
            ("ndcg", f"ndcg_cut_{k}", full),
            ("precision", f"P_{k}", full),
            ("hitRate", f"success_{k}", full),
            ("mrr", "recip_rank", cut),
        ]:
            key = f"{ours_name}@{k}"
            for qid in scored:
                assert ours["perQuery"][qid][key] == pytest.approx(source[qid][trec_name], abs=1e-9), (
                    qid,
                    key,
                )
            if scored:
                mean = sum(source[qid][trec_name] for qid in scored) / len(scored)
                assert ours["aggregate"][key] == pytest.approx(mean, abs=1e-9)
            else:
                assert ours["aggregate"][key] is None
