"""Golden evidence as quotes: parsing, resolution on the index (found, not found, ambiguous), the coverage
rule, and the evidence and character figures of a ranking (expected values written as arithmetic)."""

from __future__ import annotations

import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet, GoldenSetError, parse_golden_set
from app.evaluation.golden.quotes import find_quote, is_returned, quote_key
from app.evaluation.run.build import stage_table
from app.evaluation.run.evidence import EvidenceIndex, document_texts
from app.evaluation.run.runner import KnownIds, evaluate
from app.evaluation.scoring.characters import (
    best_group_chars,
    char_precision,
    context_chars,
    covered_chars,
    evidence_char_recall,
)
from app.ingest.spans import normalise
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace
from app.store import StoredChunk

# Document A's normalised text, and two overlapping chunks of it: c1 = [0, 40), c2 = [30, 80)
TEXT_A = "Pay day. Salaries are paid on the 10th of each month. Holidays move the payday earlier."
SPANS = {"c1": ("A", 0, 40), "c2": ("A", 30, 80), "c3": ("B", 0, 20)}
QUOTE = "on the 10th of each month"  # at 28..53 of TEXT_A: it straddles c1 and c2
Q_START = TEXT_A.index(QUOTE)
Q_END = Q_START + len(QUOTE)


def chunk(chunk_id: str, attached: tuple[Candidate, ...] = ()) -> Candidate:
    doc, start, end = SPANS[chunk_id]
    text = TEXT_A[start:end] if doc == "A" else "b" * (end - start)
    meta = {"doc_id": doc, "char_start": start, "char_end": end}
    return Candidate(chunk_id=chunk_id, doc_id=doc, text=text, metadata=meta, attached=attached)


class ListChain:
    """Returns `ranked` (candidates) for every request."""

    stage_names: list[str] = []

    def __init__(self, ranked: list[Candidate]):
        self.ranked = ranked

    def retrieve_many(self, requests, today=None, on_result=None):
        out = []
        for i, request in enumerate(requests):
            trace = RetrievalTrace(stages=[], ranked_after={"candidates": [c.chunk_id for c in self.ranked]})
            result = RetrievalResult(
                request.query, self.ranked[: request.top_k], 3, False, trace, 1.0, self.ranked
            )
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def known() -> KnownIds:
    rows = [(c, {"doc_id": d, "char_start": s, "char_end": e}) for c, (d, s, e) in SPANS.items()]
    index = KnownIds.from_metadata(rows)
    index.texts = lambda ids: {d: {"A": TEXT_A, "B": "b" * 20}[d] for d in ids}
    return index


def golden(**fields) -> GoldenSet:
    case = GoldenCase.model_validate({"id": "pay-1", "query": "when is payday", **fields})
    return GoldenSet(dataset_version="t", cases=[case], path="golden.json")


def evidence_of(ranked: list[Candidate], coverage: float = 1.0, **fields) -> dict[str, float] | None:
    fields.setdefault("evidence", [{"docId": "A", "quote": QUOTE}])
    run = evaluate(ListChain(ranked), golden(**fields), 5, known(), coverage=coverage)
    return run.cases[0].evidence


# -- parsing -------------------------------------------------------------------------------------------


def test_a_case_names_quotes_as_evidence_and_in_any_of_groups_beside_chunk_ids():
    text = (
        '[{"id": "q", "query": "payday", "evidence": [{"docId": "A", "quote": "the 10th"}],'
        ' "anyOf": [[{"docId": "A", "quote": "x"}, "c_1"], ["c_2"]],'
        ' "judgedQuotes": [{"docId": "A", "quote": "y", "grade": 2}]}]'
    )
    [case] = parse_golden_set(text, "g.json").cases
    groups = case.evidence_groups()
    assert [[getattr(i, "quote", i) for i in g] for g in groups] == [["x", "c_1"], ["c_2"], ["the 10th"]]
    assert case.judged_quotes[0].grade == 2


@pytest.mark.parametrize(
    "evidence, field",
    [
        ('[{"docId": "A", "quote": "  "}]', "evidence[0].quote"),
        ('[{"docId": "A"}]', "evidence[0].quote"),
        ('[{"docId": "A", "quote": "x", "start": 3}]', "start"),
    ],
)
def test_a_bad_quote_is_named_by_its_field(evidence, field):
    with pytest.raises(GoldenSetError) as err:
        parse_golden_set(f'[{{"id": "q", "query": "p", "evidence": {evidence}}}]', "g.json")
    assert field in str(err.value)


# -- resolution ----------------------------------------------------------------------------------------


def test_a_quote_resolves_to_its_one_place_in_the_normalised_text():
    assert find_quote(TEXT_A, "on  the 10th\nof each month") == (Q_START, Q_END)
    assert find_quote(normalise("工资于每月１０日发放。"), "每月10日") == (
        len("工资于"),
        len("工资于每月10日"),
    )


def test_a_quote_found_nowhere_or_twice_is_a_golden_set_error_naming_file_case_and_quote():
    with pytest.raises(GoldenSetError) as err:
        evidence_of([chunk("c1")], evidence=[{"docId": "A", "quote": "on the 11th"}])
    assert "golden.json: case 'pay-1': quote 'on the 11th' of document 'A': not found" in str(err.value)
    with pytest.raises(GoldenSetError) as err:
        evidence_of([chunk("c1")], evidence=[{"docId": "A", "quote": "day"}])
    assert "golden.json: case 'pay-1': quote 'day' of document 'A': ambiguous: found at characters" in str(
        err.value
    )


def test_a_quote_of_a_document_not_in_the_index_is_a_real_miss_not_an_error():
    run = evaluate(ListChain([chunk("c1")]), golden(evidence=[{"docId": "Z", "quote": "gone"}]), 5, known())
    [case] = run.cases
    assert case.evidence == {"evidenceRecall": 0.0, "evidenceHit": 0.0}
    assert case.missing_from_index == ["Z", "Z[unplaced: gone]"]


# -- the coverage rule ---------------------------------------------------------------------------------


def test_the_union_of_returned_chunks_covers_a_quote_across_a_chunk_boundary():
    quote = ("A", Q_START, Q_END)
    assert is_returned({"A": [(0, 40), (30, 80)]}, quote, 1.0)
    assert not is_returned({"A": [(0, 40)]}, quote, 1.0)
    # c1 alone covers [Q_START, 40) of the quote
    assert is_returned({"A": [(0, 40)]}, quote, (40 - Q_START) / (Q_END - Q_START))
    assert not is_returned({"A": [(0, 40)]}, quote, (40 - Q_START + 1) / (Q_END - Q_START))
    assert not is_returned({"B": [(0, 100)]}, quote, 0.1)  # another document's span never covers it


def test_an_attached_chunk_completes_the_quote_and_the_evidence_is_hit():
    assert evidence_of([chunk("c1", attached=(chunk("c2"),))])["evidenceHit"] == 1.0
    assert evidence_of([chunk("c3"), chunk("c1"), chunk("c2")])["evidenceHit"] == 1.0
    assert evidence_of([chunk("c1"), chunk("c3")])["evidenceHit"] == 0.0
    assert evidence_of([chunk("c1"), chunk("c3")], coverage=0.5)["evidenceHit"] == 1.0


def test_any_of_quote_groups_take_the_best_covered_group():
    groups = [[{"docId": "A", "quote": "Holidays move"}, {"docId": "B", "quote": "bbbbbbbbbbbbbbbbbbbb"}]]
    got = evidence_of([chunk("c3")], anyOf=groups, evidence=[{"docId": "A", "quote": QUOTE}])
    assert got["evidenceRecall"] == 1 / 2  # anyOf: B's quote of two; evidence: 0 of 1
    assert got["evidenceHit"] == 0.0


def test_chunk_id_evidence_keeps_working_beside_quotes():
    got = evidence_of([chunk("c2")], evidence=[], evidenceChunkIds=["c2"])
    assert got["evidenceHit"] == 1.0
    assert got["evidenceCharRecall"] == (80 - 30) / (80 - 30)


# -- character figures ---------------------------------------------------------------------------------


def test_character_figures_of_a_quote_split_over_two_chunks():
    got = evidence_of([chunk("c1"), chunk("c3")])
    # evidence [Q_START, Q_END); returned: c1 [0, 40) of A and c3 [0, 20) of B
    assert got["evidenceCharRecall"] == (40 - Q_START) / (Q_END - Q_START)
    assert got["charPrecision"] == (40 - Q_START) / ((40 - 0) + (20 - 0))


def test_evidence_char_recall_and_char_precision_by_their_definitions():
    evidence = [("A", 100, 220)]
    returned = [("A", 0, 200), ("A", 150, 260), ("B", 0, 50)]
    # returned A = [0, 260) once (the overlap counts once), B = [0, 50)
    assert covered_chars(returned, evidence) == 220 - 100
    assert evidence_char_recall(returned, evidence) == (220 - 100) / 120
    assert char_precision(returned, evidence) == (220 - 100) / (260 + 50)
    assert evidence_char_recall([("A", 0, 120)], evidence) == (120 - 100) / 120
    assert char_precision([], evidence) == 0.0


def test_best_group_chars_reads_the_group_with_the_highest_character_recall():
    returned = [("A", 0, 100)]
    groups = [[("A", 50, 150)], [("A", 0, 40), ("B", 0, 40)]]
    # group 1: (100 - 50) / 100 = 0.5; group 2: 40 / 80 = 0.5 -> the first on a tie
    assert best_group_chars(returned, groups) == ((100 - 50) / 100, (100 - 50) / 100)
    assert best_group_chars(returned, [[("A", 0, 40)], groups[0]]) == (40 / 40, 40 / 100)


def test_context_chars_counts_every_text_in_full():
    assert context_chars(["a" * 600, "b" * 300, ""]) == 600 + 300


def test_a_quote_key_names_its_document_and_span():
    assert quote_key("hr-payroll-en", (120, 146)) == "hr-payroll-en[120:146]"


def test_the_list_after_each_stage_has_its_character_figures():
    run = evaluate(
        ListChain([chunk("c1"), chunk("c3")]), golden(evidence=[{"docId": "A", "quote": QUOTE}]), 5, known()
    )
    after = run.cases[0].after_stage["candidates"]
    # the top K of the candidate list: c1 (40 characters of A) and c3 (20 of B)
    assert after["contextChars"] == (40 - 0) + (20 - 0)
    assert after["evidenceCharRecall"] == (40 - Q_START) / (Q_END - Q_START)
    assert after["charPrecision"] == (40 - Q_START) / ((40 - 0) + (20 - 0))
    [row] = stage_table(run)  # the candidates row: this chain has no stages
    assert row.after_stage["contextChars"] == (40 + 20) / 1
    assert row.after_stage["evidenceCharRecall"] == (40 - Q_START) / (Q_END - Q_START)


def test_without_the_record_a_documents_text_is_the_one_its_chunks_hold():
    class Store:
        def get(self, ids, include_embeddings=True):
            spans = {"a#0": (0, 9), "a#1": (12, 20)}  # characters 9..12 (a heading, say) are in no chunk
            texts = {"a#0": "Pay  day.", "a#1": "the 10th"}
            return [StoredChunk(i, texts[i], {"doc_id": "a", "char_start": spans[i][0]}) for i in ids]

    index = EvidenceIndex(doc_chunks={"a": ["a#0", "a#1"]})
    text = document_texts(Store(), None, index)(["a"])["a"]
    assert text == "Pay day." + "\0" * (12 - 8) + "the 10th"
    assert find_quote(text, "the 10th") == (12, 20)
    assert find_quote(text, "day. the").startswith("not found")  # never across a gap


def test_a_quote_no_chunk_could_return_is_a_golden_set_error():
    # "payday earlier." is [72, 87) of TEXT_A; the chunks reach 80: 8 of its 15 characters are in a chunk
    tail = [{"docId": "A", "quote": "payday earlier."}]
    with pytest.raises(GoldenSetError) as err:
        evidence_of([chunk("c2")], evidence=tail)
    assert "quote 'payday earlier.' of document 'A': found at characters 72-87, but even all" in str(
        err.value
    )
    assert evidence_of([chunk("c2")], coverage=(80 - 72) / (87 - 72), evidence=tail)["evidenceHit"] == 1.0


def test_a_quote_on_chunks_without_spans_names_the_rebuild():
    index = KnownIds.from_metadata([("c1", {"doc_id": "A"})])  # a store indexed before chunker md-v2
    index.texts = lambda ids: {"A": TEXT_A}
    with pytest.raises(GoldenSetError) as err:
        evaluate(ListChain([chunk("c1")]), golden(evidence=[{"docId": "A", "quote": QUOTE}]), 5, index)
    assert "the document's chunks carry no character span" in str(err.value)
    assert "run `sieve store rebuild`" in str(err.value)
