"""The golden-set audit's finders over tiny fixtures: fake vectors, an `IndexView` of a few rows, golden cases
written inline; every expected finding is written out whole."""

from __future__ import annotations

import json
import math
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from app.cli import main
from app.evaluation.golden.audit import checks
from app.evaluation.golden.audit import index as audit_index
from app.evaluation.golden.audit import source as audit_source
from app.evaluation.golden.audit.index import IndexView
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render import audit as render_audit
from app.evaluation.report.model import (
    Audit,
    ContentCopy,
    Coverage,
    DuplicateQuery,
    Excluded,
    QueryPair,
    RelevantAndForbidden,
    Report,
    StaleId,
    Suggestion,
    TagCoverage,
)
from app.ingest.ids import text_sha256
from app.settings import EvaluateSettings, HardFilterSettings

AS_OF = date(2026, 1, 1)


EXPECTATIONS = {
    "expectedDocIds",
    "expectedChunkIds",
    "expectedSources",
    "relevance",
    "judgments",
    "evidenceChunkIds",
    "expectNoAnswer",
    "draft",
}


def case(case_id: str, query: str = "a question", **fields: Any) -> GoldenCase:
    if not EXPECTATIONS & set(fields):
        fields["expectedDocIds"] = ["payroll"]
    return GoldenCase.model_validate({"id": case_id, "query": query, **fields})


def row(chunk_id: str, doc: str, text: str = "body text", position: int = 0, **meta: Any):
    meta.setdefault("doc_sha256", f"sha-{doc}")
    return chunk_id, {"doc_id": doc, "position": position, **meta}, text


def index_of(*rows) -> IndexView:
    return IndexView.from_rows(rows)


# A small base: payroll (two chunks), the VPN guide and its mirror (one doc_sha256), a retired and a
# future policy, an untouched printer guide; tags hr, it, travel.
BASE = index_of(
    row("c_pay0", "payroll", "Salary is paid on the 10th.", 0, knowledge="hr", source="hr.md"),
    row("c_pay1", "payroll", "Payslips are in the portal.", 1, knowledge="hr", source="hr.md"),
    row("c_vpn", "vpn", "Install HexaConnect.", knowledge="it", doc_sha256="sha-vpn"),
    row("c_vpnm", "vpn-mirror", "Install HexaConnect.", knowledge="it", doc_sha256="sha-vpn"),
    row(
        "c_old",
        "travel-2022",
        "Meals 80 a day.",
        knowledge="travel",
        status="retired",
        effectiveTo="2023-12-31",
    ),
    row("c_new", "travel-2099", "Meals 150 a day.", knowledge="travel", effectiveFrom="2099-01-01"),
    row("c_print", "printer", "Printers are on floor 3.", knowledge="it"),
)


# -- normalised duplicates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("  When's  PAYDAY？ ", "when's payday"),  # casefold, squeeze, full-width ？ dropped at the end
        ("ＡＢＣ１２３。。", "abc123"),  # NFKC folds full-width letters and digits
        ("工资\u3000什么时候发？！", "工资 什么时候发"),  # the ideographic space is whitespace
        ("v1.2 release?", "v1.2 release"),  # punctuation inside stays
        ("Straße", "strasse"),  # casefold, not lower
        ("?!", ""),
    ],
)
def test_normalise_query(text: str, normalised: str) -> None:
    assert checks.normalise_query(text) == normalised


def test_duplicate_queries_are_grouped_by_normalised_text_whatever_their_groups() -> None:
    cases = [
        case("a", "When is payday?", group="g"),
        case("b", "when is  PAYDAY"),
        case("c", "Where is the printer?"),
        case("d", "When is payday！"),
    ]
    assert checks.duplicate_queries(cases) == [DuplicateQuery("when is payday", ["a", "b", "d"])]


# -- near duplicates: a pure function over given vectors --------------------------------------------------


VECTORS = np.array(
    [
        [1.0, 0.0],  # 0
        [0.96, 0.28],  # 1: length 1, cos(0, 1) = 0.96
        [0.0, 1.0],  # 2: cos(1, 2) = 0.28
        [2.0, 0.0],  # 3: cos(0, 3) = 1, cos(1, 3) = 0.96 (length does not matter)
        [0.0, 0.0],  # 4: no length: pairs with nothing
    ]
)


def test_near_duplicate_pairs_are_every_pair_at_or_above_the_threshold() -> None:
    pairs = checks.near_duplicate_pairs(VECTORS, 0.95)
    assert [(i, j) for i, j, _ in pairs] == [(0, 1), (0, 3), (1, 3)]
    assert [c for _, _, c in pairs] == pytest.approx([0.96, 1.0, 0.96])
    assert checks.near_duplicate_pairs(VECTORS, 0.961) == [(0, 3, pytest.approx(1.0))]


def test_near_duplicate_pairs_across_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "COSINE_BLOCK", 2)  # rows 0-1, 2-3, 4 in separate products
    assert [(i, j) for i, j, _ in checks.near_duplicate_pairs(VECTORS, 0.95)] == [(0, 1), (0, 3), (1, 3)]


@given(
    arrays(np.float64, st.tuples(st.integers(0, 8), st.just(3)), elements=st.floats(-1, 1, width=32)),
    st.floats(-1.0, 1.0),
)
def test_near_duplicate_pairs_match_the_brute_force_cosines(vectors: np.ndarray, threshold: float) -> None:
    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        na, nb = math.sqrt(a @ a), math.sqrt(b @ b)
        return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0

    found = {(i, j): c for i, j, c in checks.near_duplicate_pairs(vectors, threshold)}
    for i in range(len(vectors)):
        for j in range(i + 1, len(vectors)):
            expected = cosine(vectors[i], vectors[j])
            if abs(expected - threshold) > 1e-9:  # rounding may tip a pair on the threshold either way
                assert ((i, j) in found) == (expected >= threshold)
            if (i, j) in found:
                assert found[(i, j)] == pytest.approx(expected, abs=1e-9)


def test_query_pairs_put_pairs_of_one_group_apart_as_paraphrases() -> None:
    cases = [
        case("a", "When is payday?", group="payday"),
        case("b", "What day is salary paid?", group="payday"),
        case("c", "Tell me the payday"),
        case("d", "WHEN IS PAYDAY", group="other"),  # a duplicate of a: listed as one, not as a pair
    ]
    vectors = np.array([[1.0, 0.0], [0.96, 0.28], [0.6, 0.8], [1.0, 0.0]])
    # cos(a, b) = 0.96 (paraphrase), cos(a, c) = 0.6, cos(b, c) = 0.96*0.6 + 0.28*0.8 = 0.8,
    # cos(b, d) = 0.96 (near duplicate: other groups), cos(a, d) = 1 (duplicate text: skipped)
    near, paraphrases = checks.query_pairs(cases, vectors, 0.95)
    assert paraphrases == [
        QueryPair(["a", "b"], ["When is payday?", "What day is salary paid?"], 0.96, "payday")
    ]
    assert near == [QueryPair(["b", "d"], ["What day is salary paid?", "WHEN IS PAYDAY"], 0.96, None)]


# -- stale ids and their remap ---------------------------------------------------------------------------


def test_stale_ids_with_a_remap_by_recorded_content_hash_else_a_name_guess() -> None:
    recorded = {
        "payroll-old": "sha-payroll",  # the document moved: its content is now under "payroll"
        "c_gone": text_sha256("Salary is paid on the 10th."),  # the chunk's text is now c_pay0's
        "vpn-old": "sha-vpn",  # two documents carry it now
        "travel-2021": "sha-changed",  # nothing carries it any more
    }
    cases = [
        case(
            "k1",
            expectedDocIds=["payroll-old", "payrol"],
            relevance={"payroll-old": 2},
            forbiddenDocIds=["travel-2021"],
            judgments={"c_gone": 1, "zzz-unknown": 0},
            evidenceChunkIds=["c_lost"],
            expectedSources=["hr.mdx"],
        ),
        case("k2", expectedDocIds=["vpn-old"], passageChunkId="c_pay1"),
    ]
    hash_note = "no content hash recorded for it by the previous report"
    assert checks.stale_ids(cases, BASE, recorded) == [
        StaleId(
            "k1",
            "expectedDocIds, relevance",
            "payroll-old",
            "doc",
            Suggestion(["payroll"], "contentHash", False),
            "same content now under payroll",
        ),
        StaleId(
            "k1",
            "expectedDocIds",
            "payrol",
            "doc",
            Suggestion(["payroll"], "name", True),
            f"{hash_note}; a guess by name: payroll",
        ),
        StaleId(
            "k1",
            "forbiddenDocIds",
            "travel-2021",
            "doc",
            Suggestion(["travel-2022", "travel-2099"], "name", True),
            "its recorded content is in no document or chunk now (changed or removed); "
            "a guess by name: travel-2022, travel-2099",
        ),
        StaleId(
            "k1",
            "judgments",
            "c_gone",
            "docOrChunk",
            Suggestion(["c_pay0"], "contentHash", False),
            "same content now under c_pay0",
        ),
        StaleId("k1", "judgments", "zzz-unknown", "docOrChunk", None, f"{hash_note}; no similar name"),
        StaleId(
            "k1",
            "evidenceChunkIds",
            "c_lost",
            "chunk",
            None,
            f"{hash_note}; chunk ids carry no name to guess from",
        ),
        StaleId(
            "k1",
            "expectedSources",
            "hr.mdx",
            "source",
            Suggestion(["hr.md"], "name", True),
            f"{hash_note}; a guess by name: hr.md",
        ),
        StaleId(
            "k2",
            "expectedDocIds",
            "vpn-old",
            "doc",
            Suggestion(["vpn", "vpn-mirror"], "contentHash", False),
            "same content now under vpn, vpn-mirror",
        ),
    ]


def test_expected_content_records_the_index_hashes_and_carries_a_stale_ids_recorded_one() -> None:
    k = case(
        "k",
        expectedDocIds=["payroll", "payroll-old", "never-seen"],
        evidenceChunkIds=["c_pay0"],
        expectedSources=["hr.md"],
    )
    assert checks.expected_content(k, BASE, {"payroll-old": "sha-x"}) == {
        "payroll": "sha-payroll",
        "payroll-old": "sha-x",
        "c_pay0": text_sha256("Salary is paid on the 10th."),
    }


def test_previous_content_reads_the_case_records_first_record_wins() -> None:
    report = {
        "cases": [
            {"id": "a", "expectedContent": {"x": "h1", "y": "h2"}},
            {"id": "b"},
            {"id": "c", "expectedContent": {"x": "h3", "z": 5}},
        ]
    }
    assert audit_source.previous_content(report) == {"x": "h1", "y": "h2"}
    assert audit_source.previous_content(None) == {}
    assert audit_source.previous_content({"status": "invalid", "cases": []}) == {}


# -- the hard filter's own rules -------------------------------------------------------------------------


def test_relevant_documents_the_hard_filter_removes_as_of_the_date() -> None:
    cases = [
        case("retired", expectedDocIds=["travel-2022", "payroll"]),
        case("future", relevance={"travel-2099": 2}),
        case("wrong-tag", knowledgeTag="it", expectedDocIds=["payroll"]),
        case("forbidden-only", forbiddenDocIds=["travel-2022"]),  # forbidding a filtered one is fine
        case("by-chunk", expectedChunkIds=["c_old"]),
    ]
    assert checks.hard_filter_excluded(cases, BASE, HardFilterSettings(), AS_OF) == [
        Excluded("retired", "travel-2022", "doc", ["status=retired"]),
        Excluded("future", "travel-2099", "doc", ["effectiveFrom=2099-01-01 > today=2026-01-01"]),
        Excluded("wrong-tag", "payroll", "doc", ["knowledge=hr != it"]),
        Excluded("by-chunk", "travel-2022", "doc", ["status=retired"]),
    ]


def test_hard_filter_rules_follow_the_settings() -> None:
    cases = [case("retired", expectedDocIds=["travel-2022"], knowledgeTag="hr")]
    dates_only = HardFilterSettings(excluded_statuses=[])
    assert checks.hard_filter_excluded(cases, BASE, dates_only, AS_OF) == [
        Excluded("retired", "travel-2022", "doc", ["knowledge=travel != hr"]),
    ]
    no_tag = [case("retired", expectedDocIds=["travel-2022"])]
    assert checks.hard_filter_excluded(no_tag, BASE, dates_only, AS_OF) == [
        Excluded("retired", "travel-2022", "doc", ["effectiveTo=2023-12-31 < today=2026-01-01"]),
    ]
    assert checks.hard_filter_excluded(no_tag, BASE, dates_only, date(2023, 12, 31)) == []
    # a case's own asOf wins over the run's date
    dated = [case("retired", expectedDocIds=["travel-2022"], asOf="2023-12-31")]
    assert checks.hard_filter_excluded(dated, BASE, dates_only, AS_OF) == []
    # disabled: only the knowledge tag still removes (the candidates are taken within the query's tag)
    off = HardFilterSettings(enabled=False)
    assert checks.hard_filter_excluded(no_tag, BASE, off, AS_OF) == []
    assert checks.hard_filter_excluded(cases, BASE, off, AS_OF) == [
        Excluded("retired", "travel-2022", "doc", ["knowledge=travel != hr"]),
    ]


def test_a_document_is_excluded_only_when_every_chunk_is_and_a_chunk_alone_is_checked() -> None:
    short = HardFilterSettings(min_text_chars=27)  # "long enough text, 27 chars." passes, "short" not
    index = index_of(
        row("c_a", "doc", "long enough text, 27 chars."),
        row("c_b", "doc", "short", 1),
    )
    cases = [case("d", expectedDocIds=["doc"]), case("c", expectedChunkIds=["c_b"])]
    assert checks.hard_filter_excluded(cases, index, short, AS_OF) == [
        Excluded("c", "c_b", "chunk", ["text 5 chars < 27"]),
    ]


# -- content copies, relevant-and-forbidden, coverage -----------------------------------------------------


def test_content_copies_name_the_copies_the_case_does_not_judge() -> None:
    cases = [
        case("unjudged", expectedDocIds=["vpn"]),
        case("judged", expectedDocIds=["vpn"], judgments={"vpn-mirror": 0}),
        case("forbids", expectedDocIds=["payroll"], forbiddenDocIds=["vpn-mirror"]),
        case("chunk-judged", expectedDocIds=["vpn"], judgments={"c_vpnm": 1}),
    ]
    assert checks.content_copies(cases, BASE) == [
        ContentCopy("unjudged", "vpn", "relevant", ["vpn-mirror"], ["vpn-mirror"]),
        ContentCopy("judged", "vpn", "relevant", ["vpn-mirror"], []),
        ContentCopy("forbids", "vpn-mirror", "forbidden", ["vpn"], ["vpn"]),
        # judging the mirror's chunk judges the mirror, and makes it relevant too
        ContentCopy("chunk-judged", "vpn", "relevant", ["vpn-mirror"], []),
        ContentCopy("chunk-judged", "vpn-mirror", "relevant", ["vpn"], []),
    ]


def test_relevant_in_one_case_and_forbidden_in_another_of_the_same_group() -> None:
    cases = [
        case("g1", group="g", expectedDocIds=["payroll"]),
        case("g2", group="g", expectedDocIds=["vpn"], forbiddenDocIds=["payroll"]),
        case("g3", group="g", evidenceChunkIds=["c_pay1"]),  # relevant through its chunk
        case("h1", group="h", expectedDocIds=["vpn"]),
        case("x", forbiddenDocIds=["vpn"], expectedDocIds=["payroll"]),  # no group: not compared
    ]
    assert checks.relevant_and_forbidden(cases, BASE) == [
        RelevantAndForbidden("g", "payroll", ["g1", "g3"], ["g2"]),
    ]


def test_a_grade_zero_document_is_not_relevant_even_if_its_chunk_is() -> None:
    k = case("k", judgments={"payroll": 0, "c_pay0": 2, "vpn": 1})
    assert audit_index.relevant_docs(k, BASE) == ["vpn"]
    assert audit_index.judged_docs(k, BASE) == {"payroll", "vpn"}


def test_coverage_counts_untouched_documents_and_tags() -> None:
    cases = [
        case("a", expectedDocIds=["payroll"]),
        case("b", expectedDocIds=["vpn"], forbiddenDocIds=["travel-2022"]),
        case("c", knowledgeTag="hr", expectedDocIds=["payroll"]),
        case("d", expectNoAnswer=True),
    ]
    assert checks.coverage(cases, BASE) == Coverage(
        documents=6,
        untouched_count=3,
        untouched_documents=["printer", "travel-2099", "vpn-mirror"],
        tags=[
            TagCoverage("hr", documents=1, untouched_documents=0, cases=2),
            TagCoverage("it", documents=3, untouched_documents=2, cases=1),
            TagCoverage("travel", documents=2, untouched_documents=1, cases=1),
        ],
        untouched_tags=[],
    )
    only_hr = checks.coverage([case("a", expectedDocIds=["payroll"])], BASE)
    assert (only_hr.untouched_count, only_hr.untouched_tags) == (5, ["it", "travel"])


# -- the whole audit, its JSON, its rendering ----------------------------------------------------------


def golden_of(*cases: GoldenCase) -> GoldenSet:
    return GoldenSet(dataset_version=None, cases=list(cases), path="golden.json")


SAMPLE = golden_of(
    case("p1", "When is payday?", group="pay", expectedDocIds=["payroll"]),
    case("p2", "What day is salary paid?", group="pay", expectedDocIds=["payroll"]),
    case("p3", "when is payday", expectedDocIds=["payroll"]),
    case("v1", "VPN setup", expectedDocIds=["vpn", "payroll-old"], forbiddenDocIds=["travel-2022"]),
    case("t1", "Meal allowance", expectedDocIds=["travel-2022"]),
)
SAMPLE_VECTORS = np.array([[1.0, 0.0], [0.96, 0.28], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])


def sample_audit() -> Audit:
    return checks.audit_golden_set(SAMPLE, BASE, SAMPLE_VECTORS, HardFilterSettings(), AS_OF)


def test_the_whole_audit_counts_each_kind_and_says_it_in_one_line() -> None:
    audit = sample_audit()
    assert audit.findings == {
        "duplicateQueries": 1,  # p1, p3
        "nearDuplicateQueries": 1,  # p2, p3: cos 0.96, p3 has no group
        "staleIds": 1,  # payroll-old
        "hardFilterExcluded": 1,  # t1 expects the retired travel-2022
        "contentCopies": 1,  # v1's vpn has a mirror
        "relevantAndForbidden": 0,
    }
    assert audit.paraphrases == [
        QueryPair(["p1", "p2"], ["When is payday?", "What day is salary paid?"], 0.96, "pay")
    ]
    assert audit.total_findings == 5
    assert audit.summary == (
        "5 findings (duplicate queries 1, near-duplicate queries 1, stale ids 1, "
        "expected but hard-filtered 1, content copies 1); "
        "untouched by any case: 3 of 6 documents, 0 of 3 knowledge tags; "
        "1 paraphrase pair within a group (expected)"
    )
    assert audit.expected_content["v1"] == {"vpn": "sha-vpn", "travel-2022": "sha-travel-2022"}


def test_the_audit_needs_one_vector_per_case() -> None:
    with pytest.raises(ValueError, match="4 query vectors for 5 cases"):
        checks.audit_golden_set(SAMPLE, BASE, SAMPLE_VECTORS[:4], HardFilterSettings(), AS_OF)


def test_attach_audit_moves_the_content_hashes_into_the_case_records() -> None:
    report = Report.model_validate(
        {
            "run": {},
            "cases": [{"id": "v1", "query": "q", "topK": 5}, {"id": "unknown", "query": "q", "topK": 5}],
        }
    )
    audit_source.attach_audit(report, sample_audit())
    assert [(c.case.id, c.resolved.expected_content) for c in report.cases] == [
        ("v1", {"vpn": "sha-vpn", "travel-2022": "sha-travel-2022"}),
        ("unknown", {}),
    ]
    assert [c["expectedContent"] for c in report.to_json()["cases"]] == [
        {"vpn": "sha-vpn", "travel-2022": "sha-travel-2022"},
        {},
    ]
    assert report.audit is not None and "expectedContent" not in report.to_json()["audit"]
    assert report.audit.findings["staleIds"] == 1
    # the report's audit writes the audit's JSON without its content hashes, key for key and in order
    written = {k: v for k, v in render_audit.audit_json(sample_audit()).items() if k != "expectedContent"}
    assert json.dumps(report.to_json()["audit"]) == json.dumps(written)
    audit_source.attach_audit(report, None)
    assert report.audit is None


def test_the_text_and_markdown_list_every_finding_with_its_cases() -> None:
    found = sample_audit()
    text = render_audit.audit_text(found)
    for line in [
        "Duplicate queries (same text once normalised): 1",
        "  p1, p3: 'when is payday'",
        "Near-duplicate queries (cosine >= 0.95, not of one group): 1",
        "  p2, p3: cosine 0.9600: 'What day is salary paid?' / 'when is payday'",
        "Stale ids (not in the index): 1",
        "  v1: expectedDocIds 'payroll-old': no content hash recorded for it by the previous report; "
        "a guess by name: payroll",
        "Relevant but removed by the hard filter as of 2026-01-01: 1",
        "  t1: doc travel-2022: status=retired",
        "Content copies under other ids (same doc_sha256): 1",
        "  v1: relevant vpn = vpn-mirror (not judged in the case: vpn-mirror)",
        "Relevant in one case, forbidden in another of the same group: 0",
        "Paraphrases of one group at cosine >= 0.95 (expected; not findings): 1",
        "  group pay: p1, p2: cosine 0.9600",
        "  3 of 6 documents no case touches: printer, travel-2099, vpn-mirror",
        "  knowledge tag it: 3 documents, 2 untouched, 1 cases",
    ]:
        assert line in text.splitlines()
    assert text.splitlines()[-1] == f"summary: {found.summary}"
    markdown = render_audit.audit_markdown(found)
    assert markdown[:3] == ["", "## Golden-set audit", ""]
    assert "**Stale ids (not in the index)** (1)" in markdown
    assert "**Relevant in one case, forbidden in another of the same group** (0)" not in markdown
    assert render_audit.audit_markdown(None) == []


# -- never failing an evaluation -----------------------------------------------------------------------


class _BrokenStore:
    def iter_all(self, include_text: bool = True):
        raise RuntimeError("store went away")


class _Embedder:
    name = "fake"

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 2))


def test_audit_section_says_why_it_could_not_run_instead_of_raising(tmp_path: Path) -> None:
    settings = EvaluateSettings(output_dir=str(tmp_path))
    source = audit_source.AuditSource(_BrokenStore(), _Embedder(), HardFilterSettings())
    section = audit_source.audit_section(SAMPLE, source, settings)
    assert section.ran is False
    assert section.error == "could not run: RuntimeError: store went away"
    assert render_audit.audit_markdown(section) == [
        "",
        "## Golden-set audit",
        "",
        "The audit could not run: RuntimeError: store went away.",
    ]
    off = EvaluateSettings(output_dir=str(tmp_path), audit={"enabled": False})
    assert (
        audit_source.audit_section(SAMPLE, source, off).error
        == "not run: rag.evaluate.audit.enabled is false"
    )


class _Store:
    """`iter_all` and `get` over BASE's rows."""

    def __init__(self, rows):
        self.rows = rows

    def iter_all(self, include_text: bool = True):
        from app.store import StoredChunk

        return iter([StoredChunk(c, t if include_text else "", m) for c, m, t in self.rows])

    def get(self, ids, include_embeddings: bool = True):
        from app.store import StoredChunk

        return [StoredChunk(c, t, m) for c, m, t in self.rows if c in set(ids)]


def test_run_audit_reads_the_previous_reports_hashes(tmp_path: Path) -> None:
    rows = [row("c_pay0", "payroll-new", "Salary is paid on the 10th.", doc_sha256="sha-pay")]
    previous = tmp_path / "retrieval-eval-latest.json"
    previous.write_text(
        '{"cases": [{"id": "k", "expectedContent": {"payroll": "sha-pay"}}]}', encoding="utf-8"
    )
    golden = golden_of(case("k", expectedDocIds=["payroll"]))
    source = audit_source.AuditSource(_Store(rows), _Embedder(), HardFilterSettings())
    audit = audit_source.run_audit(golden, source, AS_OF, previous)
    assert audit.stale_ids == [
        StaleId(
            "k",
            "expectedDocIds",
            "payroll",
            "doc",
            Suggestion(["payroll-new"], "contentHash", False),
            "same content now under payroll-new",
        )
    ]
    assert audit.previous_report == f"{previous} (1 recorded content hashes)"
    assert audit.expected_content == {"k": {"payroll": "sha-pay"}}  # carried over for the next run
    assert audit.embedder == "fake"


def test_golden_check_exits_2_on_a_broken_golden_set(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "golden.json"
    broken.write_text('[{"id": "a", "query": "q", "expectedDocIdz": ["x"]}]', encoding="utf-8")
    assert main(["golden", "check", "--golden-set", str(broken)]) == 2
    err = capsys.readouterr().err
    assert 'unknown field "expectedDocIdz"; did you mean "expectedDocIds"?' in err
