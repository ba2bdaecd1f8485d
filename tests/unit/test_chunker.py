import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ingest.chunker import (
    CHUNK_ID_VERSION,
    DOC_SHA256,
    Section,
    chunk_document,
    embedding_text,
    split_sections,
    split_spans,
)
from app.ingest.ids import chunk_id, normalise_text, text_sha256
from app.ingest.types import Chunk, Document
from app.retrieval.types import META_DOC_SHA256

PAYROLL = """\
# Payroll policy

Pay is monthly.

## Pay dates

Staff are paid on the 25th.

### Weekends

If the 25th is a weekend, pay moves to the Friday before.

## Deductions

Tax is deducted at source.
"""


def md(text: str, doc_id: str = "payroll", title: str = "Payroll policy", **metadata) -> Document:
    return Document(doc_id=doc_id, text=text, title=title, metadata=metadata, origin="kb/payroll.md")


def test_heading_paths_follow_heading_levels():
    chunks = chunk_document(md(PAYROLL), chunk_size=600, overlap=50)
    assert [(c.heading_path, c.text) for c in chunks] == [
        (("Payroll policy",), "Pay is monthly."),
        (("Payroll policy", "Pay dates"), "Staff are paid on the 25th."),
        (
            ("Payroll policy", "Pay dates", "Weekends"),
            "If the 25th is a weekend, pay moves to the Friday before.",
        ),
        (("Payroll policy", "Deductions"), "Tax is deducted at source."),
    ]
    assert [c.position for c in chunks] == [0, 1, 2, 3]


def test_small_sections_are_not_merged_across_headings():
    chunks = chunk_document(md("# A\n\none\n\n# B\n\ntwo\n"), chunk_size=600, overlap=0)
    assert [(c.heading_path, c.text) for c in chunks] == [(("A",), "one"), (("B",), "two")]


def test_text_before_the_first_heading_has_an_empty_path():
    chunks = chunk_document(md("Preamble.\n\n# A\n\nBody.\n"), chunk_size=600, overlap=0)
    assert [(c.heading_path, c.text) for c in chunks] == [((), "Preamble."), (("A",), "Body.")]


def test_headings_without_body_make_no_chunk():
    chunks = chunk_document(md("# A\n## B\n\nBody.\n"), chunk_size=600, overlap=0)
    assert [(c.heading_path, c.text) for c in chunks] == [(("A", "B"), "Body.")]


@pytest.mark.parametrize(
    "line, path",
    [
        ("# Title", ("Title",)),
        ("###### Six", ("Six",)),
        ("## Closed ##", ("Closed",)),
        ("   # Indented three", ("Indented three",)),
        ("## C#", ("C#",)),
        ("#  Spaced   out  ", ("Spaced out",)),
    ],
)
def test_atx_heading_forms(line, path):
    assert split_sections(f"{line}\nbody") == [Section((), ""), Section(path, "body")]


@pytest.mark.parametrize("line", ["#hashtag", "####### seven", "    # four spaces is code", "text # not"])
def test_not_headings(line):
    assert split_sections(f"{line}\nbody") == [Section((), f"{line}\nbody".strip())]


@pytest.mark.parametrize("fence", ["```", "~~~", "````"])
def test_headings_inside_fences_are_ignored(fence):
    text = f"# Setup\n\n{fence}bash\n# install it\npip install sieve\n{fence}\n\n## Run\n\nsieve serve\n"
    chunks = chunk_document(md(text), chunk_size=600, overlap=0)
    assert [(c.heading_path, c.text) for c in chunks] == [
        (("Setup",), f"{fence}bash\n# install it\npip install sieve\n{fence}"),
        (("Setup", "Run"), "sieve serve"),
    ]


def test_plain_text_is_one_section_without_headings():
    doc = Document("notes", "# not a heading here\n\nplain words", "notes", origin="kb/notes.txt")
    [chunk] = chunk_document(doc, chunk_size=600, overlap=0)
    assert chunk.heading_path == ()
    assert chunk.text == "# not a heading here\n\nplain words"


def test_markdown_flag_overrides_the_origin():
    doc = Document("d", "# H\n\nbody", origin="corpus.jsonl")
    assert [c.heading_path for c in chunk_document(doc, 600, 0, markdown=True)] == [("H",)]
    assert [c.heading_path for c in chunk_document(doc, 600, 0)] == [()]


def test_long_section_splits_at_paragraphs_first():
    paragraphs = ["Alpha " * 8, "Beta " * 8, "Gamma " * 8]  # 48, 40, 48 characters
    text = "\n\n".join(p.strip() for p in paragraphs)
    chunks = chunk_document(md(text), chunk_size=100, overlap=0)
    assert [c.text for c in chunks] == [
        paragraphs[0].strip() + "\n\n" + paragraphs[1].strip(),
        paragraphs[2].strip(),
    ]


def test_long_paragraph_splits_at_sentences():
    text = "One two three. Four five six? Seven eight nine! Ten eleven twelve."
    chunks = chunk_document(md(text), chunk_size=32, overlap=0)
    assert [c.text for c in chunks] == [
        "One two three. Four five six?",
        "Seven eight nine!",
        "Ten eleven twelve.",
    ]


def test_chinese_splits_at_chinese_sentence_ends():
    text = "工资每月发放一次。如遇节假日提前发放！有疑问吗？请联系人事部；谢谢合作。"
    chunks = chunk_document(md(text), chunk_size=12, overlap=0)
    assert [c.text for c in chunks] == [
        "工资每月发放一次。",
        "如遇节假日提前发放！",
        "有疑问吗？请联系人事部；",
        "谢谢合作。",
    ]


def test_decimal_points_are_not_sentence_ends():
    text = "Rate is 3.5 percent for all staff in the scheme today"
    chunks = chunk_document(md(text), chunk_size=20, overlap=0)
    assert all(not c.text.endswith("3.") for c in chunks)
    assert "".join(c.text.replace(" ", "") for c in chunks) == text.replace(" ", "")


def test_unbroken_text_is_cut_hard_at_chunk_size():
    chunks = chunk_document(md("x" * 25), chunk_size=10, overlap=0)
    assert [c.text for c in chunks] == ["x" * 10, "x" * 10, "x" * 5]


def test_overlap_carries_the_end_of_the_previous_piece():
    text = "Alpha beta gamma. Delta epsilon zeta. Eta theta iota. Kappa lambda mu."
    chunks = chunk_document(md(text), chunk_size=40, overlap=20)
    texts = [c.text for c in chunks]
    assert texts == [
        "Alpha beta gamma. Delta epsilon zeta.",
        "Delta epsilon zeta. Eta theta iota.",
        "Eta theta iota. Kappa lambda mu.",
    ]
    for previous, current in zip(texts, texts[1:], strict=False):
        assert previous.endswith(current.split(". ")[0] + ".")


def test_overlap_starts_on_a_word_boundary_when_there_is_no_sentence_end():
    text = "aaaa bbbb cccc dddd eeee ffff gggg hhhh"
    chunks = chunk_document(md(text), chunk_size=20, overlap=7)
    assert [c.text for c in chunks] == ["aaaa bbbb cccc dddd", "dddd eeee ffff gggg", "gggg hhhh"]


def test_every_chunk_respects_chunk_size():
    text = PAYROLL + "\n\n".join([f"Sentence number {i} is here. " * 3 for i in range(30)])
    for chunk in chunk_document(md(text), chunk_size=60, overlap=15):
        assert 0 < len(chunk.text) <= 60


def test_min_chunk_chars_drops_tiny_chunks_and_keeps_positions_consecutive():
    chunks = chunk_document(md("# A\n\nok\n\n# B\n\nlong enough\n"), 600, 0, min_chunk_chars=5)
    assert [(c.position, c.text) for c in chunks] == [(0, "long enough")]


def test_chunk_ids_are_derived_from_content():
    chunks = chunk_document(md(PAYROLL), chunk_size=600, overlap=50)
    for chunk in chunks:
        assert chunk.chunk_id == chunk_id(
            "payroll",
            CHUNK_ID_VERSION,
            chunk.position,
            chunk.heading_path,
            chunk.text,
            title="Payroll policy",
        )
    assert chunk_document(md(PAYROLL), 600, 50) == chunks
    assert len({c.chunk_id for c in chunks}) == len(chunks)


def test_a_title_change_changes_every_chunk_id():
    """The title is embedded with every chunk (`embedding_text`), so a new title must mean new vectors."""
    before = chunk_document(md(PAYROLL), 600, 50)
    after = chunk_document(md(PAYROLL, title="Pay policy"), 600, 50)
    assert [c.text for c in after] == [c.text for c in before]
    assert not {c.chunk_id for c in after} & {c.chunk_id for c in before}
    assert [embedding_text(c) for c in after] != [embedding_text(c) for c in before]


def test_chunk_ids_survive_whitespace_reformatting():
    before = chunk_document(md("# A\n\nSome   text\nwrapped.\n"), 600, 0)
    after = chunk_document(md("#   A\n\nSome text wrapped.   \n"), 600, 0)
    assert [c.chunk_id for c in before] == [c.chunk_id for c in after]


def test_chunk_metadata_is_document_metadata_plus_chunk_fields():
    doc = md(
        "# Payroll policy\n\n## Pay dates\n\nOn the 25th.",
        source="payroll.md",
        knowledge="hr",
        draft=False,
        version=3,
        tags=["pay", "hr"],
        effectiveTo=None,
    )
    [chunk] = chunk_document(doc, 600, 0)
    assert chunk.metadata == {
        "source": "payroll.md",
        "knowledge": "hr",
        "draft": False,
        "version": 3,
        "tags": "pay,hr",
        "doc_id": "payroll",
        "title": "Payroll policy",
        "position": 0,
        "heading_path": "Payroll policy > Pay dates",
        "doc_sha256": hashlib.sha256(b"# Payroll policy ## Pay dates On the 25th.").hexdigest(),
        # the span of "On the 25th." in the normalised text "# Payroll policy ## Pay dates On the 25th."
        "char_start": len("# Payroll policy ## Pay dates "),
        "char_end": len("# Payroll policy ## Pay dates ") + len("On the 25th."),
    }


def test_doc_sha256_is_the_same_for_a_copy_under_another_id_and_title():
    page = "# VPN\n\nConnect   with HexaConnect.\n\n## Troubleshooting\n\nRestart it.\n"
    original = chunk_document(md(page, doc_id="it-vpn-setup", title="VPN", source="it-wiki"), 600, 0)
    mirror = chunk_document(md(page.replace("   ", " "), doc_id="mirror", title="VPN (copy)"), 600, 0)
    edited = chunk_document(md(page + "\nCall the helpdesk.\n", doc_id="it-vpn-setup"), 600, 0)
    assert len({c.metadata["doc_sha256"] for c in original}) == 1  # one value per document, on every chunk
    assert {c.metadata["doc_sha256"] for c in mirror} == {original[0].metadata["doc_sha256"]}
    assert {c.metadata["doc_sha256"] for c in edited} != {original[0].metadata["doc_sha256"]}
    assert original[0].metadata["doc_sha256"] == text_sha256(page)


def test_the_chunker_and_the_diversity_stage_agree_on_the_metadata_key():
    assert DOC_SHA256 == META_DOC_SHA256 == "doc_sha256"


@pytest.mark.parametrize(
    "title, path, expected",
    [
        ("Payroll", ("Pay dates", "Weekends"), "Payroll › Pay dates › Weekends\n\nbody"),
        ("Payroll policy", ("Payroll policy", "Pay dates"), "Payroll policy › Pay dates\n\nbody"),
        ("", ("Pay dates",), "Pay dates\n\nbody"),
        ("Payroll", (), "Payroll\n\nbody"),
        ("", (), "body"),
        ("Payroll", ("", "Weekends"), "Payroll › Weekends\n\nbody"),
    ],
)
def test_embedding_text(title, path, expected):
    chunk = Chunk("c_x", "d", "body", 0, path, {"title": "from metadata"})
    assert embedding_text(chunk, title) == expected


def test_embedding_text_defaults_to_the_metadata_title():
    chunk = Chunk("c_x", "d", "body", 0, ("H",), {"title": "Doc"})
    assert embedding_text(chunk) == "Doc › H\n\nbody"


@pytest.mark.parametrize("size, overlap", [(0, 0), (10, 10), (10, -1)])
def test_bad_sizes_are_rejected(size, overlap):
    with pytest.raises(ValueError):
        chunk_document(md("text"), size, overlap)


# --- invariants -------------------------------------------------------------------------------------------

_alphabet = st.sampled_from(list("abc 工资。.!?；，\n") + ["\n\n", "Hello ", "world. "])
_texts = st.lists(_alphabet, max_size=120).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=_texts, size=st.integers(min_value=1, max_value=40), data=st.data())
def test_spans_reconstruct_the_text_within_bounds(text, size, data):
    overlap = data.draw(st.integers(min_value=0, max_value=size - 1))
    spans = split_spans(text, size, overlap)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for start, end in spans:
        assert 0 <= end - start <= size
    for (s0, e0), (s1, e1) in zip(spans, spans[1:], strict=False):
        assert s0 < s1 <= e0 < e1
        assert e0 - s1 <= overlap
    # dropping each span's overlap with its predecessor gives the text back exactly
    rebuilt = text[: spans[0][1]] + "".join(
        text[prev_end:end] for (_, prev_end), (_, end) in zip(spans, spans[1:], strict=False)
    )
    assert rebuilt == text


@settings(max_examples=100, deadline=None)
@given(
    bodies=st.lists(_texts, min_size=1, max_size=4),
    size=st.integers(min_value=5, max_value=60),
    data=st.data(),
)
def test_chunks_lose_no_text(bodies, size, data):
    overlap = data.draw(st.integers(min_value=0, max_value=size - 1))
    headings = [f"Section {i}" for i in range(len(bodies))]
    text = "".join(f"## {heading}\n{body}\n" for heading, body in zip(headings, bodies, strict=True))
    chunks = chunk_document(md(text), size, overlap)

    assert all(0 < len(c.text) <= size for c in chunks)
    assert [c.position for c in chunks] == list(range(len(chunks)))
    for heading, body in zip(headings, bodies, strict=True):
        section = body.strip()
        spans = split_spans(section, size, overlap)
        # each chunk is a span of its own section, and the spans minus their overlaps are the section again
        expected = [section[s:e].strip() for s, e in spans if section[s:e].strip()]
        assert [c.text for c in chunks if c.heading_path == (heading,)] == expected
        without_overlap = section[: spans[0][1]] + "".join(
            section[prev_end:end] for (_, prev_end), (_, end) in zip(spans, spans[1:], strict=False)
        )
        assert normalise_text(without_overlap) == normalise_text(section)
