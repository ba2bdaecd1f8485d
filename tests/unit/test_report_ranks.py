"""The ranks of a case's documents and lost ids in each candidate list (`Ranks`), and its trace id, through
the real chain with fake candidates and fake stages whose orders all differ: the chain's trace, the runner,
the case record, the Markdown, the JSON read back, and the log line of the case."""

from __future__ import annotations

import logging
import re
from datetime import date

import numpy as np
import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.html import render_html
from app.evaluation.render.markdown import render_markdown
from app.evaluation.report.model import Ranks, Report, report_text
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import NOT_RETRIEVED, RANKED_OUT, KnownIds, evaluate
from app.retrieval.candidates import CandidateSet
from app.retrieval.chain import ChainStage, RetrievalChain
from app.retrieval.types import Candidate, QueryContext, Removal, StageOutcome

# chunk -> document; B has two chunks
DOCS = {"a1": "A", "b1": "B", "b2": "B", "c1": "C", "d1": "D", "e1": "E"}
DENSE_HITS = ["b1", "c1", "a1", "d1", "b2"]  # cosine descending
BM25_HITS = ["e1", "b2", "c1", "a1"]  # BM25 descending; b1 and d1 hold no query term
# the list after each stage (a stage removes what its list leaves out)
AFTER = {
    "similarity_threshold": ["b1", "c1", "a1", "b2", "e1"],  # d1 below the threshold
    "bm25": ["c1", "a1", "e1", "b2", "b1"],  # fused descending
    "rerank": ["a1", "e1", "c1", "b1", "b2"],  # cross-encoder descending
    "diversity": ["a1", "e1", "c1", "b1"],  # b2: a second chunk of B
}
TOP_K = 2  # returned: a1 (A), e1 (E)


class FakeEmbedder:
    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32)


class FakeCandidates:
    """Every query gets the union of both searches, in dense order, with the searches' own orders."""

    def generate_many(self, queries, embeddings, knowledge_tags, principals=None):
        raw = [
            Candidate(
                chunk_id=c,
                doc_id=DOCS[c],
                text=f"text of {c}",
                scores={"dense": 0.9 - i / 10},
                origin=frozenset({"dense"} if c in DENSE_HITS else set())
                | frozenset({"bm25"} if c in BM25_HITS else set()),
            )
            for i, c in enumerate(DENSE_HITS + ["e1"])
        ]
        hits = {"dense": list(DENSE_HITS), "bm25": list(BM25_HITS)}
        return [CandidateSet(list(raw), {"dense": 2, "bm25": 1, "both": 3}, hits) for _ in queries]


class Ordered:
    """A stage that puts its candidates in the order AFTER names, removing those it leaves out."""

    def __init__(self, name: str, skipped: str | None = None):
        self.name = name
        self.skipped = skipped

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        if self.skipped is not None:
            return StageOutcome(kept=list(candidates), skipped=self.skipped)
        by_id = {c.chunk_id: c for c in candidates}
        kept = [by_id[c] for c in AFTER[self.name] if c in by_id]
        removed = [Removal(c.chunk_id, c.doc_id, f"{self.name} said no") for c in candidates if c not in kept]
        return StageOutcome(kept=kept, removed=removed)


def chain(rerank_skipped: str | None = None, bm25_enabled: bool = True) -> RetrievalChain:
    stages = [
        ChainStage(Ordered("similarity_threshold"), True),
        ChainStage(Ordered("bm25"), bm25_enabled),
        ChainStage(Ordered("rerank", rerank_skipped), True),
        ChainStage(Ordered("diversity"), True),
    ]
    return RetrievalChain(FakeEmbedder(), FakeCandidates(), stages)  # type: ignore[arg-type]


GOLDEN = GoldenSet(
    dataset_version="t",
    path="golden.json",
    cases=[
        GoldenCase.model_validate(
            {
                "id": "q1",
                "query": "where is B",
                "expectedDocIds": ["A", "B", "D", "F"],
                "evidenceChunkIds": ["b2"],
                "topK": TOP_K,
            }
        )
    ],
)
KNOWN = KnownIds.from_metadata([(c, {"doc_id": d}) for c, d in DOCS.items()] + [("f1", {"doc_id": "F"})])


def report_of(run_chain: RetrievalChain) -> Report:
    evaluation = evaluate(run_chain, GOLDEN, 5, KNOWN, today=date(2030, 1, 2))
    return measure_report(evaluation, {"evaluatedAt": "2030-01-02T00:00:00+00:00"})


def test_each_document_and_lost_id_carries_its_place_in_every_candidate_list() -> None:
    (case,) = report_of(chain()).cases
    assert [(d.doc_id, d.ranks) for d in case.outcome.ranked_documents] == [
        ("A", Ranks(dense=3, bm25=4, fused=2, rerank=1)),
        ("E", Ranks(dense=None, bm25=1, fused=3, rerank=2)),  # a BM25 hit only
    ]
    lost = {x.id: (x.where, x.ranks) for x in case.analysis.lost}
    assert lost == {
        # each list's best placed chunk of B: b1 in the dense list and after rerank, b2 in BM25's and fused
        "B": (RANKED_OUT, Ranks(dense=1, bm25=2, fused=4, rerank=4)),
        "D": ("REMOVED_BY_similarity_threshold", Ranks(dense=4)),
        "F": (NOT_RETRIEVED, Ranks()),
    }
    # an evidence chunk is its own item: b2, not its document's best chunk
    assert [(x.id, x.where, x.ranks) for x in case.analysis.evidence_lost] == [
        ("b2", "REMOVED_BY_diversity", Ranks(dense=5, bm25=2, fused=4, rerank=5))
    ]


@pytest.mark.parametrize(
    ("run_chain", "a_ranks", "b_ranks"),
    [
        # no reranker model: the rerank list is not made
        (
            chain(rerank_skipped="skipped: no reranker model"),
            Ranks(dense=3, bm25=4, fused=2),
            Ranks(dense=1, bm25=2, fused=4),
        ),
        # the bm25 stage off: no fused list (the rerank list is what the fake rerank made of the candidates)
        (chain(bm25_enabled=False), Ranks(dense=3, bm25=4, rerank=1), Ranks(dense=1, bm25=2, rerank=4)),
    ],
)
def test_a_stage_that_did_not_run_gives_no_rank(run_chain, a_ranks, b_ranks) -> None:
    (case,) = report_of(run_chain).cases
    assert case.outcome.ranked_documents[0].doc_id == "A"
    assert case.outcome.ranked_documents[0].ranks == a_ranks
    assert next(x.ranks for x in case.analysis.lost if x.id == "B") == b_ranks


def test_the_markdown_shows_the_ranks_in_the_worst_cases_the_losses_and_the_ranking() -> None:
    report = report_of(chain())
    text = render_markdown(report, case_detail=True)
    # worst cases: the top 3 with their ranks, and where each expected id was lost with its ranks
    row = next(line for line in text.splitlines() if line.startswith("| q1 |"))
    assert "A (n/a; dense #3, bm25 #4, fused #2, rerank #1), E (n/a; bm25 #1, fused #3, rerank #2)" in row
    assert (
        "B: RANKED_OUT at dense #1, bm25 #2, fused #4, rerank #4 (K=2); "
        "D: REMOVED_BY_similarity_threshold at dense #4; F: NOT_RETRIEVED" in row
    )
    # the case detail: the losses with their reasons, the evidence losses, and the ranking's columns
    assert (
        "Lost: B RANKED_OUT at dense #1, bm25 #2, fused #4, rerank #4 (survived every stage but ranked "
        "below K=2); D REMOVED_BY_similarity_threshold at dense #4 (similarity_threshold said no); "
        "F NOT_RETRIEVED (not among the vector or BM25 candidates)" in text
    )
    assert (
        "lost: b2 REMOVED_BY_diversity at dense #5, bm25 #2, fused #4, rerank #5 (diversity said no)" in text
    )
    assert (
        "| Rank | docId | Source | Title | Fused | Dense | BM25 | Rerank "
        "| dense# | bm25# | fused# | rerank# |" in text
    )
    assert "| 2 | E |  |  | n/a | 0.400 | n/a | n/a | - | 1 | 3 | 2 | no |" in text


def test_the_ranks_and_the_trace_id_survive_the_json() -> None:
    report = report_of(chain())
    again = Report.model_validate_json(report_text(report))
    assert again == report
    (case,) = again.cases
    assert case.outcome.ranked_documents[1].ranks == Ranks(bm25=1, fused=3, rerank=2)
    assert report.to_json()["cases"][0]["lost"][0]["ranks"] == {
        "dense": 1,
        "bm25": 2,
        "fused": 4,
        "rerank": 4,
    }
    assert render_markdown(again, case_detail=True) == render_markdown(report, case_detail=True)
    assert render_html(again) == render_html(report)


def test_the_case_record_and_the_log_line_of_the_case_carry_the_same_trace_id(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="sieve.evaluation"):
        report = report_of(chain())
    (case,) = report.cases
    assert case.outcome.trace_id is not None and re.fullmatch("[0-9a-f]{16}", case.outcome.trace_id)
    assert report.to_json()["cases"][0]["traceId"] == case.outcome.trace_id
    lines = [r.getMessage() for r in caplog.records if "case done" in r.getMessage()]
    assert len(lines) == 1
    assert f"caseId=q1, traceId={case.outcome.trace_id}, " in lines[0]
    # each evaluation is a run of its own
    assert report_of(chain()).cases[0].outcome.trace_id != case.outcome.trace_id
