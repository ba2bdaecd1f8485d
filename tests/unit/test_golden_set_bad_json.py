"""Golden-set files that json.loads cannot take, or that hold strings which are not Unicode: a GoldenSetError
naming the file and line (or case), never a RecursionError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.evaluation.golden.cases import GoldenSetError, load_golden_set

DEEP = 100_000
VALID = {"id": "q1", "query": "How do I reset my password?", "expectedDocIds": ["doc-1"]}


def load_errors(path: Path) -> list[str]:
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    str(info.value).encode("utf-8")  # printable and loggable as it is
    return info.value.errors


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_deep_jsonl_line_is_reported_with_its_line(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"golden{suffix}"
    deep = "[" * DEEP + "]" * DEEP
    path.write_text("\n".join([json.dumps(VALID), deep, json.dumps({**VALID, "id": "q2"})]) + "\n")
    assert load_errors(path) == [f"{path}:2: invalid JSON: nested too deeply to read"]


def test_a_deep_value_inside_a_jsonl_case_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    deep_case = '{"id": "q2", "query": "x", "tags": ' + "[" * DEEP + "]" * DEEP + "}"
    path.write_text(json.dumps(VALID) + "\n" + deep_case + "\n")
    assert load_errors(path) == [f"{path}:2: invalid JSON: nested too deeply to read"]


def test_a_deep_json_document_names_the_line_where_it_gets_deep(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"
    deep = "[" * DEEP + "]" * DEEP
    path.write_text('{\n  "datasetVersion": "v1",\n  "cases": [\n    ' + deep + "\n  ]\n}\n")
    assert load_errors(path) == [f"{path}:4: invalid JSON: nested too deeply to read"]


def test_a_moderately_deep_value_is_an_ordinary_type_error(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"
    depth = 900  # parses, then fails validation; the message shows the value without recursing on it
    path.write_text(
        '[{"id": "q1", "query": "x", "expectedDocIds": ["d"], "note": ' + "[" * depth + "]" * depth + "}]"
    )
    [error] = load_errors(path)
    assert error.startswith(f"{path}: cases[0] (id 'q1'): field \"note\": Input should be a valid string")


def test_an_integer_too_long_to_convert_is_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text('{"id": "q1", "query": "x", "topK": ' + "1" * 5000 + "}\n")
    [error] = load_errors(path)
    assert error.startswith(f"{path}:1: invalid JSON: Exceeds the limit")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ('{"id": "q1", "query": "\\ud800abc", "expectedDocIds": ["d"]}', 'field "query": not valid Unicode'),
        ('{"id": "q1", "query": "x", "expectedDocIds": ["\\udc00"]}', 'field "expectedDocIds[0]": not valid'),
        ('{"id": "q1", "query": "x", "expectedDocIds": ["d"], "\\ud800": 1}', "not valid Unicode"),
    ],
    ids=["query", "list-item", "field-name"],
)
def test_a_lone_surrogate_in_a_case_is_reported_naming_line_and_field(
    tmp_path: Path, case: str, message: str
) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text(json.dumps({**VALID, "id": "q0"}) + "\n" + case + "\n")
    [error] = load_errors(path)
    assert error.startswith(f"{path}:2 (id 'q1'): ")
    assert message in error
    assert "U+D800" in error or "U+DC00" in error


def test_unknown_top_level_key_with_a_surrogate_is_printable(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"
    path.write_text('{"cases": [' + json.dumps(VALID) + '], "\\ud800x": 1}')
    [error] = load_errors(path)
    assert error.startswith(f'{path}: unknown top-level field "\\ud800x"')
