import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.ingest.ids import chunk_id, normalise_text, text_sha256

BASE = {
    "doc_id": "payroll",
    "chunker_version": "md-v1",
    "position": 0,
    "heading_path": ("Payroll policy", "Pay dates"),
    "text": "Staff are paid on the 25th.",
    "title": "Payroll policy",
}


def test_chunk_id_is_a_fixed_value_across_processes():
    # Written once and kept literal: if this changes, every stored chunk id changes with it.
    # (Changed once, deliberately, when the title joined the id: encoding chunk/1 -> chunk/2.)
    assert chunk_id(**BASE) == "c_ec380c6a61d32edb73c3185c"


def test_chunk_id_is_sha256_of_the_length_prefixed_encoding():
    encoding = (
        b"7:chunk/2" + b"7:payroll" + b"5:md-v1" + b"1:0" + b"14:Payroll policy"
        b"2:" + b"14:Payroll policy" + b"9:Pay dates"
        b"27:Staff are paid on the 25th."
    )
    assert chunk_id(**BASE) == "c_" + hashlib.sha256(encoding).hexdigest()[:24]


def test_chunk_id_counts_bytes_not_characters():
    # "工资" is 2 characters but 6 UTF-8 bytes
    encoding = b"7:chunk/2" + b"1:d" + b"1:v" + b"1:0" + "6:薪酬".encode() + b"0:" + "6:工资".encode()
    assert chunk_id("d", "v", 0, (), "工资", title="薪酬") == "c_" + hashlib.sha256(encoding).hexdigest()[:24]


def test_chunk_id_is_the_same_for_the_same_input():
    assert chunk_id(**BASE) == chunk_id(**dict(BASE))


@pytest.mark.parametrize(
    "field, value",
    [
        ("doc_id", "payroll-2"),
        ("chunker_version", "md-v2"),
        ("position", 1),
        ("heading_path", ("Payroll policy",)),
        ("heading_path", ("Payroll policy", "Pay days")),
        ("heading_path", ()),
        ("text", "Staff are paid on the 26th."),
        ("text", "staff are paid on the 25th."),  # case is kept
        ("title", "Pay policy"),  # the title is embedded with the text, so it is part of the id
        ("title", ""),
    ],
)
def test_chunk_id_changes_with_each_field(field, value):
    assert chunk_id(**{**BASE, field: value}) != chunk_id(**BASE)


@pytest.mark.parametrize(
    "text",
    [
        "Staff are paid on the 25th.",
        "  Staff are paid\non the 25th.\n",
        "Staff\tare   paid on\r\n  the 25th.",
        "Staff are paid on the ２５th.",  # full-width digits fold under NFKC
    ],
)
def test_chunk_id_ignores_whitespace_reformatting(text):
    assert chunk_id(**{**BASE, "text": text}) == chunk_id(**BASE)


def test_chunk_id_ignores_whitespace_in_headings_and_title():
    assert chunk_id(**{**BASE, "heading_path": (" Payroll  policy", "Pay dates ")}) == chunk_id(**BASE)
    assert chunk_id(**{**BASE, "title": "  Payroll\n policy "}) == chunk_id(**BASE)


@pytest.mark.parametrize(
    "left, right",
    [
        (("a", "bc"), ("ab", "c")),
        (("a b",), ("a", "b")),
        (("",), ()),
        (("a", ""), ("a",)),
    ],
)
def test_heading_path_encoding_is_unambiguous(left, right):
    assert chunk_id("d", "v", 0, left, "t", title="") != chunk_id("d", "v", 0, right, "t", title="")


def test_field_boundaries_are_unambiguous():
    assert chunk_id("a", "bc", 0, (), "t", title="") != chunk_id("ab", "c", 0, (), "t", title="")
    assert chunk_id("d", "v", 1, (), "2", title="") != chunk_id("d", "v", 12, (), "", title="")
    # the title is a field of its own: moving text between the title and the text changes the id
    assert chunk_id("d", "v", 0, (), "b c", title="a") != chunk_id("d", "v", 0, (), "c", title="a b")
    assert chunk_id("d", "v", 0, ("a",), "t", title="") != chunk_id("d", "v", 0, (), "t", title="a")


@pytest.mark.parametrize("position", [-1, True, 1.0])
def test_chunk_id_rejects_bad_positions(position):
    with pytest.raises(ValueError, match="position"):
        chunk_id("d", "v", position, (), "t", title="")


@given(
    doc_id=st.text(max_size=10),
    headings=st.lists(st.text(max_size=5), max_size=3),
    text=st.text(max_size=30),
    position=st.integers(min_value=0, max_value=10_000),
    title=st.text(max_size=10),
)
def test_chunk_id_shape_and_determinism(doc_id, headings, text, position, title):
    first = chunk_id(doc_id, "md-v1", position, tuple(headings), text, title=title)
    assert first == chunk_id(doc_id, "md-v1", position, list(headings), text, title=title)
    assert len(first) == 26 and first.startswith("c_")
    assert all(c in "0123456789abcdef" for c in first[2:])


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  hello   world \n", "hello world"),
        ("a\n\nb\tc", "a b c"),
        ("Ｈｅｌｌｏ　世界", "Hello 世界"),  # full-width letters and the ideographic space
        ("Keep CASE", "Keep CASE"),
        ("", ""),
        (" \n\t ", ""),
    ],
)
def test_normalise_text(raw, expected):
    assert normalise_text(raw) == expected


@given(st.text())
def test_normalise_text_is_idempotent(text):
    once = normalise_text(text)
    assert normalise_text(once) == once
    assert once == once.strip() and "  " not in once


def test_text_sha256_is_the_full_digest_of_the_normalised_text():
    assert text_sha256("  Staff are\n paid.\t") == hashlib.sha256(b"Staff are paid.").hexdigest()
    assert text_sha256("Ｓｔａｆｆ") == text_sha256("Staff") != text_sha256("staff")  # NFKC folds, case kept
