"""`sieve golden anchor`'s rewrite of one case: chunk ids the index holds become quotes; stale and
ambiguous ids and expectedChunkIds stay, and are listed."""

from __future__ import annotations

import json
from pathlib import Path

from app.evaluation.golden.anchor import AnchorReport, anchor_case, default_out, read_raw, render_raw
from app.evaluation.golden.cases import parse_golden_set

C1, C2, C3, STALE = "c_" + "1" * 24, "c_" + "2" * 24, "c_" + "3" * 24, "c_" + "9" * 24
CHUNKS = {C1: ("pay", "Paid on the 10th."), C2: ("pay", "Earlier on holidays."), C3: ("pay", "Yes.")}


def unique(doc_id: str, quote: str) -> bool:
    return quote != "Yes."  # "Yes." occurs twice in its document


def test_chunk_ids_become_quotes_and_the_rest_of_the_case_is_kept():
    case = {
        "id": "q",
        "query": "payday",
        "expectedDocIds": ["pay"],
        "evidenceChunkIds": [C1, STALE],
        "anyOf": [[C2, C3]],
        "judgments": {C1: 2, "pay": 1},
        "note": "kept",
    }
    report = AnchorReport()
    got = anchor_case(case, CHUNKS, unique, report)
    assert got == {
        "id": "q",
        "query": "payday",
        "expectedDocIds": ["pay"],
        "evidenceChunkIds": [STALE],
        "anyOf": [[{"docId": "pay", "quote": "Earlier on holidays."}, C3]],
        "judgments": {"pay": 1},
        "note": "kept",
        "evidence": [{"docId": "pay", "quote": "Paid on the 10th."}],
        "judgedQuotes": [{"docId": "pay", "quote": "Paid on the 10th.", "grade": 2}],
    }
    assert (report.anchored, report.cases) == (3, 1)
    assert report.stale == [f"q: {STALE}"] and report.ambiguous == [f"q: {C3}"]
    parse_golden_set(json.dumps([got]), "anchored.json")  # still a valid golden case


def test_a_fully_anchored_case_loses_its_chunk_id_fields_and_expected_chunk_ids_stay():
    case = {"id": "q", "query": "p", "expectedChunkIds": [C1], "evidenceChunkIds": [C1]}
    report = AnchorReport()
    got = anchor_case(case, CHUNKS, unique, report)
    assert "evidenceChunkIds" not in got and got["expectedChunkIds"] == [C1]
    assert report.kept_expected == [f"q: {C1}"]


def test_the_file_keeps_its_form_and_goes_beside_the_golden_set_by_default(tmp_path: Path):
    path = tmp_path / "golden-set.json"
    path.write_text(json.dumps({"datasetVersion": "v1", "cases": [{"id": "q", "query": "p"}]}))
    top, cases, form = read_raw(path)
    assert form == "wrapped"
    assert json.loads(render_raw(top, cases, form)) == {
        "datasetVersion": "v1",
        "cases": [{"id": "q", "query": "p"}],
    }
    assert default_out(path) == tmp_path / "golden-set.anchored.json"
