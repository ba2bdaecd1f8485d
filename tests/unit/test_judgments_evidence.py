"""Judgments, Judged@K, the condensed list, evidence chunks and the index-dependent rules of a golden case
(chunk judgments rolled up to documents, expectedSources expanded, an unknown knowledgeTag), on the
runner's fake chain: final list [c1 (A), c2 (B), c4 (D)]; c3 (C) removed by `threshold`, c5 (a second
chunk of A) by `diversity`."""

from __future__ import annotations

import math

import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet, GoldenSetError
from app.evaluation.run.build import case_record, summary_record
from app.evaluation.run.runner import CaseResult, Evaluation, KnownIds, evaluate
from app.evaluation.scoring import metrics
from tests.fixtures.traced_chain import TAGGED_KNOWN as KNOWN
from tests.fixtures.traced_chain import TAGGED_ROWS as ROWS
from tests.fixtures.traced_chain import FakeChain


def run(*cases: dict, k: int = 3):
    golden = GoldenSet("t", [GoldenCase.model_validate({"query": "q", **c}) for c in cases], "golden.json")
    return evaluate(FakeChain(), golden, k, KNOWN)


def summary_record_of(*cases: CaseResult):
    golden = GoldenSet("t", [c.case for c in cases], "golden.json")
    return summary_record(Evaluation(golden, 3, list(cases), [], 0.0, 0.0))


def test_judged_at_k_divides_by_k_as_ir_measures_does() -> None:
    assert metrics.judged_at_k(["a", "x", "b", "y"], {"a", "b"}, 4) == 2 / 4
    assert metrics.judged_at_k(["a"], {"a"}, 4) == 1 / 4  # a short list still divides by K
    assert metrics.judged_at_k(["a", "a", "x"], {"a"}, 3) == 2 / 3  # a duplicate counts at each position
    assert metrics.unjudged_at_k(["x", "a", "x", "y"], {"a"}, 4) == ["x", "y"]
    assert metrics.condensed(["x", "a", "y", "b"], {"a", "b"}) == ["a", "b"]


def test_evidence_recall_is_the_best_covered_group_and_a_hit_needs_a_whole_group() -> None:
    groups = [{"a", "b"}, {"c"}]
    assert metrics.evidence_recall_at_k([["a"], ["x"]], groups, 2) == max(1 / 2, 0 / 1)
    assert metrics.evidence_hit_at_k([["a"], ["x"]], groups, 2) == 0.0
    assert metrics.evidence_recall_at_k([["x"], ["c"]], groups, 2) == 1 / 1
    assert metrics.evidence_hit_at_k([["x"], ["c"]], groups, 2) == 1.0
    # a chunk attached to a rank counts with it; the cut is at K ranks
    assert metrics.evidence_recall_at_k([["x", "c"], ["a"]], groups, 1) == 1 / 1
    assert metrics.evidence_recall_at_k([["x"], ["a", "b"]], groups, 1) == max(0 / 2, 0 / 1)
    with pytest.raises(metrics.UndefinedMetricError):
        metrics.evidence_recall_at_k([["a"]], [], 1)


def test_right_document_wrong_chunk_scores_the_document_and_says_where_the_evidence_went() -> None:
    # the payday shape: document A is rank 1, but its answering chunk c5 was removed by diversity
    (c,) = run({"id": "payday", "expectedDocIds": ["A"], "evidenceChunkIds": ["c5"]}).cases
    assert c.metrics is not None and c.metrics["recall"] == 1.0
    assert c.evidence == {"evidenceRecall": 0 / 1, "evidenceHit": 0.0}
    assert [(x.id, x.where, x.reason) for x in c.evidence_lost] == [
        ("c5", "REMOVED_BY_diversity", "max_per_document=1")
    ]


def test_any_of_groups_one_whole_group_answers() -> None:
    answered, half = run(
        {"id": "a", "expectedDocIds": ["B"], "anyOf": [["c5"], ["c2", "c4"]]},
        {"id": "b", "expectedDocIds": ["B"], "anyOf": [["c2", "c3"]]},
    ).cases
    assert answered.evidence == {"evidenceRecall": max(0 / 1, 2 / 2), "evidenceHit": 1.0}
    assert answered.evidence_lost == []  # answered: the other group's chunks are not "lost"
    assert half.evidence == {"evidenceRecall": 1 / 2, "evidenceHit": 0.0}
    assert [(x.id, x.where) for x in half.evidence_lost] == [("c3", "REMOVED_BY_threshold")]


def test_any_of_groups_are_alternatives_in_every_figure() -> None:
    # top 3: A (c1), B (c2), D (c4); c3 (C) was removed by the threshold
    first, later, beside = run(
        {"id": "first", "anyOf": [["c1"], ["c3"]]},
        {"id": "later", "anyOf": [["c2"], ["c4"]]},
        {"id": "beside", "expectedDocIds": ["D"], "anyOf": [["c1"], ["c3"]]},
        k=3,
    ).cases
    # one whole group (c1, document A) at rank 1 answers: recall 1, not 1/2 as if both were required
    assert first.alternatives == [{"A": 1.0}, {"C": 1.0}]
    assert first.relevance == {"A": 1.0, "C": 1.0}
    assert first.metrics == pytest.approx(
        {
            "recall": max(1 / 1, 0 / 1),
            "hitRate": 1.0,
            "mrr": 1 / 1,
            "ndcg": max(1.0, 0.0),
            "precision": max(1 / 3, 0 / 3),
            "top1Accuracy": 1.0,
            "duplicateRate": 0.0,
        }
    )
    assert first.counts == {"expectedCount": 1, "hitCount": 1, "firstHitRank": 1}
    assert first.lost == []  # C belongs to the other alternative: not lost
    assert first.condensed is not None and first.condensed["recall"] == 1.0
    # B at rank 2, D at rank 3: the better-served alternative is B's
    assert later.metrics is not None
    assert later.metrics["ndcg"] == pytest.approx(max(1 / math.log2(3), 1 / math.log2(4)))
    assert later.metrics["mrr"] == pytest.approx(1 / 2)
    assert later.after_stage["diversity"]["ndcg"] == pytest.approx(1 / math.log2(3))
    # expectedDocIds are in every alternative: {D, A} or {D, C}
    assert beside.alternatives == [{"D": 1.0, "A": 1.0}, {"D": 1.0, "C": 1.0}]
    assert beside.metrics is not None
    idcg = 1 / math.log2(2) + 1 / math.log2(3)
    assert beside.metrics["ndcg"] == pytest.approx(
        max((1 / math.log2(2) + 1 / math.log2(4)) / idcg, (1 / math.log2(4)) / idcg)
    )
    assert beside.metrics["recall"] == max(2 / 2, 1 / 2)
    assert summary_record_of(first, later, beside).failed_case_ids == []


def test_a_stale_evidence_chunk_is_listed_and_left_out_of_every_figure() -> None:
    # the re-chunk shape: the right document A at rank 1; its evidence chunk c9 is no longer in the index
    ev = run({"id": "rechunked", "expectedDocIds": ["A"], "evidenceChunkIds": ["c9"]})
    (c,) = ev.cases
    assert c.relevance == {"A": 1.0}  # c9 stands for nothing: it is not a relevant document
    assert c.metrics is not None
    assert c.metrics["recall"] == 1 / 1
    assert c.metrics["ndcg"] == pytest.approx((1 / math.log2(2)) / (1 / math.log2(2)))
    assert c.missing_from_index == ["c9"]
    assert c.lost == []
    assert (c.evidence_groups, c.evidence) == ([], None)  # its one group is not whole in the index
    assert ev.warnings == [
        "case rechunked: chunk id(s) not in the index, left out of every figure: c9 (stale after re-chunking "
        "or re-ingest? `sieve golden check` says where they went)"
    ]
    summary = summary_record(ev)
    assert summary.expected_missing_from_index == 1
    assert summary.failed_case_ids == []
    assert summary.unscorable_case_ids == []
    assert summary.evidence.cases == 0
    assert summary.evidence.unscorable == ["rechunked"]


def test_a_case_whose_every_expectation_is_stale_is_unscorable_not_zero() -> None:
    ev = run({"id": "gone", "evidenceChunkIds": ["c9"]}, {"id": "ok", "expectedDocIds": ["A"]})
    gone, ok = ev.cases
    assert gone.status == "unscorable"
    assert gone.unscorable == "every expectation it names is a chunk id not in the index: c9"
    assert gone.metrics is None and gone.condensed is None and gone.at_k == {}
    assert gone.relevance == {}
    assert (
        "case gone: not scored: every expectation it names is a chunk id not in the index: c9"
        in (ev.warnings[0])
    )
    summary = summary_record(ev)
    assert summary.scored_cases == 1  # the averages are ok's alone
    assert summary.recall == ok.metrics["recall"] == 1.0  # type: ignore[index]
    assert summary.unscorable_case_ids == ["gone"]
    assert summary.failed_case_ids == []
    record = case_record(gone)
    assert (record.outcome.status, record.resolved.unscorable, record.resolved.missing_from_index) == (
        "unscorable",
        "every expectation it names is a chunk id not in the index: c9",
        ["c9"],
    )


def test_stale_expected_chunk_ids_leave_the_case_scored_on_the_others() -> None:
    (c,) = run({"id": "chunks", "expectedChunkIds": ["c2", "c9"]}).cases
    assert c.key == "chunk"
    assert c.relevance == {"c2": 1.0}
    assert c.metrics is not None
    assert c.metrics["recall"] == 1 / 1
    assert c.metrics["ndcg"] == pytest.approx((1 / math.log2(3)) / (1 / math.log2(2)))  # c2 at rank 2
    assert c.missing_from_index == ["c9"]
    assert c.evidence is None  # the group [c2, c9] is not whole in the index


def test_a_judgment_of_a_chunk_id_not_in_the_index_is_stale_not_a_document() -> None:
    stale = "c_" + "0" * 24
    (c,) = run({"id": "j", "expectedDocIds": ["B"], "judgments": {stale: 2, "Z": 0}}).cases
    assert c.relevance == {"B": 1.0, "Z": 0.0}  # Z, not chunk-shaped, stays a document judged 0
    assert c.missing_from_index == [stale]
    assert c.metrics is not None and c.metrics["recall"] == 1 / 1


def test_chunk_judgments_roll_up_to_their_documents_and_grade_zero_counts_as_judged() -> None:
    # judgments only: c2 (B) grade 1, c4 (D) grade 0 -> B relevant, D judged not relevant, A unjudged
    (c,) = run({"id": "j", "judgments": {"c2": 1, "c4": 0}}).cases
    assert c.key == "doc"
    assert c.relevance == {"B": 1.0, "D": 0.0}
    assert c.judged == 2 / 3  # top 3 = A, B, D
    assert c.unjudged == ["A"]
    # strict: B at rank 2 -> nDCG = (1/log2(3)) / 1; condensed list [B, D] -> B at rank 1 -> 1.0
    assert c.metrics is not None and c.metrics["ndcg"] == pytest.approx(1 / math.log2(3))
    assert c.condensed is not None and c.condensed["ndcg"] == pytest.approx(1.0)
    assert c.condensed["mrr"] == pytest.approx(1 / 1)


def test_a_document_judgment_wins_over_its_chunks_and_forbidden_documents_count_as_judged() -> None:
    (c,) = run({"id": "j", "judgments": {"B": 3, "c2": 1}, "forbiddenDocIds": ["A"]}).cases
    assert c.relevance == {"B": 3.0}
    assert c.judged_ids == {"A", "B"}
    assert c.judged == 2 / 3
    assert c.unjudged == ["D"]


def test_judged_after_each_stage_and_in_the_summary() -> None:
    ev = run(
        {"id": "a", "expectedDocIds": ["B"]}, {"id": "b", "expectedDocIds": ["A"], "judgments": {"D": 0}}
    )
    first, second = ev.cases
    # candidates [c1..c5] -> keys A, B, C, D, A; the first 3 are A, B, C
    assert first.after_stage["candidates"]["judged"] == 1 / 3
    assert second.after_stage["diversity"]["judged"] == 2 / 3  # A, B, D: A and D judged
    summary = summary_record(ev)
    assert summary.judged == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert summary.unjudged_in_top_k == 2 + 1  # A, D for the first; B for the second


def test_expected_sources_beside_document_ids_add_the_documents_that_carry_them() -> None:
    (c,) = run({"id": "s", "expectedDocIds": ["B"], "expectedSources": ["D.md", "nowhere.md"]}).cases
    assert c.relevance == {"B": 1.0, "D": 1.0}
    assert c.expanded_sources == {"D.md": ["D"], "nowhere.md": []}
    assert "nowhere.md" in c.missing_from_index
    assert c.metrics is not None and c.metrics["recall"] == 2 / 2


def test_an_unknown_knowledge_tag_is_a_golden_set_error_with_a_suggestion() -> None:
    with pytest.raises(GoldenSetError) as raised:
        run({"id": "t1", "expectedDocIds": ["A"], "knowledgeTag": "HR"})
    assert (
        "golden.json: case 't1': field \"knowledgeTag\": no chunk in the index carries knowledge tag 'HR'; "
        'did you mean "hr"?'
    ) in str(raised.value)


def test_draft_cases_are_not_scored_and_say_so() -> None:
    ev = run({"id": "d", "draft": True}, {"id": "a", "expectedDocIds": ["A"]})
    assert [c.case.id for c in ev.cases] == ["a"]
    assert "1 draft case(s) not scored" in ev.warnings[-1]


def test_summary_evidence_figures_are_means_over_the_cases_with_evidence() -> None:
    ev = run(
        {"id": "a", "expectedDocIds": ["A"], "evidenceChunkIds": ["c5"]},
        {"id": "b", "expectedDocIds": ["B"], "anyOf": [["c2", "c3"]]},
        {"id": "c", "expectedDocIds": ["B"]},
    )
    evidence = summary_record(ev).evidence
    assert evidence.cases == 2
    assert evidence.evidence_recall == pytest.approx((0 + 1 / 2) / 2)
    assert evidence.evidence_hit == 0.0
    assert evidence.lost_by == {"REMOVED_BY_diversity": 1, "REMOVED_BY_threshold": 1}


class Attaching(FakeChain):
    """As FakeChain, with c5 (the removed second chunk of A) attached to c1 (A) in the final list."""

    def retrieve_many(self, requests, today=None, on_result=None):
        results = super().retrieve_many(requests, today)
        for i, result in enumerate(results):
            first = result.documents[0]
            c5 = next(c for c in result.raw_candidates if c.chunk_id == "c5")
            result.documents[0] = first.with_attached((c5,))
            if on_result:
                on_result(i, result)
        return results


def test_an_evidence_chunk_attached_to_its_documents_kept_chunk_counts_as_in_the_top_k() -> None:
    golden = GoldenSet(
        "t",
        [
            GoldenCase.model_validate(
                {"id": "p", "query": "q", "expectedDocIds": ["A"], "evidenceChunkIds": ["c5"]}
            )
        ],
        "golden.json",
    )
    (c,) = evaluate(Attaching(), golden, 3, KNOWN).cases
    assert c.evidence == {"evidenceRecall": 1 / 1, "evidenceHit": 1.0}
    assert c.evidence_lost == []


def test_at_chunk_level_an_attached_chunk_counts_at_its_hosts_rank_as_evidence_does() -> None:
    golden = GoldenSet(
        "t",
        [GoldenCase.model_validate({"id": "p", "query": "q", "expectedChunkIds": ["c5", "c2"]})],
        "golden.json",
    )
    ev = evaluate(Attaching(), golden, 3, KNOWN, k_values=[3])
    (c,) = ev.cases
    # c5 is attached to c1 at rank 1, c2 is rank 2: both found, as EvidenceHit says
    assert c.evidence == {"evidenceRecall": 2 / 2, "evidenceHit": 1.0}
    assert c.metrics is not None
    assert c.metrics["recall"] == 2 / 2
    assert c.metrics["ndcg"] == pytest.approx((1 / math.log2(2) + 1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert c.metrics["mrr"] == 1 / 1
    assert c.at_k[3]["recall"] == 2 / 2
    assert c.after_stage["diversity"]["recall"] == 2 / 2  # the list after diversity carries the attachment
    assert c.after_stage["threshold"]["recall"] == 1 / 2  # before it c5 is rank 4: not in the top 3
    assert c.lost == []
    assert c.stage_stats[1].removed_relevant == 0  # c5 was attached, not lost
    first = case_record(c).outcome.ranked_documents[0]
    assert (first.matched, first.reason) == (True, "relevant (grade 1, attached c5)")


def test_a_document_whose_id_looks_like_a_chunk_id_stays_a_document() -> None:
    odd = "c_" + "1" * 24
    known = KnownIds.from_metadata([*ROWS, ("c6", {"doc_id": odd, "source": "odd.md", "knowledge": "hr"})])
    golden = GoldenSet(
        "t", [GoldenCase.model_validate({"id": "j", "query": "q", "judgments": {odd: 2}})], "g.json"
    )
    (c,) = evaluate(FakeChain(), golden, 3, known).cases
    assert c.relevance == {odd: 2.0}
    assert c.missing_from_index == []
