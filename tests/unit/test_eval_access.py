"""The evaluation of access scopes (docs/access.md, "Evaluating scopes"): golden cases run as evaluation
principals, the leak gate and the leak probe, ACL_FILTERED losses and the per-principal segments, on a
fake chain that filters by `may_read` (or, broken, does not)."""

from __future__ import annotations

import json
from math import log2
from typing import Any

import pytest

from app.access.scope import ADMIN, Principal, may_read
from app.evaluation.compare.gate import check_gate
from app.evaluation.golden.cases import GoldenCase, GoldenSet, GoldenSetError, parse_golden_set
from app.evaluation.golden.principals import case_principals
from app.evaluation.report.model import Report
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import ACL_FILTERED, NOT_RETRIEVED, KnownIds
from app.evaluation.session import run_evaluation
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace
from app.settings import AccessSettings, EvaluateSettings, EvaluateThresholds

# doc A: hr only (two chunks), B: public in acme, C: sales only, D: public in globex
ROWS: list[tuple[str, dict[str, Any]]] = [
    ("c1", {"doc_id": "A", "source": "A.md", "tenant": "acme", "access": ["group:hr"]}),
    ("c2", {"doc_id": "B", "source": "B.md", "tenant": "acme", "access": ["public"]}),
    ("c3", {"doc_id": "C", "source": "C.md", "tenant": "acme", "access": ["group:sales"]}),
    ("c4", {"doc_id": "D", "source": "D.md", "tenant": "globex", "access": ["public"]}),
    ("c5", {"doc_id": "A", "source": "A.md", "tenant": "acme", "access": ["group:hr"]}),
]
STORED = dict(ROWS)
ACCESS = AccessSettings.model_validate(
    {
        "eval_principals": {
            "hr": {"tenant": "acme", "groups": ["hr"]},
            "sales": {"tenant": "acme", "groups": ["sales"]},
            "globex": {"tenant": "globex"},
        }
    }
)
NO_THRESHOLDS = EvaluateThresholds(regression_policy="off", broken_case_policy="off")


class ScopedChain:
    """Ranks A, B, C, D (one chunk each, A's second chunk c5 attached to c1) after dropping what the
    request's principal may not read (`may_read` over the metadata), as the real candidates do; `leaky`:
    ignores the principal, as a broken filter would."""

    stage_names: list[str] = []

    def __init__(self, leaky: bool = False) -> None:
        self.leaky = leaky
        self.requests: list[Any] = []

    def retrieve_many(self, requests, today=None, on_result=None):
        out = []
        for i, request in enumerate(requests):
            self.requests.append(request)
            principal = request.principal or ADMIN
            raw = [Candidate(cid, meta["doc_id"], f"text of {cid}", dict(meta)) for cid, meta in ROWS]
            seen = [c for c in raw if self.leaky or may_read(principal, c.metadata)]
            by_doc: dict[str, Candidate] = {}
            for c in seen:
                if c.doc_id in by_doc:
                    by_doc[c.doc_id] = by_doc[c.doc_id].with_attached((c,))
                else:
                    by_doc[c.doc_id] = c
            final = list(by_doc.values())[: request.top_k]
            trace = RetrievalTrace(ranked_after={"candidates": [c.chunk_id for c in seen]})
            result = RetrievalResult(request.query, final, len(seen), False, trace, 1.0, seen)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def golden(*cases: dict[str, Any]) -> GoldenSet:
    return GoldenSet("t", [GoldenCase.model_validate(c) for c in cases], "golden.json")


def run(
    chain: ScopedChain,
    golden_set: GoldenSet,
    access: AccessSettings = ACCESS,
    k: int = 5,
    leak_probe: bool = True,
) -> tuple[Report, Any]:
    settings = EvaluateSettings(top_k=k, latency_sample=0, leak_probe=leak_probe)
    evaluation = run_evaluation(chain, golden_set, KnownIds.from_metadata(ROWS), settings, access=access)  # type: ignore[arg-type]
    report = measure_report(evaluation, {}, access=access)
    return report, check_gate(report, NO_THRESHOLDS)


def check(gate, name: str):
    (found,) = [c for c in gate.checks if c.name == name]
    return found


CASES = (
    {"id": "hr-a", "query": "q", "principal": "hr", "expectedDocIds": ["A"]},
    {"id": "hr-b", "query": "q", "principal": "hr", "expectedDocIds": ["B"]},
    {"id": "sales-c", "query": "q", "principal": "sales", "expectedDocIds": ["C"]},
    {"id": "plain-d", "query": "q", "expectedDocIds": ["D"]},
)


def test_each_case_runs_as_its_principal_and_a_correct_chain_leaks_nothing() -> None:
    chain = ScopedChain()
    report, gate = run(chain, golden(*CASES))
    # the cases' own runs come first, each as its principal (the unscoped one as none)
    assert [r.principal.name if r.principal else None for r in chain.requests[:4]] == [
        "hr",
        "hr",
        "sales",
        None,
    ]
    assert report.access is not None
    assert report.access.leaks == []
    assert report.access.cases_by_principal == {"(unscoped)": 1, "hr": 2, "sales": 1}
    probe = report.access.probe
    assert probe is not None
    # each case as every other evaluation principal: hr cases 2 others each, sales 2, the unscoped one 3
    assert probe.runs == 2 + 2 + 2 + 3
    assert probe.leaks == [] and probe.errors == []
    assert check(gate, "max_access_leaks").passed
    assert check(gate, "leak_probe").passed
    assert gate.passed
    by_id = {r.case.id: r for r in report.cases}
    assert by_id["hr-a"].case.principal == "hr" and by_id["hr-a"].resolved.run_as == "hr"
    assert by_id["plain-d"].resolved.run_as is None
    assert by_id["hr-a"].scores.access_leaks == []
    json_case = report.to_json()["cases"][0]
    assert (json_case["principal"], json_case["runAs"], json_case["accessLeaks"]) == ("hr", "hr", [])


def test_the_per_principal_segments_hold_each_principals_cases() -> None:
    report, _ = run(ScopedChain(), golden(*CASES))
    segs = {s.name: s for s in report.segments if s.kind == "principal"}
    assert list(segs) == ["(unscoped)", "hr", "sales"]
    # hr reads A (rank 1), B (rank 2): hr-a finds A at 1, hr-b B at 2
    assert segs["hr"].cases == 2
    assert segs["hr"].metrics["ndcg"] == pytest.approx((1 + 1 / log2(3)) / 2)
    # sales reads B, C: C at rank 2
    assert segs["sales"].metrics["ndcg"] == pytest.approx(1 / log2(3))
    # unscoped reads A, B, C, D: D at rank 4
    assert segs["(unscoped)"].metrics["ndcg"] == pytest.approx(1 / log2(5))


def test_without_any_scope_there_is_no_principal_segment_and_no_access_section() -> None:
    report, gate = run(ScopedChain(), golden(CASES[3]), access=AccessSettings(eval_principals={}))
    assert [s for s in report.segments if s.kind == "principal"] == []
    assert report.access is None
    assert {"principal", "runAs", "accessLeaks"}.isdisjoint(report.to_json()["cases"][0])
    assert not [c for c in gate.checks if "leak" in c.name]


def test_a_filter_that_lets_chunks_through_fails_the_leak_gate_naming_case_principal_and_chunk() -> None:
    report, gate = run(ScopedChain(leaky=True), golden(*CASES))
    assert report.access is not None
    leaks = {(x.case, x.principal, x.chunk_id, x.attached) for x in report.access.leaks}
    # hr reads neither C (sales) nor D (globex); sales neither A (c1 and its attached c5) nor D
    assert leaks == {
        ("hr-a", "hr", "c3", False),
        ("hr-a", "hr", "c4", False),
        ("hr-b", "hr", "c3", False),
        ("hr-b", "hr", "c4", False),
        ("sales-c", "sales", "c1", False),
        ("sales-c", "sales", "c5", True),
        ("sales-c", "sales", "c4", False),
    }
    leak_check = check(gate, "max_access_leaks")
    assert not leak_check.passed and leak_check.value == 7.0
    assert "case sales-c as sales: attached chunk c5 (doc A, rank 1)" in leak_check.describe()
    assert not gate.passed
    # the probe finds leaks too, the unscoped case's included (run as hr, sales, globex)
    # per run, hr finds 2 (c3, c4), sales 3 (c1, c5, c4) and globex 4 (c1, c5, c2, c3) it may not read
    probe_check = check(gate, "leak_probe")
    assert not probe_check.passed
    assert probe_check.value == (3 + 4) + (3 + 4) + (2 + 4) + (2 + 3 + 4)
    assert report.access.probe is not None
    found = {(x.case, x.principal, x.chunk_id) for x in report.access.probe.leaks}
    assert ("plain-d", "globex", "c1") in found and all(x.probe for x in report.access.probe.leaks)


def test_an_expected_document_out_of_the_principals_scope_is_lost_as_acl_filtered() -> None:
    report, gate = run(
        ScopedChain(),
        golden(
            {"id": "hr-c", "query": "q", "principal": "hr", "expectedDocIds": ["C", "B"]},
            {"id": "sales-e", "query": "q", "principal": "sales", "expectedDocIds": ["E"]},
        ),
    )
    by_id = {r.case.id: r for r in report.cases}
    lost = {x.id: x.where for x in by_id["hr-c"].analysis.lost}
    assert lost == {"C": ACL_FILTERED}
    assert "principal hr may read none of its chunks" in by_id["hr-c"].analysis.lost[0].reason
    # E is in no index: NOT_IN_INDEX stays first
    assert [x.where for x in by_id["sales-e"].analysis.lost] == ["NOT_IN_INDEX"]
    assert report.access is not None
    assert [(a.case, a.principal, a.ids) for a in report.access.acl_filtered] == [("hr-c", "hr", ["C"])]
    assert report.summary is not None and report.summary.lost_by.get(ACL_FILTERED) == 1
    assert gate.passed or all("leak" not in f.check for f in gate.record().failures)


def test_an_unscoped_case_never_loses_to_acl() -> None:
    report, _ = run(ScopedChain(), golden({"id": "x", "query": "q", "expectedDocIds": ["Z"]}))
    (record,) = report.cases
    assert [x.where for x in record.analysis.lost] == ["NOT_IN_INDEX"]
    assert NOT_RETRIEVED != ACL_FILTERED


# -- which principal a case runs as, and the golden set's errors ------------------------------------------


def test_a_case_naming_an_unknown_principal_makes_the_golden_set_invalid() -> None:
    with pytest.raises(GoldenSetError) as info:
        case_principals(
            golden({"id": "q7", "query": "q", "principal": "hrr", "expectedDocIds": ["A"]}), ACCESS
        )
    message = str(info.value)
    assert "case 'q7'" in message
    assert "'hrr' is not an evaluation principal" in message
    assert "rag.access.eval_principals: globex, hr, sales" in message


def test_with_access_enabled_a_case_without_principal_needs_a_default() -> None:
    enabled = ACCESS.model_copy(update={"enabled": True})
    plain = golden({"id": "q8", "query": "q", "expectedDocIds": ["A"]})
    with pytest.raises(GoldenSetError) as info:
        case_principals(plain, enabled)
    assert (
        "case 'q8' names no principal; with rag.access.enabled every case says whose view it tests "
        "(principal: NAME" in str(info.value)
    )
    assert "or set rag.access.eval_default_principal" in str(info.value)
    with_default = enabled.model_copy(update={"eval_default_principal": "sales"})
    assert case_principals(plain, with_default) == {"q8": Principal("sales", "acme", ("sales",))}
    as_admin = enabled.model_copy(update={"eval_default_principal": "admin"})
    assert case_principals(plain, as_admin) == {"q8": ADMIN}
    # access off: the default is not read, the case runs unscoped
    assert case_principals(plain, with_default.model_copy(update={"enabled": False})) == {"q8": None}


def test_the_default_principal_must_be_defined() -> None:
    with pytest.raises(ValueError, match="eval_default_principal 'nobody' is not one of eval_principals"):
        AccessSettings.model_validate({"eval_principals": {"hr": {}}, "eval_default_principal": "nobody"})


@pytest.mark.parametrize("key", ["tenant", "tenantId", "groups", "subjectId", "department", "user", "access"])
def test_a_case_carrying_an_identity_field_is_refused_pointing_at_the_principal(key: str) -> None:
    text = json.dumps([{"id": "q9", "query": "q", "expectedDocIds": ["A"], key: "x"}])
    with pytest.raises(GoldenSetError) as info:
        parse_golden_set(text, "golden.json")
    message = str(info.value)
    assert f"golden.json: cases[0] (id 'q9'): field \"{key}\" is not allowed" in message
    assert "principal: NAME" in message and "rag.access.eval_principals" in message
    assert "never from the data file" in message


def test_group_stays_the_paraphrase_group_and_principal_is_part_of_the_case_hash() -> None:
    from app.evaluation.run.fingerprint import case_sha256

    plain = GoldenCase.model_validate({"id": "a", "query": "q", "group": "g", "expectedDocIds": ["A"]})
    scoped = GoldenCase.model_validate(
        {"id": "a", "query": "q", "group": "g", "expectedDocIds": ["A"], "principal": "hr"}
    )
    assert scoped.principal == "hr" and scoped.group == "g"
    assert case_sha256(plain) != case_sha256(scoped)


def test_the_markdown_and_html_reports_show_the_principal_the_leaks_and_the_probe() -> None:
    from app.evaluation.render.html import render_html
    from app.evaluation.render.markdown import render_markdown

    report, _ = run(ScopedChain(leaky=True), golden(*CASES))
    markdown = render_markdown(report, case_detail=True)
    assert "## Access scopes" in markdown
    assert "| hr | acme | group:hr, public | 2 |" in markdown
    assert "- Access leaks in the cases' own runs: 7" in markdown
    assert "- Leak probe: 9 runs" in markdown
    assert "- Principal: hr" in markdown
    assert "**Access leaks (3):** case sales-c as sales: chunk c1 (doc A, rank 1)" in markdown
    page = render_html(report)
    assert "<h2>Access scopes</h2>" in page and "principal sales" in page
    assert "access leaks: c1, c5, c4" in page


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            {"principal": "hrr"},
            "case 'q1': field \"principal\": 'hrr' is not an evaluation principal; defined in "
            "rag.access.eval_principals: hr, sales (or 'admin', who reads everything)",
        ),
        ({"tenantId": "acme"}, 'field "tenantId" is not allowed: a golden case carries no identity'),
    ],
)
def test_sieve_eval_exits_2_before_any_model_loads_naming_the_case(
    tmp_path, monkeypatch, capsys, case: dict[str, Any], expected: str
) -> None:
    import os

    from app.cli import main

    config = tmp_path / "application.yml"
    config.write_text(
        "rag:\n  access:\n    eval_principals:\n      hr: {tenant: acme, groups: [hr]}\n"
        "      sales: {tenant: acme, groups: [sales]}\n",
        encoding="utf-8",
    )
    path = tmp_path / "golden.json"
    path.write_text(
        json.dumps([{"id": "q1", "query": "q", "expectedDocIds": ["A"], **case}]), encoding="utf-8"
    )
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_SERVER", raising=False)
    monkeypatch.setenv("SIEVE_CONFIG", str(config))
    monkeypatch.setattr("app.cli.eval.open_sieve", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["eval", "--golden-set", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: invalid golden set {path} (1 error):" in err
    assert expected in err


def test_the_tune_recording_keeps_each_cases_principal_and_acl_filtered_ids() -> None:
    from app.evaluation.tune.replay import record

    chain = ScopedChain()
    chain.stages = []  # type: ignore[attr-defined]
    settings = EvaluateSettings(top_k=5, latency_sample=0)
    evaluation = run_evaluation(
        chain,  # type: ignore[arg-type]
        golden({"id": "hr-c", "query": "q", "principal": "hr", "expectedDocIds": ["C", "B"]}),
        KnownIds.from_metadata(ROWS),
        settings,
        access=ACCESS,
        probe=False,
    )
    assert evaluation.probe is None
    (recorded,) = record(evaluation, chain).cases  # type: ignore[arg-type]
    assert recorded.request.principal == Principal("hr", "acme", ("hr",))
    assert recorded.acl_filtered == ["C"]


# -- the pure checks -----------------------------------------------------------------------------------------


HR = Principal("hr", "acme", ("hr",))


def test_access_leaks_reads_the_stored_scope_of_each_ranked_and_attached_chunk() -> None:
    from app.evaluation.run.access import access_leaks

    known = KnownIds.from_metadata(ROWS)
    # the candidates' own metadata claims everything is public: the stored scope decides, not the candidate
    a = Candidate("c1", "A", "t", {"access": ["public"]}).with_attached(
        (Candidate("c3", "C", "t", {"access": ["public"]}),)
    )
    d = Candidate("c4", "D", "t", {"tenant": "acme", "access": ["public"]})
    leaks = access_leaks("q", HR, [a, d], known.scope_of)
    assert [(x.chunk_id, x.rank, x.attached) for x in leaks] == [("c3", 1, True), ("c4", 2, False)]
    assert access_leaks("q", None, [a, d], known.scope_of) == []
    assert access_leaks("q", ADMIN, [a, d], known.scope_of) == []
    # a chunk the store did not hold when the run began is judged by its own metadata
    new = Candidate("c9", "Z", "t", {"tenant": "acme", "access": ["group:hr"]})
    assert access_leaks("q", HR, [new], known.scope_of) == []


def test_acl_filtered_needs_every_chunk_of_an_id_out_of_scope() -> None:
    from app.evaluation.run.access import acl_filtered

    known = KnownIds.from_metadata([*ROWS, ("c6", {"doc_id": "C", "tenant": "acme", "access": ["public"]})])
    # C now has a public chunk (c6): hr reads part of it, so it is not filtered; D (globex) is
    assert acl_filtered(HR, ["A", "C", "D"], lambda i: known.chunks_of(i, "doc"), known.scopes) == ["D"]
    assert acl_filtered(HR, ["c3", "c6"], lambda i: known.chunks_of(i, "chunk"), known.scopes) == ["c3"]
    assert acl_filtered(HR, ["C.md"], lambda i: known.chunks_of(i, "source"), known.scopes) == []
    assert acl_filtered(None, ["D"], lambda i: known.chunks_of(i, "doc"), known.scopes) == []


def test_with_the_probe_off_a_leaky_filter_still_fails_the_cases_own_check_and_a_note_says_so() -> None:
    report, gate = run(ScopedChain(leaky=True), golden(*CASES), leak_probe=False)
    assert report.access is not None and report.access.probe is None
    assert not [c for c in gate.checks if c.name == "leak_probe"]
    assert not check(gate, "max_access_leaks").passed  # the cases' own runs are checked all the same
    assert (
        "leak probe not run (rag.evaluate.leak_probe is false): no case was re-run as the other evaluation "
        "principals"
    ) in gate.notes
