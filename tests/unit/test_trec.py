import pytest
import pytrec_eval

from app.evaluation.scoring.trec import (
    QUERY_CONVENTION,
    TrecFormatError,
    evaluate_run,
    read_qrels,
    read_run,
    scores_from_ranking,
    trec_order,
    write_qrels,
    write_run,
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_read_qrels(tmp_path):
    path = write(tmp_path, "q.qrels", "q1 0 d1 1\nq1 0 d2 0\n\n  q2\t0\td9 3  \nq2 0 d8 -1\n")
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 0}, "q2": {"d9": 3, "d8": -1}}


def test_read_run_orders_by_score_descending_then_docid_descending(tmp_path):
    # The rank column is deliberately misleading: trec_eval ignores it.
    path = write(
        tmp_path,
        "r.run",
        "q1 Q0 a 1 1.0 t\nq1 Q0 c 2 1.0 t\nq1 Q0 b 3 1.0 t\n"
        "q1 Q0 z 4 0.5 t\nq1 Q0 y 5 2 t\nq2 Q0 x 1 -3e-1 t\n",
    )
    assert read_run(path) == {
        "q1": [("y", 2.0), ("c", 1.0), ("b", 1.0), ("a", 1.0), ("z", 0.5)],
        "q2": [("x", -0.3)],
    }


def test_tie_order_matches_trec_eval():
    # Three documents tied on score; only 'a' is relevant. trec_eval breaks ties by docid descending,
    # so 'a' is third: recip_rank = 1/3 and P_1 = 0.
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0, "c": 1.0}}
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "P.1"}).evaluate(run)["q"]
    assert trec["recip_rank"] == pytest.approx(1 / 3)
    assert trec["P_1"] == 0.0
    assert [doc for doc, _ in trec_order(list(run["q"].items()))] == ["c", "b", "a"]
    ours = evaluate_run(qrels, {"q": list(run["q"].items())}, [1, 3])
    assert ours["perQuery"]["q"]["mrr@3"] == pytest.approx(trec["recip_rank"])
    assert ours["perQuery"]["q"]["precision@1"] == trec["P_1"]


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("q1 0 d1 1\nq1 0 d2\n", 2, "expected 4 fields"),
        ("q1 0 d1 1\n\nq1 0 d2 1 extra\n", 3, "expected 4 fields"),
        ("q1 0 d1 high\n", 1, "relevance must be an integer, got 'high'"),
        ("q1 0 d1 0.5\n", 1, "relevance must be an integer"),
        ("q1 0 d1 1\nq1 0 d1 2\n", 2, "judged twice for query 'q1' (first at line 1)"),
    ],
)
def test_malformed_qrels_names_file_and_line(tmp_path, text, line, expected):
    path = write(tmp_path, "bad.qrels", text)
    with pytest.raises(TrecFormatError) as info:
        read_qrels(path)
    assert f"{path}:{line}:" in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 0.8\n", 2, "expected 6 fields"),
        ("q1 Q0 d1 one 0.9 t\n", 1, "rank must be an integer, got 'one'"),
        ("q1 Q0 d1 1 high t\n", 1, "score must be a number, got 'high'"),
        ("q1 Q0 d1 1 nan t\n", 1, "score must be finite"),
        ("q1 Q0 d1 1 0.9 t\n\nq1 Q0 d1 2 0.8 t\n", 3, "listed twice for query 'q1' (first at line 1)"),
    ],
)
def test_malformed_run_names_file_and_line(tmp_path, text, line, expected):
    path = write(tmp_path, "bad.run", text)
    with pytest.raises(TrecFormatError) as info:
        read_run(path)
    assert f"{path}:{line}:" in str(info.value)
    assert expected in str(info.value)


def test_missing_file_is_a_format_error_naming_it(tmp_path):
    with pytest.raises(TrecFormatError, match="nope.run: cannot read"):
        read_run(tmp_path / "nope.run")


def test_run_round_trip(tmp_path):
    run = {
        "q2": [("d3", 0.25), ("d1", 0.75), ("d2", 0.25)],
        "q1": [("x", 1 / 3), ("y", -2.5e-17)],
    }
    path = tmp_path / "out.run"
    write_run(path, run, "sieve")
    assert path.read_text().splitlines()[:3] == [
        "q1 Q0 x 1 0.3333333333333333 sieve",
        "q1 Q0 y 2 -2.5e-17 sieve",
        "q2 Q0 d1 1 0.75 sieve",
    ]
    assert read_run(path) == {qid: trec_order(results) for qid, results in run.items()}


def test_scores_from_ranking_keeps_the_given_order_through_a_run_file(tmp_path):
    ranked = ["b", "a", "c"]
    path = tmp_path / "out.run"
    write_run(path, {"q": scores_from_ranking(ranked)}, "t")
    assert [doc for doc, _ in read_run(path)["q"]] == ranked


def test_qrels_round_trip(tmp_path):
    qrels = {"q2": {"b": 0, "a": 3}, "q1": {"x": 1.0, "y": -1}}
    path = tmp_path / "out.qrels"
    write_qrels(path, qrels)
    assert path.read_text() == "q1 0 x 1\nq1 0 y -1\nq2 0 a 3\nq2 0 b 0\n"
    assert read_qrels(path) == {"q1": {"x": 1, "y": -1}, "q2": {"a": 3, "b": 0}}


@pytest.mark.parametrize(
    ("run", "tag", "expected"),
    [
        ({"q": [("d 1", 1.0)]}, "t", "whitespace"),
        ({"q": [("d1", 1.0)]}, "my tag", "whitespace"),
        ({"q": [("d1", 1.0), ("d1", 0.5)]}, "t", "appears twice"),
        ({"q": [("d1", float("inf"))]}, "t", "non-finite"),
    ],
)
def test_write_run_rejects_what_trec_eval_cannot_read(tmp_path, run, tag, expected):
    with pytest.raises(ValueError, match=expected):
        write_run(tmp_path / "x.run", run, tag)


def test_write_qrels_rejects_fractional_grades(tmp_path):
    with pytest.raises(ValueError, match="need integers"):
        write_qrels(tmp_path / "x.qrels", {"q": {"d": 0.5}})


def test_evaluate_run_query_convention():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}}
    run = {"q1": [("a", 1.0)], "q3": [("c", 1.0)], "q4": [("d", 1.0)]}
    result = evaluate_run(qrels, run, [10])
    assert set(result["perQuery"]) == {"q1"}
    assert result["aggregate"]["recall@10"] == 1.0
    assert result["missingFromRun"] == ["q2"]
    assert result["noRelevant"] == ["q3"]
    assert result["notInQrels"] == ["q4"]
    assert result["queries"] == 1
    assert result["convention"] == QUERY_CONVENTION

    complete = evaluate_run(qrels, run, [10], complete=True)
    assert complete["perQuery"]["q2"] == dict.fromkeys(complete["aggregate"], 0.0)
    assert complete["aggregate"]["recall@10"] == pytest.approx((1 + 0) / 2)


def test_evaluate_run_keys():
    result = evaluate_run({"q": {"a": 1}}, {"q": [("a", 1.0)]}, [1, 10])
    assert list(result["aggregate"]) == [
        "recall@1",
        "ndcg@1",
        "mrr@1",
        "precision@1",
        "hitRate@1",
        "recall@10",
        "ndcg@10",
        "mrr@10",
        "precision@10",
        "hitRate@10",
    ]
    assert result["aggregate"]["precision@10"] == pytest.approx(1 / 10)


def test_evaluate_run_with_nothing_to_score_has_no_aggregate():
    result = evaluate_run({"q": {"a": 1}}, {}, [5])
    assert result["aggregate"] == dict.fromkeys(
        ["recall@5", "ndcg@5", "mrr@5", "precision@5", "hitRate@5"], None
    )


@pytest.mark.parametrize("ks", [[], [0], [3, -1]])
def test_evaluate_run_rejects_bad_ks(ks):
    with pytest.raises(ValueError):
        evaluate_run({"q": {"a": 1}}, {"q": [("a", 1.0)]}, ks)
