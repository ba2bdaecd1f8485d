"""app/jsonl.py and its users: one character never breaks a line, and one bad line never hides the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.evaluation.golden.authoring.judgments import JudgmentLog, load_judgments_lenient, make_judgment
from app.evaluation.golden.authoring.pool import QueueEntry, Ranked, read_queue_lenient, write_queue
from app.evaluation.golden.authoring.sample import read_log
from app.jsonl import append_lines, dumps_line, encode_line, parse_jsonl, read_jsonl, split_lines

# characters some reader takes for a line break, NUL, and lone surrogates (from a JSON "\ud800" escape)
HOSTILE = ["\u2028", "\u2029", "\u0085", "\x00", "\r", "\x0b", "\x0c", "\x1c", "\ud800", "\udfff"]


@pytest.mark.parametrize("char", HOSTILE, ids=[f"U+{ord(c):04X}" for c in HOSTILE])
def test_a_written_line_holds_no_line_break_but_its_own_and_reads_back(char: str) -> None:
    value = {"a": f"x{char}y", f"k{char}": [char, {"b": char}]}
    line = encode_line(value)
    text = line.decode("utf-8")
    assert text.endswith("\n") and text.count("\n") == 1
    assert len(text[:-1].splitlines()) == 1  # even str.splitlines sees one line
    assert [json.loads(x) for _, x in split_lines(text)] == [value]


def test_readable_text_stays_readable() -> None:
    assert dumps_line({"q": "工资 café"}) == '{"q": "工资 café"}\n'


def test_lines_are_split_on_newline_only() -> None:
    text = '{"a": "x\u2028y"}\n\n{"b": "\u2029\u0085"}\r\n'
    assert [(n, json.loads(x)) for n, x in split_lines(text)] == [
        (1, {"a": "x\u2028y"}),
        (3, {"b": "\u2029\u0085"}),
    ]


def test_a_bad_line_is_named_and_the_others_load(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"n": 1}\nnot json\n{"n": 3}\n\xff\xfe\n')
    read = read_jsonl(path)
    assert [v for _, v in read.values] == [{"n": 1}, {"n": 3}]
    assert [m.split(": ")[0] for m in read.messages()] == [f"{path}:2", f"{path}:4"]


def test_append_adds_the_missing_newline_of_a_hand_edit_first(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text('{"n": 1}')
    append_lines(path, [{"n": 2}])
    assert [v for _, v in parse_jsonl(path.read_text(), path).values] == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize("char", HOSTILE, ids=[f"U+{ord(c):04X}" for c in HOSTILE])
def test_a_judgment_with_the_character_in_every_field_is_stored_and_read_back(
    tmp_path: Path, char: str
) -> None:
    log = JudgmentLog(tmp_path / "judgments.jsonl")
    judgment = make_judgment(f"c{char}1", f"q{char}", f"d{char}#0", f"d{char}", grade=2, who=f"a{char}nn")
    log.append(judgment)
    log.append(make_judgment("c2", "q", "d#0", "d", grade=1, who="bob"))
    read, problems = log.read()
    assert problems == []
    assert [(j.case_id, j.who) for j in read] == [(judgment.case_id, judgment.who), ("c2", "bob")]


def test_a_hand_broken_judgments_line_is_named_and_the_others_count(tmp_path: Path) -> None:
    path = tmp_path / "judgments.jsonl"
    good = make_judgment("c1", "q", "d#0", "d", grade=2, who="ann")
    # a line another tool wrote with U+2028 raw: still one line here
    raw = json.dumps(good.to_json(), ensure_ascii=False).replace('"ann"', '"a\u2028nn"')
    path.write_text(raw + '\n{"caseId": "c1"}\n' + json.dumps(good.to_json()) + "\n", encoding="utf-8")
    read, problems = load_judgments_lenient(path)
    assert [j.who for j in read] == ["a\u2028nn", "ann"]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: ")


@pytest.mark.parametrize("char", HOSTILE, ids=[f"U+{ord(c):04X}" for c in HOSTILE])
def test_the_queue_keeps_the_character_in_every_field(tmp_path: Path, char: str) -> None:
    path = tmp_path / "queue.jsonl"
    write_queue(
        path, [QueueEntry(f"c{char}", f"q{char}", f"t{char}", (Ranked(f"i{char}", f"d{char}"),))], "test"
    )
    entries, problems = read_queue_lenient(path)
    assert problems == [] and entries[0].case_id == f"c{char}" and entries[0].ids[0].doc_id == f"d{char}"


@pytest.mark.parametrize("char", HOSTILE, ids=[f"U+{ord(c):04X}" for c in HOSTILE])
def test_the_sample_reader_reads_a_log_line_with_the_character_as_one_entry(
    tmp_path: Path, char: str
) -> None:
    path = tmp_path / "queries.jsonl"
    append_lines(path, [{"query": f"pay{char}day", "knowledgeTag": f"hr{char}"}, {"query": "leave"}])
    entries, drops = read_log([path])
    assert [e.query for e in entries] == [f"pay{char}day", "leave"] and not drops.counts


@pytest.mark.parametrize("char", HOSTILE, ids=[f"U+{ord(c):04X}" for c in HOSTILE])
def test_drafts_keep_the_character_and_a_bad_draft_line_hides_no_other(tmp_path: Path, char: str) -> None:
    from app.evaluation.golden.authoring.generate import append_cases
    from app.evaluation.golden.authoring.judgments import read_drafts_lenient

    path = tmp_path / "drafts.jsonl"
    append_cases(
        path, [{"id": f"d{char}1", "query": f"pay{char}day", "knowledgeTag": f"hr{char}", "draft": True}]
    )
    with path.open("a", encoding="utf-8") as f:
        f.write('{"id": "broken"}\n')
    append_cases(path, [{"id": "d2", "query": "leave", "draft": True}])
    cases, problems = read_drafts_lenient(path)
    assert [c.id for c in cases] == [f"d{char}1", "d2"] and cases[0].query == f"pay{char}day"
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: not a case")
