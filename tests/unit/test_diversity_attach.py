"""The diversity stage's attachment: chunks of a document past max_per_document ride along with the
document's kept chunk (best first, up to attach_per_document) instead of only being dropped, so the passage
that answers reaches the reader without the document taking a second rank."""

from __future__ import annotations

from datetime import date

from app.retrieval.stages.diversity import DiversityStage
from app.retrieval.types import Candidate, QueryContext
from app.retrieve_response import retrieve_response
from app.settings import DiversitySettings


def chunk(chunk_id: str, doc_id: str) -> Candidate:
    return Candidate(chunk_id, doc_id, f"text of {chunk_id}", {"heading_path": f"T > {chunk_id}"}, None, {})


RANKED = [chunk("faq", "pay"), chunk("x1", "other"), chunk("payday", "pay"), chunk("holiday", "pay")]


def run(**settings) -> tuple[list[Candidate], dict[str, str]]:
    stage = DiversityStage(DiversitySettings(max_cosine=None, **settings))
    outcome = stage.run(QueryContext(text="q", today=date(2024, 5, 1)), list(RANKED))
    return outcome.kept, {r.chunk_id: r.reason for r in outcome.removed}


def test_the_next_chunks_of_a_kept_document_are_attached_best_first() -> None:
    kept, removed = run(max_per_document=1, attach_per_document=2)
    assert [c.chunk_id for c in kept] == ["faq", "x1"]  # the document keeps its one rank
    assert [a.chunk_id for a in kept[0].attached] == ["payday", "holiday"]
    assert kept[0].chunk_ids_with_attached() == ["faq", "payday", "holiday"]
    # still removed from the ranking, so kept + removed = input, and the trace says where each went
    assert removed == {
        "payday": "doc=pay already has 1; attached to faq",
        "holiday": "doc=pay already has 1; attached to faq",
    }


def test_attachment_stops_at_its_limit_and_zero_only_drops() -> None:
    kept, removed = run(max_per_document=1, attach_per_document=1)
    assert [a.chunk_id for a in kept[0].attached] == ["payday"]
    assert removed["holiday"] == "doc=pay already has 1"
    kept, removed = run(max_per_document=1, attach_per_document=0)
    assert kept[0].attached == ()
    assert removed == {"payday": "doc=pay already has 1", "holiday": "doc=pay already has 1"}


def test_the_input_candidates_are_never_changed() -> None:
    run(max_per_document=1, attach_per_document=2)
    assert all(c.attached == () for c in RANKED)


def test_the_response_lists_the_attached_chunks_under_their_document() -> None:
    kept, _ = run(max_per_document=1, attach_per_document=2)

    class Trace:
        candidate_origins: dict[str, int] = {}
        stages: list = []
        scope = None

    class Result:
        query, documents, original_count, fallback_used, latency_ms = "q", kept, 4, False, 1.0
        trace = Trace()

    response = retrieve_response(Result())  # type: ignore[arg-type]
    first = response.documents[0]
    assert [(a.chunkId, a.headingPath, a.text) for a in first.attached] == [
        ("payday", "T > payday", "text of payday"),
        ("holiday", "T > holiday", "text of holiday"),
    ]
    assert response.documents[1].attached == []
