"""Candidate pools for the labelling page (golden/authoring/pool.py): the chain variants' settings, the
union by chunk with each variant's rank, highlighting by the BM25 analyzer's terms, the baseline report, and
the queue `sieve golden pool` writes from a report or a comparison. Fake chains and a fake store."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.golden.authoring.pool import (
    BASELINE,
    BM25,
    CURRENT,
    DENSE,
    QUEUED,
    PoolQuery,
    QueueEntry,
    QueueError,
    Ranked,
    baseline_report,
    build_pools,
    highlight,
    merge_pool,
    queue_from_report,
    queue_report_file,
    read_queue,
    read_queue_lenient,
    report_rankings,
    resolve_queued,
    unjudged_keys,
    variant_settings,
    write_queue,
)
from app.lexical.index import Analyzer
from app.retrieval.chain import RetrievalRequest
from app.settings import Settings
from tests.fixtures.label_fakes import FakeChain, FakeStore

# -- variants ------------------------------------------------------------------------------------------------


def test_the_variants_switch_the_retrieval_channel_and_nothing_else() -> None:
    settings = Settings()
    variants = variant_settings(settings)
    assert variants[CURRENT] is settings
    dense, bm25 = variants[DENSE].rag, variants[BM25].rag
    assert (dense.retrieval.hybrid, dense.retrieval.candidate_k) == (False, 50)
    assert (dense.chain.bm25.enabled, dense.chain.rerank.enabled) == (False, False)
    assert (bm25.retrieval.hybrid, bm25.retrieval.candidate_k) == (True, 0)
    assert bm25.chain.similarity_threshold.enabled is False and bm25.chain.rerank.enabled is False
    fusion = bm25.chain.bm25
    assert (fusion.enabled, fusion.fusion, fusion.dense_weight, fusion.bm25_weight) == (
        True,
        "weighted",
        0.0,
        1.0,
    )
    for rag in (dense, bm25):  # the filters run as configured
        assert rag.chain.hard_filter == settings.rag.chain.hard_filter
        assert rag.chain.diversity == settings.rag.chain.diversity
        assert rag.chain.fallback == settings.rag.chain.fallback
        assert rag.models == settings.rag.models and rag.store == settings.rag.store
    assert settings.rag.retrieval.hybrid is True  # the current settings are untouched


def test_a_lexical_only_configuration_still_has_a_dense_variant() -> None:
    settings = Settings.model_validate({"rag": {"retrieval": {"candidate_k": 0}}})
    assert variant_settings(settings)[DENSE].rag.retrieval.candidate_k == 50


# -- the union -----------------------------------------------------------------------------------------------


def r(chunk: str | None, doc: str = "") -> Ranked:
    return Ranked(chunk, doc or (chunk or "").split("#")[0])


def test_the_pool_is_the_union_by_chunk_with_every_rank() -> None:
    pool = merge_pool(
        {
            CURRENT: [r("a#0"), r("b#0"), r("c#0")],
            DENSE: [r("b#0"), r("d#0"), r("a#0")],
            BM25: [r("d#0"), r("b#0"), r("b#0")],  # a repeat keeps its first rank
            QUEUED: [r("z#0"), r("c#0"), r(None, "y")],  # a document without its chunk is not pooled yet
        }
    )
    # b, a and d each have a rank 1; b was returned by three variants, a and d by two (then by id);
    # c's best rank is 3; z only queued comes last
    assert [(e.chunk_id, e.ranks) for e in pool] == [
        ("b#0", {CURRENT: 2, DENSE: 1, BM25: 2}),
        ("a#0", {CURRENT: 1, DENSE: 3}),
        ("d#0", {DENSE: 2, BM25: 1}),
        ("c#0", {CURRENT: 3, QUEUED: 2}),
        ("z#0", {QUEUED: 1}),
    ]


@given(
    st.dictionaries(st.sampled_from([CURRENT, DENSE, BM25, BASELINE]), st.lists(st.sampled_from("abcdef")))
)
def test_every_returned_chunk_is_pooled_once(lists: dict[str, list[str]]) -> None:
    pool = merge_pool({v: [r(f"{c}#0") for c in chunks] for v, chunks in lists.items()})
    ids = [e.chunk_id for e in pool]
    assert sorted(ids) == sorted({f"{c}#0" for chunks in lists.values() for c in chunks})
    for e in pool:
        assert e.ranks == {
            v: chunks.index(e.chunk_id[0]) + 1 for v, chunks in lists.items() if e.chunk_id[0] in chunks
        }


# -- highlighting --------------------------------------------------------------------------------------------


def fake_tokens(text: str) -> list[str]:
    """A stand-in analyzer: lowercase, a trailing s dropped (a 'stemmer')."""
    word = text.lower()
    return [word[:-1] if word.endswith("s") else word] if word not in ("the", "a") else []


def test_latin_words_match_by_their_analysed_form() -> None:
    text = "Leaves, leave & <b>LEAVE</b>s: the days"
    segments = highlight(text, {"leave", "day"}, fake_tokens)
    assert segments == [
        ["Leaves", True],
        [", ", False],
        ["leave", True],
        [" & <b>", False],
        ["LEAVE", True],
        ["</b>s: the ", False],
        ["days", True],
    ]


def test_markup_in_a_document_stays_text() -> None:
    text = '<script>alert("x")</script> leave'
    segments = highlight(text, {"leave", "script"}, fake_tokens)
    assert "".join(p for p, _ in segments) == text
    assert [p for p, hit in segments if hit] == ["script", "script", "leave"]  # words, never tags


def test_cjk_terms_match_longest_first_left_to_right() -> None:
    segments = highlight("年假天数：年假十天", {"年假", "年", "天数", "十"}, fake_tokens)
    assert segments == [["年假天数", True], ["：", False], ["年假十", True], ["天", False]]


def test_with_the_real_analyzer() -> None:
    analyzer = Analyzer()
    query = "How many annual leave days?"
    text = "Annual leave: employees get 15 days of leave per year."
    segments = highlight(text, analyzer.tokens(query), analyzer.tokens)
    assert [p for p, hit in segments if hit] == ["Annual", "leave", "days", "leave"]


@given(st.text(max_size=80), st.sets(st.sampled_from(["年", "年假", "leav", "day", "a"]), max_size=4))
def test_the_pieces_join_back_to_the_text(text: str, terms: set[str]) -> None:
    segments = highlight(text, terms, fake_tokens)
    assert "".join(p for p, _ in segments) == text
    assert all(p for p, _ in segments)  # no empty piece
    assert all(a[1] != b[1] for a, b in zip(segments, segments[1:], strict=False))  # runs merged


# -- the baseline report -------------------------------------------------------------------------------------


def write_report(path: Path, passed: bool = True, status: str = "ok", cases: list[Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"status": status, "run": {}, "gate": {"passed": passed}, "cases": cases or []})
    )
    return path


@pytest.mark.parametrize(
    ("present", "chosen"),
    [
        ({"p-pinned.json": False, "p-passing.json": True, "p-latest.json": True}, "p-pinned.json"),
        ({"p-passing.json": True, "p-latest.json": True}, "p-passing.json"),
        ({"p-latest.json": True, "p-20260101T000000Z.json": True}, "p-latest.json"),
        (
            {"p-latest.json": False, "p-20260101T000000Z.json": True, "p-20260102T000000Z.json": False},
            "p-20260101T000000Z.json",
        ),
        ({"p-latest.json": False}, "p-latest.json"),
        ({"p-other.json": True}, None),
        ({}, None),
    ],
)
def test_the_baseline_report_is_pinned_then_passing_then_latest(
    tmp_path: Path, present: dict[str, bool], chosen: str | None
) -> None:
    for name, passed in present.items():
        write_report(tmp_path / name, passed)
    found = baseline_report(tmp_path, "p")
    assert (found.name if found else None) == chosen


def test_a_report_that_did_not_evaluate_is_no_baseline(tmp_path: Path) -> None:
    write_report(tmp_path / "p-latest.json", status="invalid")
    (tmp_path / "p-20260101T000000Z.json").write_text("not json")
    assert baseline_report(tmp_path, "p") is None


def test_report_rankings_are_the_cases_chunks_in_rank_order() -> None:
    report = {
        "cases": [
            {"id": "c1", "query": "q", "rankedDocuments": [{"chunkId": "b#1", "docId": "b"}, {"docId": "x"}]}
        ]
    }
    assert report_rankings(report) == {"c1": ("q", [Ranked("b#1", "b")])}


# -- the queue -----------------------------------------------------------------------------------------------


def ranked_doc(doc: str, chunk: str | None = None, source: str = "s") -> dict[str, Any]:
    return {"docId": doc, "chunkId": chunk or f"{doc}#0", "source": source}


def report_case(**fields: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "query": "q",
        "topK": 3,
        "matchOn": "doc",
        "expected": {},
        "forbiddenDocIds": [],
        **fields,
    }


def test_unjudged_keys_are_the_reports_own_when_it_has_them() -> None:
    case = report_case(unjudged=["b"], rankedDocuments=[ranked_doc("a"), ranked_doc("b")])
    assert unjudged_keys(case, 3) == ["b"]


def test_unjudged_keys_are_computed_from_expected_and_forbidden_otherwise() -> None:
    ranked = [ranked_doc(d) for d in ("a", "b", "c", "b", "d")]
    case = report_case(expected={"a": 1.0, "c": 0.0}, forbiddenDocIds=["d"], rankedDocuments=ranked)
    assert unjudged_keys(case, 5) == ["b"]  # c graded 0 is judged; d forbidden is judged; b once
    assert unjudged_keys({**case, "matchOn": "chunk", "expected": {"a#0": 1.0}}, 2) == ["b#0"]


def test_a_report_queues_each_cases_unjudged_chunks_within_top_k() -> None:
    report = {
        "status": "ok",
        "run": {},
        "cases": [
            report_case(
                unjudged=["b", "c"], rankedDocuments=[ranked_doc("a"), ranked_doc("b"), ranked_doc("c")]
            ),
            report_case(id="c2", unjudged=[], rankedDocuments=[ranked_doc("a")]),
            report_case(
                id="c3",
                knowledgeTag="hr",
                matchOn="source",
                unjudged=["s2"],
                rankedDocuments=[ranked_doc("a", source="s1"), ranked_doc("e", "e#3", source="s2")],
            ),
        ],
    }
    assert queue_from_report(report, "r.json") == [
        QueueEntry("c1", "q", None, (Ranked("b#0", "b"), Ranked("c#0", "c"))),
        QueueEntry("c3", "q", "hr", (Ranked("e#3", "e"),)),
    ]
    assert queue_from_report(report, "r.json", top_k=2)[0].ids == (Ranked("b#0", "b"),)


def test_a_comparison_queues_the_new_unjudged_documents_of_its_changed_cases() -> None:
    comparison = {
        "baseline": {"path": "old.json"},
        "cases": {
            "fixed": ["c1"],
            "broken": ["c2"],
            "improved": [{"id": "c4", "delta": 0.1}],
            "worsened": [{"id": "c3", "delta": -0.2}],
        },
        "caseDetails": {
            "c1": {"query": "q1", "now": ["a", "b"], "newUnjudged": ["b"]},
            "c2": {"query": "q2", "now": ["x"]},  # an older comparison: its new top, judged or not
            "c3": {"query": "q3", "now": ["y"], "newUnjudged": []},
        },
    }
    assert queue_from_report(comparison, "cmp.json") == [
        QueueEntry("c1", "q1", None, (Ranked(None, "b"),)),
        QueueEntry("c2", "q2", None, (Ranked(None, "x"),)),
    ]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"status": "invalid", "run": {}, "cases": []}, "did not evaluate anything"),
        ({"hello": 1}, "neither a Sieve report"),
    ],
)
def test_anything_else_is_refused_naming_the_file(document: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueError, match=f"r.json: .*{message}"):
        queue_from_report(document, "r.json")


def test_the_queue_file_round_trips_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "t" / "queue.jsonl"
    entries = [QueueEntry("c1", "查询", "hr", (Ranked("a#0", "a"), Ranked(None, "b")))]
    write_queue(path, [QueueEntry("old", None, None, (Ranked("z#0", "z"),))], "old.json")
    write_queue(path, entries, "r.json")
    assert read_queue(path) == entries
    line = json.loads(path.read_text(encoding="utf-8"))
    assert line["from"] == "r.json" and line["queuedAt"].endswith("Z")


def test_a_bad_queue_line_is_named_and_the_others_still_read(tmp_path: Path) -> None:
    path = tmp_path / "queue.jsonl"
    path.write_text('{"caseId": "c1", "ids": []}\n{"caseId": "c2"}\n')
    entries, problems = read_queue_lenient(path)
    assert [e.case_id for e in entries] == ["c1"]
    assert len(problems) == 1 and "queue.jsonl:2: not a queue entry" in problems[0]
    assert [e.case_id for e in read_queue(path)] == ["c1"]
    assert read_queue(tmp_path / "missing.jsonl") == []


def test_queue_report_file_reads_writes_and_names_a_bad_file(tmp_path: Path) -> None:
    report = write_report(
        tmp_path / "r.json", cases=[report_case(unjudged=["b"], rankedDocuments=[ranked_doc("b")])]
    )
    entries = queue_report_file(report, tmp_path / "q.jsonl")
    assert read_queue(tmp_path / "q.jsonl") == entries == [QueueEntry("c1", "q", None, (Ranked("b#0", "b"),))]
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(QueueError, match="bad.json: not a JSON object"):
        queue_report_file(tmp_path / "bad.json", tmp_path / "q.jsonl")
    with pytest.raises(QueueError, match="no such report file"):
        queue_report_file(tmp_path / "none.json", tmp_path / "q.jsonl")


# -- building pools ------------------------------------------------------------------------------------------


def test_resolve_queued_finds_a_chunk_for_each_queued_document() -> None:
    store = FakeStore(["a#0", "b#0", "b#1", "c#0"])
    picked = resolve_queued(
        [Ranked("x#9", "x"), Ranked(None, "a"), Ranked(None, "b"), Ranked(None, "c#0"), Ranked(None, "gone")],
        "q",
        {"a#0": "a"},
        store,
        lambda query, ids: ids[-1],
    )
    # a chunk id stays; a has a chunk in the pool; b's best chunk; c#0 is a chunk id; gone is left out
    assert picked == [Ranked("x#9", "x"), Ranked("a#0", "a"), Ranked("b#1", "b"), Ranked("c#0", "c")]


def test_build_pools_runs_every_variant_once_and_names_their_failures() -> None:
    current = FakeChain({"q1": ["a#0", "b#0", "c#0"], "q2": ["d#0"]})
    dense = FakeChain({"q1": ["b#0", "e#0"], "q2": RuntimeError("boom")})
    store = FakeStore(["a#0", "b#0", "c#0", "d#0", "e#0", "f#0"])
    queries = [PoolQuery("c1", "q1", None, 2), PoolQuery("c2", "q2", "hr", 5)]
    pools = build_pools(
        queries,
        {CURRENT: current, DENSE: dense},
        store,
        baseline={
            "c1": ("q1", [Ranked("f#0", "f"), Ranked("gone#0", "gone"), Ranked("z#0", "z")]),
            "c2": ("old", [Ranked("a#0", "a")]),
        },
        queued={"c2": [Ranked(None, "f")]},
        today=date(2026, 1, 2),
    )
    assert current.seen == [
        ([RetrievalRequest("q1", 2, None), RetrievalRequest("q2", 5, "hr")], date(2026, 1, 2))
    ]
    one = pools["c1"]
    # K = 2 per variant: c#0 (current #3) and z#0 (baseline #3) are out
    assert [(c.entry.chunk_id, c.entry.ranks, c.text, c.in_index) for c in one.chunks] == [
        ("b#0", {CURRENT: 2, DENSE: 1}, "text of b#0", True),
        ("a#0", {CURRENT: 1}, "text of a#0", True),
        ("f#0", {BASELINE: 1}, "text of f#0", True),  # read from the store
        ("e#0", {DENSE: 2}, "text of e#0", True),
        ("gone#0", {BASELINE: 2}, "", False),  # the store no longer holds it
    ]
    two = pools["c2"]
    assert list(two.errors) == [DENSE] and "RuntimeError: boom" in two.errors[DENSE]
    # the baseline's c2 was another query: not pooled; the queued document f gets its chunk
    assert [(c.entry.chunk_id, c.entry.ranks) for c in two.chunks] == [
        ("d#0", {CURRENT: 1}),
        ("f#0", {QUEUED: 1}),
    ]
