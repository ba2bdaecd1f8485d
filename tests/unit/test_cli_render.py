"""`sieve query`'s human table: full doc ids and sources in columns as wide as the longest, only the text
cut (to `SNIPPET_CHARS` characters, whitespace folded)."""

from __future__ import annotations

import pytest

from app.access.scope import Principal
from app.cli.query import SNIPPET_CHARS, _principal, render_result
from app.retrieve_response import RetrievedDocument, RetrieveResponse, ScopeView, Scores, StageReport
from app.settings import AccessSettings, SettingsError

LONG_ID = "finance-expense-reimbursement-policy-for-contractors-zh"


def _document(rank: int, doc_id: str, source: str, text: str) -> RetrievedDocument:
    return RetrievedDocument(
        rank=rank,
        docId=doc_id,
        chunkId=f"c_{rank}",
        source=source,
        title=f"Title {rank}",
        text=text,
        knowledgeTag=None,
        headingPath="",
        origin=["dense"],
        scores=Scores(dense=0.9123, bm25=3.5, fused=0.8971),
    )


def test_doc_ids_are_never_cut_and_only_the_text_is() -> None:
    text = "word " * 40
    response = RetrieveResponse(
        query="q",
        documents=[
            _document(1, LONG_ID, "finance-portal/contractors", text),
            _document(2, "hr-payroll-zh", "hr-handbook", "short\n\ntext"),
        ],
        originalCount=9,
        finalCount=2,
        fallbackUsed=False,
        candidateOrigins={"dense": 9},
        stages=[
            StageReport(
                name="bm25", enabled=True, inputCount=9, outputCount=2, removed=7, added=0, latencyMs=0.25
            )
        ],
        latencyMs=12.4,
    )
    lines = render_result(response).splitlines()
    assert "…" not in "\n".join(lines)
    id_width, source_width = len(LONG_ID), len("finance-portal/contractors")
    assert lines[3] == (
        f" #  {'docId':<{id_width}} {'source':<{source_width}}  dense    bm25   fused  rerank  title / text"
    )
    snippet = " ".join(text.split())[:SNIPPET_CHARS]
    assert lines[4] == (
        f" 1  {LONG_ID} finance-portal/contractors  0.912    3.50  0.8971       -  Title 1: {snippet}"
    )
    assert lines[5] == (
        f" 2  {'hr-payroll-zh':<{id_width}} {'hr-handbook':<{source_width}}  0.912    3.50  0.8971       -  "
        "Title 2: short text"
    )
    assert len(snippet) == SNIPPET_CHARS == 60
    assert lines[-1] == f"  {'bm25':<21} {'  9 -> 2   removed 7':<40} {0.25:7.1f} ms"


def test_a_scoped_answer_says_whose_scope_it_was_made_in() -> None:
    response = RetrieveResponse(
        query="q",
        documents=[],
        originalCount=0,
        finalCount=0,
        fallbackUsed=False,
        candidateOrigins={},
        stages=[],
        latencyMs=1.0,
        scope=ScopeView(name="sales-rep", tenant="acme", readers=["group:sales", "public"]),
    )
    assert (
        render_result(response).splitlines()[2]
        == "scope: sales-rep (tenant acme; reads as group:sales, public)"
    )


def test_as_names_an_evaluation_principal_or_is_refused_listing_them() -> None:
    defined = AccessSettings(eval_principals={"hr-manager": {"tenant": "acme", "groups": ["hr"]}})
    assert _principal(defined, "hr-manager") == Principal("hr-manager", "acme", ("hr",))
    assert _principal(defined, None) is None
    with pytest.raises(
        SettingsError, match=r"--as 'boss': not one of rag.access.eval_principals \(defined: hr-manager\)"
    ):
        _principal(defined, "boss")
