import json
from datetime import date

import pytest

from app.evaluation.golden.cases import (
    MAX_REPORTED_ERRORS,
    GoldenCase,
    GoldenSetError,
    case_expected_relevance,
    case_relevance_key,
    load_golden_set,
)

VALID = {"id": "q1", "query": "How do I reset my password?", "expectedDocIds": ["doc-1"]}


def write_json(tmp_path, cases, name="golden.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cases, indent=2), encoding="utf-8")
    return path


def write_jsonl(tmp_path, cases, name="golden.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    return path


def load_error(path):
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    return str(info.value)


def test_valid_example_with_every_field(tmp_path):
    case = {
        "id": "pw-reset",
        "query": "How do I reset my password?",
        "knowledgeTag": "account",
        "expectedDocIds": ["doc-1"],
        "expectedSources": ["docs/account.md"],
        "expectedChunkIds": ["doc-1#3"],
        "topK": 5,
        "note": "the FAQ answer",
        "relevance": {"doc-1": 3, "doc-2": 1, "doc-9": 0},
        "forbiddenDocIds": ["doc-spam"],
        "expectNoAnswer": False,
        "tags": ["smoke"],
    }
    golden = load_golden_set(write_json(tmp_path, {"datasetVersion": "2024-06", "cases": [case]}))
    assert golden.dataset_version == "2024-06"
    assert golden.path.endswith("golden.json")
    [loaded] = golden.cases
    assert loaded.id == "pw-reset"
    assert loaded.knowledge_tag == "account"
    assert loaded.top_k == 5
    assert loaded.forbidden_doc_ids == ["doc-spam"]
    assert loaded.relevance_map() == {"doc-1": 3.0, "doc-2": 1.0, "doc-9": 0.0}
    assert case_relevance_key(loaded) == "doc"


def test_defaults():
    case = GoldenCase.model_validate(VALID)
    assert case.top_k is None
    assert case.knowledge_tag is None
    assert case.expect_no_answer is False
    assert case.tags == [] and case.note == "" and case.relevance == {}


def test_json_array(tmp_path):
    golden = load_golden_set(write_json(tmp_path, [VALID, {**VALID, "id": "q2"}]))
    assert [case.id for case in golden.cases] == ["q1", "q2"]
    assert golden.dataset_version is None


def test_json_object_with_version(tmp_path):
    golden = load_golden_set(write_json(tmp_path, {"datasetVersion": "v3", "cases": [VALID]}))
    assert golden.dataset_version == "v3"
    assert [case.id for case in golden.cases] == ["q1"]


def test_jsonl_by_suffix(tmp_path):
    golden = load_golden_set(write_jsonl(tmp_path, [VALID, {**VALID, "id": "q2"}]))
    assert [case.id for case in golden.cases] == ["q1", "q2"]


@pytest.mark.parametrize("name", ["golden.txt", "golden.json", "golden"])
def test_jsonl_by_content(tmp_path, name):
    golden = load_golden_set(write_jsonl(tmp_path, [VALID, {**VALID, "id": "q2"}], name=name))
    assert [case.id for case in golden.cases] == ["q1", "q2"]


def test_single_line_jsonl_without_suffix(tmp_path):
    golden = load_golden_set(write_jsonl(tmp_path, [VALID], name="golden.data"))
    assert [case.id for case in golden.cases] == ["q1"]


def test_duplicate_ids_name_both_positions(tmp_path):
    message = load_error(write_json(tmp_path, [VALID, {**VALID, "query": "another"}]))
    assert "golden.json: cases[1] (id 'q1')" in message
    assert "duplicate id 'q1', also at" in message and "golden.json: cases[0]" in message


def test_duplicate_ids_in_jsonl_name_both_lines(tmp_path):
    message = load_error(write_jsonl(tmp_path, [VALID, {**VALID, "id": "q2"}, VALID]))
    assert "golden.jsonl:3 (id 'q1'): field \"id\": duplicate id 'q1', also at " in message
    assert "golden.jsonl:1" in message


@pytest.mark.parametrize("query", ["", "   \t"])
def test_empty_query(tmp_path, query):
    message = load_error(write_jsonl(tmp_path, [{**VALID, "query": query}]))
    assert "golden.jsonl:1 (id 'q1'): field \"query\": must not be empty or blank" in message


def test_missing_query(tmp_path):
    case = {k: v for k, v in VALID.items() if k != "query"}
    message = load_error(write_json(tmp_path, [case]))
    assert "golden.json: cases[0] (id 'q1'): field \"query\": required field is missing" in message


def test_missing_id(tmp_path):
    case = {k: v for k, v in VALID.items() if k != "id"}
    message = load_error(write_json(tmp_path, [case]))
    assert 'golden.json: cases[0]: field "id": required field is missing' in message


def test_no_expectation(tmp_path):
    message = load_error(write_json(tmp_path, [{"id": "q1", "query": "anything"}]))
    assert "golden.json: cases[0] (id 'q1'): no expectation" in message
    assert "expectedDocIds" in message and "expectNoAnswer" in message


def test_relevance_without_a_positive_grade_is_no_expectation(tmp_path):
    message = load_error(write_json(tmp_path, [{"id": "q1", "query": "x", "relevance": {"d": 0}}]))
    assert "cases[0] (id 'q1'): relevance gives no grade > 0" in message


def test_expect_no_answer_with_expectations_is_a_contradiction(tmp_path):
    case = {**VALID, "expectNoAnswer": True, "expectedSources": ["a.md"]}
    message = load_error(write_json(tmp_path, [case]))
    assert "cases[0] (id 'q1'): expectNoAnswer is true but the case also names expected results" in message
    assert "expectedDocIds, expectedSources" in message


def test_forbidden_and_expected_is_a_contradiction(tmp_path):
    message = load_error(write_json(tmp_path, [{**VALID, "forbiddenDocIds": ["doc-1"]}]))
    assert "cases[0] (id 'q1'): forbiddenDocIds lists 'doc-1', which the case also expects" in message


def test_expected_doc_graded_not_relevant_is_a_contradiction(tmp_path):
    message = load_error(write_json(tmp_path, [{**VALID, "relevance": {"doc-1": 0}}]))
    assert "cases[0] (id 'q1'): expectedDocIds lists 'doc-1' but relevance grades them <= 0" in message


@pytest.mark.parametrize(
    ("field", "suggestion"),
    [
        ("expectedDocID", "expectedDocIds"),
        ("expected_doc_ids", "expectedDocIds"),
        ("topk", "topK"),
        ("forbidenDocIds", "forbiddenDocIds"),
        ("knowledge_tag", "knowledgeTag"),
    ],
)
def test_unknown_field_suggests_the_close_name(tmp_path, field, suggestion):
    message = load_error(write_jsonl(tmp_path, [{**VALID, field: 1}]))
    assert f'golden.jsonl:1 (id \'q1\'): unknown field "{field}"; did you mean "{suggestion}"?' in message


def test_unknown_field_far_from_any_lists_the_valid_ones(tmp_path):
    message = load_error(write_json(tmp_path, [{**VALID, "zzz": 1}]))
    assert 'unknown field "zzz"; valid fields: id, query, knowledgeTag' in message


def test_unknown_top_level_field(tmp_path):
    message = load_error(write_json(tmp_path, {"datasetversion": "1", "cases": [VALID]}))
    assert 'golden.json: unknown top-level field "datasetversion"; did you mean "datasetVersion"?' in message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("topK", "5", 'field "topK": Input should be a valid integer (got string "5")'),
        ("topK", 0, 'field "topK": Input should be greater than or equal to 1 (got number 0)'),
        ("topK", 101, 'field "topK": Input should be less than or equal to 100'),
        ("topK", True, 'field "topK": Input should be a valid integer (got boolean true)'),
        (
            "expectedDocIds",
            "doc-1",
            'field "expectedDocIds": Input should be a valid list (got string "doc-1")',
        ),
        (
            "expectedDocIds",
            ["doc-1", 7],
            'field "expectedDocIds[1]": Input should be a valid string (got number 7)',
        ),
        ("relevance", {"doc-1": "high"}, 'field "relevance.doc-1": Input should be a valid number'),
        ("expectNoAnswer", "no", 'field "expectNoAnswer": Input should be a valid boolean'),
        ("knowledgeTag", 3, 'field "knowledgeTag": Input should be a valid string'),
        ("tags", [None], 'field "tags[0]": Input should be a valid string (got null)'),
    ],
)
def test_wrong_types(tmp_path, field, value, expected):
    message = load_error(write_jsonl(tmp_path, [{**VALID, field: value}]))
    assert f"golden.jsonl:1 (id 'q1'): {expected}" in message


def test_case_that_is_not_an_object(tmp_path):
    message = load_error(write_json(tmp_path, [VALID, "q2"]))
    assert "golden.json: cases[1]: expected a case object, got string" in message


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "golden.json"
    path.write_text('[\n  {"id": "q1",\n   "query": }\n]\n', encoding="utf-8")
    assert "golden.json:3:13: invalid JSON: Expecting value" in load_error(path)


def test_invalid_jsonl_line_is_reported_with_the_other_errors(tmp_path):
    path = tmp_path / "golden.jsonl"
    path.write_text(
        json.dumps(VALID) + '\n{"id": "q2", \n' + json.dumps({"id": "q3"}) + "\n", encoding="utf-8"
    )
    message = load_error(path)
    assert "golden.jsonl:2:14: invalid JSON" in message
    assert "golden.jsonl:3 (id 'q3'): field \"query\": required field is missing" in message
    assert message.index("golden.jsonl:2:") < message.index("golden.jsonl:3 ")


@pytest.mark.parametrize("content", ["", "[]", '{"cases": []}', "\n\n"])
def test_empty_set(tmp_path, content):
    path = tmp_path / "golden.json"
    path.write_text(content, encoding="utf-8")
    assert "golden.json: the golden set is empty" in load_error(path)


def test_wrapped_object_without_cases(tmp_path):
    message = load_error(write_json(tmp_path, {"datasetVersion": "1"}))
    assert 'golden.json: field "cases" is missing' in message


def test_all_errors_are_collected(tmp_path):
    cases = [{"id": f"q{i}", "query": ""} for i in range(3)]
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(write_jsonl(tmp_path, cases))
    assert [error.split(" (id")[0] for error in info.value.errors] == [
        f"{tmp_path / 'golden.jsonl'}:{line}" for line in (1, 2, 3)
    ]
    assert "(3 errors)" in str(info.value)


def test_report_is_capped(tmp_path):
    cases = [{"id": f"q{i}", "query": ""} for i in range(MAX_REPORTED_ERRORS + 5)]
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(write_jsonl(tmp_path, cases))
    assert len(info.value.errors) == MAX_REPORTED_ERRORS + 5
    assert str(info.value).count("\n  - ") == MAX_REPORTED_ERRORS
    assert "... and 5 more" in str(info.value)


def test_unreadable_file(tmp_path):
    assert "missing.json: cannot read the golden set" in load_error(tmp_path / "missing.json")


def test_expect_no_answer_case_is_valid():
    case = GoldenCase.model_validate({"id": "n", "query": "weather on Mars?", "expectNoAnswer": True})
    assert case_relevance_key(case) == "doc"
    assert case_expected_relevance(case) == {}


def test_relevance_map_combines_expected_ids_and_grades():
    case = GoldenCase.model_validate({**VALID, "expectedDocIds": ["a", "b"], "relevance": {"b": 3, "c": 2}})
    assert case.relevance_map() == {"a": 1.0, "b": 3.0, "c": 2.0}


@pytest.mark.parametrize(
    ("fields", "key", "expected"),
    [
        (
            {"expectedDocIds": ["d1"], "expectedChunkIds": ["d1#0"], "expectedSources": ["a.md"]},
            "doc",
            {"d1": 1},
        ),
        ({"relevance": {"d1": 2}, "expectedChunkIds": ["d1#0"]}, "doc", {"d1": 2}),
        (
            {"expectedChunkIds": ["d1#0", "d1#1"], "expectedSources": ["a.md"]},
            "chunk",
            {"d1#0": 1, "d1#1": 1},
        ),
        ({"expectedSources": ["a.md"]}, "source", {"a.md": 1}),
    ],
)
def test_match_level(fields, key, expected):
    case = GoldenCase.model_validate({"id": "q", "query": "x", **fields})
    assert case_relevance_key(case) == key
    assert case_expected_relevance(case) == expected


def test_set_risk_owner_and_rationale(tmp_path):
    case = {**VALID, "set": "incremental", "risk": "high", "owner": "payroll-team", "rationale": "pay dates"}
    [loaded] = load_golden_set(write_json(tmp_path, [case])).cases
    assert (loaded.case_set, loaded.risk, loaded.owner, loaded.rationale) == (
        "incremental",
        "high",
        "payroll-team",
        "pay dates",
    )
    assert GoldenCase.model_validate(VALID).case_set == "core"
    message = load_error(write_json(tmp_path, [{**VALID, "risk": "severe", "set": "extra"}]))
    assert "(id 'q1'): field \"risk\": Input should be 'low', 'medium' or 'high'" in message
    assert "(id 'q1'): field \"set\": Input should be 'core' or 'incremental'" in message


def test_retired_cases_carry_a_reason_and_are_not_in_the_set(tmp_path):
    retired = [{"id": "old-1", "reason": "the policy it asked about was withdrawn"}]
    golden = load_golden_set(write_json(tmp_path, {"cases": [VALID], "retired": retired}))
    assert [(r.id, r.reason) for r in golden.retired] == [
        ("old-1", "the policy it asked about was withdrawn")
    ]
    bad = {
        "cases": [VALID],
        "retired": [{"id": "q1", "reason": "x"}, {"id": "z"}, {"id": "z", "reason": " "}],
    }
    message = load_error(write_json(tmp_path, bad))
    assert "field \"retired[0].id\": case 'q1' is retired but still in the set" in message
    assert 'field "retired[1].reason": required field is missing' in message
    assert 'field "retired[2].reason": must not be empty or blank' in message
    assert 'unknown top-level field "retierd"' in load_error(
        write_json(tmp_path, {"cases": [VALID], "retierd": []})
    )


def test_as_of_is_a_date_the_case_is_judged_as_of(tmp_path):
    golden = load_golden_set(write_json(tmp_path, [{**VALID, "asOf": "2025-06-30"}, {**VALID, "id": "q2"}]))
    dated, undated = golden.cases
    assert dated.as_of == date(2025, 6, 30)
    assert undated.as_of is None
    # it round-trips as the same string, and a case without one is written without the field
    assert dated.model_dump(mode="json", by_alias=True, exclude_defaults=True)["asOf"] == "2025-06-30"
    assert "asOf" not in undated.model_dump(mode="json", by_alias=True, exclude_defaults=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025/06/30", 'field "asOf": must be a date written "YYYY-MM-DD", e.g. "2026-12-01" (got string'),
        ("20250630", 'field "asOf": must be a date written "YYYY-MM-DD", e.g. "2026-12-01" (got string'),
        ("2025-06-30T10:00:00", 'field "asOf": must be a date written "YYYY-MM-DD"'),
        (20250630, 'field "asOf": must be a date written "YYYY-MM-DD", e.g. "2026-12-01" (got number'),
        (
            "2025-02-30",
            'field "asOf": not a calendar date: day is out of range for month (got string "2025-02-30")',
        ),
    ],
)
def test_as_of_is_strict_and_the_error_names_the_case_and_the_field(tmp_path, value, expected):
    message = load_error(write_jsonl(tmp_path, [{**VALID, "asOf": value}]))
    assert f"golden.jsonl:1 (id 'q1'): {expected}" in message


def test_a_misspelt_as_of_is_suggested(tmp_path):
    message = load_error(write_jsonl(tmp_path, [{**VALID, "as_of": "2025-06-30"}]))
    assert 'unknown field "as_of"; did you mean "asOf"?' in message
