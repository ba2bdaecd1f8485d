"""The judgments file and its merge into the golden set (app/evaluation/golden/authoring/judgments.py):
parsing, a rater's latest judgment, conflicts between raters and against a case, promotion of drafts, and the
golden-set file written back in its own layout, all at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.cli import main
from app.evaluation.golden.authoring.judgments import (
    Judgment,
    JudgmentLog,
    JudgmentsError,
    export,
    export_files,
    latest_by_rater,
    load_judgments,
    make_judgment,
    merge_case,
    parse_judgments,
    read_golden_document,
    render_golden_document,
    resolve,
)
from app.evaluation.golden.cases import GoldenSetError, load_golden_set, parse_golden_set

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "golden_set" / "golden-set.json"


def j(
    case: str = "c1",
    chunk: str | None = "d1#0",
    grade: int | None = None,
    label: str | None = None,
    who: str = "ann",
    at: str = "2026-01-01T00:00:00Z",
    doc: str | None = None,
    query: str = "q",
) -> Judgment:
    doc = doc if doc is not None else (chunk.split("#")[0] if chunk else None)
    return make_judgment(case, query, chunk, doc, grade=grade, label=label, who=who, at=at)


def case(**fields: Any) -> dict[str, Any]:
    return {"id": "c1", "query": "q", **fields}


# -- parsing -------------------------------------------------------------------------------------------------


def test_a_line_round_trips_with_every_field() -> None:
    one = j(grade=2)
    line = json.dumps(one.to_json())
    assert json.loads(line) == {
        "caseId": "c1",
        "query": "q",
        "id": "d1#0",
        "docId": "d1",
        "grade": 2,
        "who": "ann",
        "at": "2026-01-01T00:00:00Z",
    }
    assert parse_judgments(line, "j.jsonl")[0] == Judgment("c1", "q", "d1#0", "d1", 2, None, "ann", one.at, 1)


def test_no_answer_has_no_id() -> None:
    line = json.dumps(
        {"caseId": "c1", "query": "q", "id": None, "docId": None, "label": "noAnswer", "who": "a"}
        | {"at": "2026-01-01T00:00:00Z"}
    )
    parsed = parse_judgments(line, "j.jsonl")[0]
    assert (parsed.id, parsed.label, parsed.slot) == (None, "noAnswer", None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grade": 4}, "grade: must be one of 0, 1, 2, 3 (got 4)"),
        ({"grade": "2"}, "grade: must be one of 0, 1, 2, 3 (got '2')"),
        ({"grade": True}, "grade: must be one of 0, 1, 2, 3 (got True)"),
        ({"label": "forbidden"}, 'give exactly one of "grade"'),
        ({"grade": None, "label": "maybe"}, 'label: must be "forbidden" or "noAnswer" (got \'maybe\')'),
        ({"who": " "}, "who: must be a non-blank string"),
        ({"at": "yesterday"}, "at: not an ISO 8601 time (got 'yesterday')"),
        ({"at": "2026-01-01T00:00:00"}, "at: must name its time zone"),
        ({"id": ""}, "id: must be a non-blank string"),
        ({"grader": "x"}, "unknown field 'grader'"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(change: dict[str, Any], message: str) -> None:
    good = j(grade=1).to_json()
    bad = {**good, **change}
    if change.get("grade", 0) is None:
        del bad["grade"]
    text = json.dumps(good) + "\n\n" + json.dumps(bad) + "\n"
    with pytest.raises(JudgmentsError) as caught:
        parse_judgments(text, "golden_set/judgments.jsonl")
    assert caught.value.errors[0].startswith("golden_set/judgments.jsonl:3: ")
    assert message in caught.value.errors[0]


def test_every_bad_line_is_listed_and_json_errors_too() -> None:
    with pytest.raises(JudgmentsError) as caught:
        parse_judgments('{"caseId": 1}\nnot json\n', "j.jsonl")
    assert [e.split(":")[1] for e in caught.value.errors] == ["1", "2"]
    assert "j.jsonl:2: not JSON" in caught.value.errors[1]


def test_a_missing_file_holds_no_judgment(tmp_path: Path) -> None:
    assert load_judgments(tmp_path / "none.jsonl") == []


# -- a rater's latest judgment -------------------------------------------------------------------------------


def test_the_latest_judgment_of_a_rater_wins_per_slot() -> None:
    early = j(grade=1, at="2026-01-01T10:00:00Z")
    late = j(grade=3, at="2026-01-01T11:00:00+01:00")  # 10:00Z: the same moment, a later line
    other_chunk = j(chunk="d2#0", grade=0)
    other_rater = j(grade=2, who="bob")
    no_answer = j(chunk=None, label="noAnswer", at="2026-01-01T09:00:00Z")
    kept = latest_by_rater([early, late, other_chunk, other_rater, no_answer])
    assert kept == [late, other_chunk, other_rater, no_answer]


def test_forbidden_after_a_grade_by_the_same_rater_replaces_it() -> None:
    verdicts, conflicts = resolve([j(grade=2), j(label="forbidden", at="2026-01-02T00:00:00Z")])
    assert conflicts == []
    assert verdicts["c1"].grades == {}
    assert list(verdicts["c1"].forbidden) == ["d1"]


# -- conflicts between raters --------------------------------------------------------------------------------


def test_agreeing_raters_apply_and_differing_ones_conflict() -> None:
    verdicts, conflicts = resolve(
        [j(grade=2), j(grade=2, who="bob"), j(chunk="d2#0", grade=1), j(chunk="d2#0", grade=3, who="bob")]
    )
    assert verdicts["c1"].grades == {"d1#0": 2}
    assert [(c.id, c.kind) for c in conflicts] == [("d2#0", "grades differ")]
    assert (
        conflicts[0].message() == "case 'c1', 'd2#0': grades differ: ann: grade 1 (d2#0); bob: grade 3 (d2#0)"
    )


def test_a_rater_changing_their_mind_ends_the_conflict() -> None:
    verdicts, conflicts = resolve([j(grade=1), j(grade=3, who="bob"), j(grade=3, at="2026-01-03T00:00:00Z")])
    assert conflicts == [] and verdicts["c1"].grades == {"d1#0": 3}


def test_forbidden_against_relevant_is_checked_per_document() -> None:
    verdicts, conflicts = resolve([j(chunk="d1#0", label="forbidden"), j(chunk="d1#1", grade=2, who="bob")])
    assert [(c.id, c.kind) for c in conflicts] == [("d1", "forbidden vs relevant")]
    assert verdicts["c1"].grades == {} and verdicts["c1"].forbidden == {}


def test_forbidden_beside_grade_zero_is_no_conflict() -> None:
    verdicts, conflicts = resolve([j(label="forbidden"), j(grade=0, who="bob")])
    assert conflicts == []
    assert verdicts["c1"].grades == {"d1#0": 0} and list(verdicts["c1"].forbidden) == ["d1"]


def test_no_answer_against_a_relevant_grade_conflicts_and_grade_zero_does_not() -> None:
    verdicts, conflicts = resolve(
        [j(chunk=None, label="noAnswer"), j(grade=1, who="bob"), j(chunk="d2#0", grade=0)]
    )
    assert [(c.id, c.kind) for c in conflicts] == [(None, "noAnswer vs relevant")]
    assert verdicts["c1"].no_answer == [] and verdicts["c1"].grades == {"d2#0": 0}


# -- merging into a case -------------------------------------------------------------------------------------


def merged(raw: dict[str, Any], *judgments: Judgment) -> Any:
    verdicts, conflicts = resolve(judgments)
    assert conflicts == []
    return merge_case(raw, verdicts[raw["id"]], {"d1#0": "d1"})  # d1#0 judged in an earlier export


def test_grades_forbidden_and_field_order() -> None:
    raw = case(expectedDocIds=["d9"], judgments={"d1#0": 1}, forbiddenDocIds=["old"], note="n")
    out = merged(raw, j(grade=3), j(chunk="d2#0", grade=0), j(chunk="d3#4", label="forbidden"))
    assert out.case == {
        "id": "c1",
        "query": "q",
        "expectedDocIds": ["d9"],
        "judgments": {"d1#0": 3, "d2#0": 0},
        "forbiddenDocIds": ["old", "d3"],
        "note": "n",
    }
    assert (out.applied, out.promoted, out.conflicts) == (3, False, [])


def test_a_grade_that_carries_its_chunks_quote_is_exported_as_a_judged_quote() -> None:
    raw = case(
        expectedDocIds=["d9"], judgedQuotes=[{"docId": "d1", "quote": "Paid on the 10th.", "grade": 1}]
    )
    quoted = make_judgment("c1", "q", "d1#0", "d1", grade=3, who="ann", quote="Paid on the 10th.")
    out = merged(raw, quoted, j(chunk="d2#0", grade=0))
    # the same passage's grade is replaced; a judgment without a quote stays a chunk-id judgment
    assert out.case["judgedQuotes"] == [{"docId": "d1", "quote": "Paid on the 10th.", "grade": 3}]
    assert out.case["judgments"] == {"d2#0": 0}
    assert json.loads(json.dumps(quoted.to_json()))["quote"] == "Paid on the 10th."


def test_a_draft_is_promoted_by_a_relevant_grade_only() -> None:
    draft = case(draft=True, origin="log")
    assert merged(draft, j(grade=0)).promoted is False
    out = merged(draft, j(grade=0), j(chunk="d2#0", grade=2))
    assert out.promoted is True and out.case == {
        "id": "c1",
        "query": "q",
        "origin": "log",
        "judgments": {"d1#0": 0, "d2#0": 2},
    }


def test_no_answer_promotes_a_draft_to_an_expect_no_answer_case() -> None:
    out = merged(case(draft=True), j(chunk=None, label="noAnswer"), j(grade=0))
    assert out.promoted and out.case == {
        "id": "c1",
        "query": "q",
        "judgments": {"d1#0": 0},
        "expectNoAnswer": True,
    }


@pytest.mark.parametrize(
    ("raw", "judgment", "detail"),
    [
        (case(expectedDocIds=["d1"]), j(chunk="d1#2", label="forbidden"), "forbidden, but the case expects"),
        (case(judgments={"d1#0": 2}), j(chunk="d1#2", label="forbidden"), "forbidden, but the case expects"),
        (
            case(expectedDocIds=["d5"], evidenceChunkIds=["d1#0"]),
            j(grade=0),
            "names this chunk as its evidence",
        ),
        (case(expectNoAnswer=True), j(grade=2), "the case expects no answer"),
        (
            case(expectedDocIds=["d5"], forbiddenDocIds=["d1"]),
            j(grade=2),
            "the case forbids its document 'd1'",
        ),
        (case(expectedDocIds=["d5"]), j(chunk=None, label="noAnswer"), "the case names expected results"),
    ],
)
def test_a_judgment_against_the_case_is_a_conflict_and_not_applied(
    raw: dict[str, Any], judgment: Judgment, detail: str
) -> None:
    out = merged(raw, judgment)
    assert out.case == raw and out.applied == 0
    assert [(c.kind, detail in c.detail) for c in out.conflicts] == [("against the golden set", True)]


# -- the export ----------------------------------------------------------------------------------------------


def test_export_skips_unknown_and_requeried_cases_and_appends_promoted_drafts() -> None:
    golden = [case(expectedDocIds=["d9"]), {"id": "c2", "query": "now different"}]
    golden[1]["expectedDocIds"] = ["d8"]
    drafts = [{"id": "c3", "query": "q3", "draft": True}, {"id": "c4", "query": "q4", "draft": True}]
    judgments = [
        j(grade=1),
        j(case="c2", grade=2, query="was"),
        j(case="c3", grade=2, query="q3"),
        j(case="c4", grade=0, query="q4"),
        j(case="nope", grade=2),
    ]
    result = export(golden, drafts, judgments)
    assert [c["id"] for c in result.cases] == ["c1", "c2", "c3"]
    assert result.cases[2] == {"id": "c3", "query": "q3", "judgments": {"d1#0": 2}}
    assert (result.applied, result.promoted) == (1 + 1, ["c3"])
    assert result.warnings == [
        "case 'c2': its query changed since it was judged ('was' -> 'now different'): its judgments are "
        "skipped (judge it again)",
        "case 'nope' is neither in the golden set nor in the drafts: skipped",
    ]


def test_a_draft_already_promoted_merges_into_its_golden_case() -> None:
    golden = [case(judgments={"d1#0": 2})]
    result = export(
        golden, [case(draft=True)], [j(grade=2), j(chunk="d2#0", grade=0, at="2026-02-01T00:00:00Z")]
    )
    assert result.cases == [case(judgments={"d1#0": 2, "d2#0": 0})] and result.promoted == []


judgment_lists = st.lists(
    st.builds(
        j,
        case=st.sampled_from(["c1", "c2"]),
        chunk=st.sampled_from(["d1#0", "d1#1", "d2#0"]),
        grade=st.sampled_from([0, 1, 2, 3]),
        who=st.sampled_from(["ann", "bob"]),
        at=st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
    )
    | st.builds(
        j,
        case=st.sampled_from(["c1", "c2"]),
        chunk=st.sampled_from(["d1#0", "d2#0"]),
        label=st.just("forbidden"),
        who=st.sampled_from(["ann", "bob"]),
    )
    | st.builds(j, case=st.sampled_from(["c1", "c2"]), chunk=st.none(), label=st.just("noAnswer")),
    max_size=12,
)


@given(judgment_lists)
def test_export_is_idempotent_and_applies_only_agreed_grades(judgments: list[Judgment]) -> None:
    golden = [{"id": "c1", "query": "q", "draft": True}, {"id": "c2", "query": "q", "expectedDocIds": ["d9"]}]
    once = export(golden, [], judgments)
    twice = export(once.cases, [], judgments)
    assert twice.cases == once.cases
    latest = latest_by_rater(judgments)
    for merged_case in once.cases:
        for chunk, grade in (merged_case.get("judgments") or {}).items():
            said = {
                x.grade
                for x in latest
                if x.case_id == merged_case["id"] and x.id == chunk and x.grade is not None
            }
            assert said == {grade}  # every applied grade is the one all its raters gave
    parse_golden_set("".join(json.dumps(c) + "\n" for c in once.cases), "merged.jsonl")  # valid


# -- the file, its layout kept -------------------------------------------------------------------------------


def test_the_sample_golden_set_is_written_back_byte_for_byte() -> None:
    text = SAMPLE.read_text(encoding="utf-8")
    document = read_golden_document(text, SAMPLE)
    assert document.kind == "object" and document.indent == 2
    assert document.top == {"datasetVersion": json.loads(text)["datasetVersion"]}
    assert render_golden_document(document, document.cases) == text


ONE = {"id": "a", "query": "q", "expectedDocIds": ["d"]}


@pytest.mark.parametrize(
    ("name", "text", "kind", "indent"),
    [
        ("g.json", '[{"id": "a", "query": "q", "expectedDocIds": ["d"]}]\n', "array", None),
        ("g.json", json.dumps([ONE], indent=4) + "\n", "array", 4),
        ("g.jsonl", '{"id": "a", "query": "查询", "expectedDocIds": ["d"]}\n', "jsonl", 2),
        ("g.txt", json.dumps(ONE) + "\n" + json.dumps({**ONE, "id": "b"}) + "\n", "jsonl", 2),
    ],
)
def test_each_layout_round_trips(name: str, text: str, kind: str, indent: int | None) -> None:
    document = read_golden_document(text, name)
    assert (document.kind, document.indent) == (kind, indent)
    assert render_golden_document(document, document.cases) == text


def write_set(path: Path, cases: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"datasetVersion": "v7", "cases": cases}, ensure_ascii=False, indent=2) + "\n")


def write_judgments(path: Path, *judgments: Judgment) -> None:
    path.write_text("".join(json.dumps(x.to_json()) + "\n" for x in judgments))


def test_export_files_rewrites_in_place_and_moves_the_version_on(tmp_path: Path) -> None:
    golden, judgments = tmp_path / "golden.json", tmp_path / "judgments.jsonl"
    write_set(golden, [case(expectedDocIds=["d9"])])
    write_judgments(judgments, j(grade=2))
    outcome = export_files(golden, tmp_path / "no-drafts.jsonl", judgments)
    assert outcome.written
    loaded = load_golden_set(golden)
    assert loaded.dataset_version == "v7.1" and loaded.cases[0].judgments == {"d1#0": 2}
    assert outcome.file_line() == f"wrote {golden} (1 case; 1 changed; datasetVersion v7 -> v7.1)"
    before = golden.read_bytes()
    again = export_files(golden, tmp_path / "no-drafts.jsonl", judgments)
    assert not again.written  # nothing new: the file and its version are left alone
    assert golden.read_bytes() == before
    assert again.file_line() == f"unchanged: {golden} (1 case; datasetVersion v7.1)"


def test_a_dated_version_moves_to_today_and_counts_within_a_day(tmp_path: Path) -> None:
    golden, judgments, drafts = tmp_path / "golden.json", tmp_path / "j.jsonl", tmp_path / "drafts.jsonl"
    cases = [case(expectedDocIds=["d9"]), case(id="c2", query="q2", expectedDocIds=["d8"])]
    golden.write_text(json.dumps({"datasetVersion": "2026-12-03.1", "cases": cases}, indent=2) + "\n")
    drafts.write_text(json.dumps({"id": "new", "query": "nq", "draft": True}) + "\n")
    write_judgments(judgments, j(case="new", query="nq", grade=3))
    today = date(2026, 12, 4)
    outcome = export_files(golden, drafts, judgments, today=today)
    assert load_golden_set(golden).dataset_version == "2026-12-04.1"
    assert outcome.file_line() == (
        f"wrote {golden} (2 -> 3 cases; 1 added; datasetVersion 2026-12-03.1 -> 2026-12-04.1)"
    )
    write_judgments(judgments, j(case="new", query="nq", grade=3), j(case="c2", query="q2", grade=0))
    export_files(golden, drafts, judgments, today=today)
    assert load_golden_set(golden).dataset_version == "2026-12-04.2"  # the same day: the counter
    export_files(golden, drafts, judgments, today=date(2026, 12, 5))
    assert load_golden_set(golden).dataset_version == "2026-12-04.2"  # nothing new: no new version


def test_a_set_without_a_version_keeps_none(tmp_path: Path) -> None:
    judgments = tmp_path / "j.jsonl"
    write_judgments(judgments, j(grade=2))
    array, null = tmp_path / "array.json", tmp_path / "null.json"
    array.write_text(json.dumps([case(expectedDocIds=["d9"])], indent=2) + "\n")
    null.write_text(json.dumps({"datasetVersion": None, "cases": [case(expectedDocIds=["d9"])]}) + "\n")
    for golden in (array, null):
        outcome = export_files(golden, tmp_path / "none.jsonl", judgments)
        assert load_golden_set(golden).dataset_version is None
        assert outcome.file_line() == f"wrote {golden} (1 case; 1 changed)"


def test_export_to_out_leaves_the_golden_set_alone(tmp_path: Path) -> None:
    golden, judgments, out = tmp_path / "golden.json", tmp_path / "j.jsonl", tmp_path / "sub" / "out.json"
    write_set(golden, [case(expectedDocIds=["d9"])])
    before = golden.read_text()
    write_judgments(judgments, j(grade=2))
    outcome = export_files(golden, tmp_path / "none.jsonl", judgments, out)
    assert golden.read_text() == before
    assert load_golden_set(out).cases[0].judgments == {"d1#0": 2}
    assert load_golden_set(out).dataset_version == "v7.1"
    assert outcome.file_line() == f"wrote {out} (1 case; from {golden}; 1 changed; datasetVersion v7 -> v7.1)"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    golden, judgments = tmp_path / "golden.json", tmp_path / "j.jsonl"
    write_set(golden, [case(expectedDocIds=["d9"])])
    before = golden.read_text()
    write_judgments(judgments, j(grade=2))

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        export_files(golden, tmp_path / "none.jsonl", judgments)
    assert golden.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.json", "j.jsonl"]  # no temporary left


def test_an_invalid_golden_set_is_refused(tmp_path: Path) -> None:
    golden = tmp_path / "golden.json"
    golden.write_text('{"cases": [{"id": "a", "query": "q"}]}')
    with pytest.raises(GoldenSetError, match="no expectation"):
        export_files(golden, tmp_path / "none.jsonl", tmp_path / "none.jsonl")


# -- the command ---------------------------------------------------------------------------------------------


def test_the_command_lists_conflicts_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, judgments, drafts = tmp_path / "golden.json", tmp_path / "j.jsonl", tmp_path / "drafts.jsonl"
    write_set(golden, [case(expectedDocIds=["d9"])])
    drafts.write_text(json.dumps({"id": "new", "query": "nq", "draft": True}) + "\n")
    write_judgments(
        judgments,
        j(grade=2),
        j(chunk="d2#0", grade=1),
        j(chunk="d2#0", grade=0, who="bob"),
        j(case="new", query="nq", grade=3),
    )
    args = ["golden", "export", "--golden-set", str(golden), "--judgments", str(judgments)]
    assert main([*args, "--drafts", str(drafts)]) == 1
    out, err = capsys.readouterr()
    assert out == (
        f"merged {judgments}: 2 judgment(s) applied, 1 draft(s) promoted: new, 1 conflict(s)\n"
        f"wrote {golden} (1 -> 2 cases; 1 added, 1 changed; datasetVersion v7 -> v7.1)\n"
    )
    assert (
        err == "conflict (not applied): case 'c1', 'd2#0': grades differ: "
        "ann: grade 1 (d2#0); bob: grade 0 (d2#0)\n"
    )
    assert [c.id for c in load_golden_set(golden).cases] == ["c1", "new"]
    assert main([*args, "--drafts", str(drafts)]) == 1  # again: nothing new, the conflict still open
    out, _ = capsys.readouterr()
    assert out.splitlines()[-1] == f"unchanged: {golden} (2 cases; datasetVersion v7.1)"


def test_the_command_names_a_bad_judgments_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, judgments = tmp_path / "golden.json", tmp_path / "j.jsonl"
    write_set(golden, [case(expectedDocIds=["d9"])])
    judgments.write_text("{}\n")
    assert (
        main(
            [
                "golden",
                "export",
                "--golden-set",
                str(golden),
                "--judgments",
                str(judgments),
                "--drafts",
                str(tmp_path / "x.jsonl"),
            ]
        )
        == 2
    )
    assert f"{judgments}:1: caseId: must be a non-blank string" in capsys.readouterr().err


# -- appending -----------------------------------------------------------------------------------------------


def test_appends_from_threads_never_interleave(tmp_path: Path) -> None:
    log = JudgmentLog(tmp_path / "deep" / "j.jsonl")
    long_query = "问" * 5000  # a line longer than a pipe buffer

    def rater(n: int) -> None:
        for i in range(25):
            log.append(j(chunk=f"d{n}#{i}", grade=i % 4, who=f"r{n}", query=long_query))

    threads = [threading.Thread(target=rater, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read, problems = log.read()
    assert problems == []
    assert len(read) == 4 * 25
    assert {(x.who, x.id) for x in read} == {(f"r{n}", f"d{n}#{i}") for n in range(4) for i in range(25)}


def _append_many(path: str, n: int) -> None:
    log = JudgmentLog(path)
    for i in range(20):
        log.append(j(chunk=f"p{n}#{i}", grade=1, who=f"p{n}", query="x" * 3000))


def test_appends_from_processes_never_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "j.jsonl")
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_append_many, args=(path, n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(load_judgments(path)) == 3 * 20


def test_a_hand_edited_last_line_gets_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps(j(grade=1).to_json()))  # no trailing newline
    JudgmentLog(path).append(j(grade=2, who="bob"))
    assert [x.grade for x in load_judgments(path)] == [1, 2]
