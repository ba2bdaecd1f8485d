import json
from pathlib import Path

import pytest

from app.ingest.loaders import load_paths
from app.ingest.types import Document, LoadError

PAYROLL_MD = """\
---
id: payroll-policy
title: Payroll policy
source: hr-handbook
knowledge: hr
status: active
effectiveFrom: 2024-01-01
effectiveTo: 2025-06-30
tags: [pay, hr]
owner: people-team
version: 3
reviewed: null
---
# Payroll

Staff are paid on the 25th.
"""


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*records: dict | str) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records)


def messages(result) -> list[str]:
    return [str(e) for e in result.errors]


# --- Markdown ---------------------------------------------------------------------------------------------


def test_markdown_with_front_matter(tmp_path):
    write(tmp_path / "kb" / "policies" / "payroll.md", PAYROLL_MD)
    result = load_paths([tmp_path / "kb"])
    assert result.errors == []
    assert result.documents == [
        Document(
            doc_id="payroll-policy",
            text="# Payroll\n\nStaff are paid on the 25th.",
            title="Payroll policy",
            metadata={
                "source": "hr-handbook",
                "knowledge": "hr",
                "status": "active",
                "effectiveFrom": "2024-01-01",
                "effectiveTo": "2025-06-30",
                "tags": "pay,hr",
                "owner": "people-team",
                "version": 3,
            },
            origin=str(tmp_path / "kb" / "policies" / "payroll.md"),
            line=None,
        )
    ]
    assert result.files == [str(tmp_path / "kb" / "policies" / "payroll.md")]


def test_markdown_defaults_come_from_the_path_and_first_heading(tmp_path):
    write(tmp_path / "kb" / "policies" / "leave.md", "Intro.\n\n# Annual leave\n\n## Carry over\n\nText.\n")
    [doc] = load_paths([str(tmp_path / "kb")]).documents
    assert (doc.doc_id, doc.title, doc.metadata) == (
        "policies/leave",
        "Annual leave",
        {"source": "policies/leave.md"},
    )


def test_markdown_title_falls_back_to_the_stem_and_ignores_fenced_headings(tmp_path):
    write(tmp_path / "kb" / "setup.markdown", "```\n# not a title\n```\n\n## Second level only\n")
    [doc] = load_paths([tmp_path / "kb"]).documents
    assert (doc.doc_id, doc.title) == ("setup", "setup")


def test_a_file_named_directly_gets_its_stem_as_id(tmp_path):
    path = write(tmp_path / "kb" / "deep" / "leave.md", "# Leave\n\nText.\n")
    [doc] = load_paths([path]).documents
    assert (doc.doc_id, doc.metadata["source"], doc.origin) == ("leave", "leave.md", str(path))


def test_front_matter_integer_id_becomes_a_string(tmp_path):
    write(tmp_path / "a.md", "---\nid: 42\n---\nText.\n")
    [doc] = load_paths([tmp_path]).documents
    assert doc.doc_id == "42"


def test_empty_front_matter_is_allowed(tmp_path):
    write(tmp_path / "a.md", "---\n---\nText.\n")
    [doc] = load_paths([tmp_path]).documents
    assert (doc.doc_id, doc.text) == ("a", "Text.")


@pytest.mark.parametrize(
    "content, line, fragment",
    [
        ("---\ntitle: ok\nstatus: [unclosed\nx: 1\n---\nText.\n", 4, "front matter is not valid YAML"),
        ("---\ntitle: ok\nbad: : :\n---\nText.\n", 3, "front matter is not valid YAML"),
        ("---\ntitle: never closed\nText.\n", 1, "never closed"),
        ("---\n- a list\n---\nText.\n", 2, "must be a mapping"),
        ("---\ntitle: ok\nowner:\n  name: x\n---\nText.\n", 3, "front matter key 'owner': nested objects"),
        ("---\ntitle: ok\nid: [1, 2]\n---\nText.\n", 3, "front matter key 'id'"),
        ("---\ntitle: only front matter\n---\n\n", None, "no text"),
    ],
)
def test_bad_front_matter_names_file_and_line(tmp_path, content, line, fragment):
    path = write(tmp_path / "bad.md", content)
    result = load_paths([tmp_path])
    assert result.documents == [] and result.files == []
    [error] = result.errors
    assert (error.path, error.line) == (str(path), line)
    assert fragment in error.message
    assert str(error).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_yaml_error_mentions_where_the_construct_started(tmp_path):
    write(tmp_path / "bad.md", "---\ntitle: ok\nstatus: [unclosed\n---\nText.\n")
    [error] = load_paths([tmp_path]).errors
    assert "started at line 3" in error.message


# --- plain text -------------------------------------------------------------------------------------------


def test_text_file(tmp_path):
    write(tmp_path / "kb" / "notes" / "faq.txt", "\nQ: When?\nA: The 25th.\n")
    [doc] = load_paths([tmp_path / "kb"]).documents
    assert doc == Document(
        doc_id="notes/faq",
        text="Q: When?\nA: The 25th.",
        title="faq",
        metadata={"source": "notes/faq.txt"},
        origin=str(tmp_path / "kb" / "notes" / "faq.txt"),
    )


def test_utf8_bom_is_stripped(tmp_path):
    write(tmp_path / "bom.md", "\ufeff---\ntitle: BOM\n---\n正文。\n".encode())
    [doc] = load_paths([tmp_path]).documents
    assert (doc.title, doc.text) == ("BOM", "正文。")


def test_undecodable_utf8_names_the_line(tmp_path):
    path = write(tmp_path / "latin1.txt", "first line\ncaf\xe9\n".encode("latin-1"))
    result = load_paths([tmp_path])
    assert [(e.path, e.line) for e in result.errors] == [(str(path), 2)]
    assert "not valid UTF-8" in result.errors[0].message


# --- JSONL ------------------------------------------------------------------------------------------------


def test_beir_corpus_line(tmp_path):
    # as in BEIR's scifact/corpus.jsonl: `_id`, `title`, `text` and an empty `metadata` object
    line = (
        '{"_id": "4983", "title": "Microstructural development", '
        '"text": "Alterations of the ...", "metadata": {}}'
    )
    path = write(tmp_path / "scifact" / "corpus.jsonl", line + "\n")
    result = load_paths([tmp_path / "scifact"])
    assert result.errors == []
    assert result.documents == [
        Document(
            "4983", "Alterations of the ...", "Microstructural development", {}, origin=str(path), line=1
        )
    ]


def test_jsonl_records_metadata_and_blank_lines(tmp_path):
    path = write(
        tmp_path / "docs.jsonl",
        jsonl(
            {
                "id": 7,
                "text": "工资每月发放。",
                "knowledge": "hr",
                "tags": ["pay", "hr"],
                "score": 0.5,
                "live": True,
            },
            "",
            "   ",
            {"_id": "b", "text": "Second.", "title": "B", "note": None},
        ),
    )
    result = load_paths([path])
    assert result.errors == []
    assert result.documents == [
        Document(
            "7",
            "工资每月发放。",
            "",
            {"knowledge": "hr", "tags": "pay,hr", "score": 0.5, "live": True},
            str(path),
            1,
        ),
        Document("b", "Second.", "B", {}, str(path), 4),
    ]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('{"id": "a", "text": "x"', "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('{"text": "no id"}', "missing 'id' (or '_id')"),
        ('{"id": "", "text": "x"}', "'id' is empty"),
        ('{"id": 1.5, "text": "x"}', "'id' must be a string or an integer"),
        ('{"id": true, "text": "x"}', "'id' must be a string or an integer"),
        ('{"id": "a", "_id": "b", "text": "x"}', "both 'id'"),
        ('{"id": "a"}', "'text' must be a non-empty string (missing)"),
        ('{"id": "a", "text": "   "}', "'text' must be a non-empty string (empty)"),
        ('{"id": "a", "text": 5}', "'text' must be a non-empty string (got a number)"),
        ('{"id": "a", "text": "x", "title": {"en": "t"}}', "'title' must be a string"),
        ('{"id": "a", "text": "x", "owner": {"name": "n"}}', "field 'owner': nested objects"),
        ('{"id": "a", "text": "x", "tags": [["a"]]}', "field 'tags': a list may hold only scalars"),
    ],
)
def test_a_bad_jsonl_line_skips_only_that_document(tmp_path, line, fragment):
    path = write(
        tmp_path / "docs.jsonl", jsonl({"id": "first", "text": "ok"}, line, {"id": "third", "text": "ok"})
    )
    result = load_paths([path])
    assert [(d.doc_id, d.line) for d in result.documents] == [("first", 1), ("third", 3)]
    [error] = result.errors
    assert (error.path, error.line) == (str(path), 2)
    assert fragment in error.message
    assert result.files == [str(path)]


def test_invalid_json_reports_its_line_number(tmp_path):
    records = [{"id": str(i), "text": f"doc {i}"} for i in range(1, 7)]
    path = write(tmp_path / "docs.jsonl", jsonl(*records, "{not json}", {"id": "8", "text": "doc 8"}))
    result = load_paths([path])
    assert [str(e) for e in result.errors] == [
        f"{path}:7: invalid JSON: Expecting property name enclosed in double quotes (column 2)"
    ]
    assert len(result.documents) == 7


def test_undecodable_jsonl_line_skips_only_that_line(tmp_path):
    path = write(tmp_path / "docs.jsonl", b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    result = load_paths([path])
    assert [d.doc_id for d in result.documents] == ["a"]
    assert [(e.line, "not valid UTF-8" in e.message) for e in result.errors] == [(2, True)]


# --- duplicates, walking, explicit files ------------------------------------------------------------------


def test_duplicate_ids_keep_the_first_and_name_both_places(tmp_path):
    first = write(tmp_path / "a.jsonl", jsonl({"id": "x", "text": "one"}, {"id": "y", "text": "two"}))
    second = write(tmp_path / "b.jsonl", jsonl({"id": "z", "text": "three"}, {"id": "x", "text": "four"}))
    md = write(tmp_path / "c.md", "---\nid: y\n---\nfive\n")
    result = load_paths([tmp_path])
    assert [d.text for d in result.documents] == ["one", "two", "three"]
    assert messages(result) == [
        f"{second}:2: duplicate doc id 'x' (first defined at {first}:1)",
        f"{md}: duplicate doc id 'y' (first defined at {first}:2)",
    ]


def test_duplicate_within_one_file(tmp_path):
    path = write(tmp_path / "a.jsonl", jsonl({"id": "x", "text": "one"}, {"id": "x", "text": "two"}))
    assert messages(load_paths([path])) == [f"{path}:2: duplicate doc id 'x' (first defined at {path}:1)"]


def test_the_same_directory_twice_reports_every_document_as_duplicate(tmp_path):
    write(tmp_path / "a.md", "text")
    result = load_paths([tmp_path, tmp_path])
    assert len(result.documents) == 1 and len(result.errors) == 1


def test_good_files_load_when_another_is_bad(tmp_path):
    write(tmp_path / "1-good.md", "# Good\n\ntext")
    bad = write(tmp_path / "2-bad.md", "---\ntitle: [\n---\ntext")
    write(tmp_path / "3-good.txt", "text")
    write(tmp_path / "4-good.jsonl", jsonl({"id": "j", "text": "text"}))
    result = load_paths([tmp_path])
    assert [d.doc_id for d in result.documents] == ["1-good", "3-good", "j"]
    assert [e.path for e in result.errors] == [str(bad)]
    assert result.files == [str(tmp_path / n) for n in ("1-good.md", "3-good.txt", "4-good.jsonl")]


def test_directory_walk_is_recursive_sorted_and_skips_hidden_and_other_files(tmp_path):
    for name in ["b.md", "a/z.txt", "a/b/c.md", "C.MD", ".hidden.md", ".git/x.md", "img.png", "data.json"]:
        write(tmp_path / name, "text")
    result = load_paths([tmp_path])
    assert result.errors == []
    assert [d.doc_id for d in result.documents] == ["C", "a/b/c", "a/z", "b"]


def test_an_unsupported_file_named_directly_is_an_error(tmp_path):
    path = write(tmp_path / "img.png", "x")
    assert load_paths([path]).errors == [
        LoadError(
            str(path), None, "unsupported file type '.png' (expected one of .jsonl, .markdown, .md, .txt)"
        )
    ]


def test_a_missing_path_is_an_error_and_others_still_load(tmp_path):
    write(tmp_path / "a.md", "text")
    result = load_paths([tmp_path / "missing", tmp_path])
    assert messages(result) == [f"{tmp_path / 'missing'}: no such file or directory"]
    assert [d.doc_id for d in result.documents] == ["a"]


def test_no_paths_no_documents():
    result = load_paths([])
    assert (result.documents, result.errors, result.files) == ([], [], [])
