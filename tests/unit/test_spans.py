"""Character spans of chunks in their document's normalised text (app/ingest/spans.py, the chunker)."""

from __future__ import annotations

import pytest

from app.ingest.chunker import CHAR_END, CHAR_START, chunk_document
from app.ingest.ids import normalise_text
from app.ingest.spans import covered, merge, normalise, normalise_with_offsets, union_length
from app.store.types import Document


def md(text: str, doc_id: str = "doc", origin: str = "doc.md") -> Document:
    return Document(doc_id=doc_id, title="T", text=text, metadata={}, origin=origin)


def spans(chunks) -> list[tuple[int, int]]:
    return [(c.metadata[CHAR_START], c.metadata[CHAR_END]) for c in chunks]


def test_whitespace_runs_collapse_and_each_character_keeps_its_place():
    n = normalise_with_offsets("  a \r\n\t b\u3000ｃ  ")
    assert n.text == "a b c"
    assert n.span_of(2, 3) == (0, 1)  # "a"
    assert n.span_of(8, 9) == (2, 3)  # "b", after "\r\n\t " collapsed to one space
    assert n.span_of(10, 11) == (4, 5)  # full-width "ｃ" -> "c", the ideographic space -> " "


def test_normalised_text_agrees_with_the_id_normalisation():
    text = "# 标题\n\n工资  每月10日\r\n发放。ＡＢＣ１２３ ﬁle e\u0301t\u00e9"
    assert normalise(text) == normalise_text(text)


@pytest.mark.parametrize(
    "text, origin",
    [
        ("# Pay\n\nPaid on the 10th.\r\n\r\n## Holidays\n\n   Earlier when the 10th is a holiday.\n", "a.md"),
        ("工资于每月10日发放。\n\n如遇节假日，提前至最近的工作日发放；不推迟。" * 6, "zh.md"),
        ("  plain   text\n\nwith\tgaps " * 20, "a.txt"),
    ],
)
@pytest.mark.parametrize("size, overlap", [(600, 100), (40, 10), (15, 5)])
def test_a_chunks_span_holds_its_text_normalised(text, origin, size, overlap):
    doc = md(text, origin=origin)
    whole = normalise(text)
    chunks = chunk_document(doc, size, overlap)
    assert chunks
    for chunk in chunks:
        start, end = chunk.metadata[CHAR_START], chunk.metadata[CHAR_END]
        assert whole[start:end] == normalise(chunk.text)


def test_overlapping_chunks_have_overlapping_spans_in_order():
    text = "One sentence here. " * 30
    chunks = chunk_document(md(text, origin="a.txt"), 100, 40)
    got = spans(chunks)
    assert len(got) > 2
    assert all(s1 < s2 < e1 < e2 for (s1, e1), (s2, e2) in zip(got, got[1:], strict=False))
    assert got[0][0] == 0 and got[-1][1] == len(normalise(text))


def test_the_span_of_a_chinese_chunk_after_a_heading():
    text = "# 工资\n\n每月10日发放上月工资。"
    [chunk] = chunk_document(md(text), 600, 0)
    # normalised: "# 工资 每月10日发放上月工资。"; the chunk starts after "# 工资 "
    assert spans([chunk]) == [(len("# 工资 "), len("# 工资 ") + len("每月10日发放上月工资。"))]


def test_covered_counts_each_character_of_the_target_once():
    # target [10, 30); chunks [0, 15) and [12, 20) overlap: the union covers [10, 20) of it
    assert covered([(0, 15), (12, 20)], (10, 30)) == 20 - 10
    assert covered([(0, 15), (25, 40)], (10, 30)) == (15 - 10) + (30 - 25)
    assert covered([], (10, 30)) == 0
    assert covered([(30, 40)], (10, 30)) == 0  # half-open: touching is not covering


def test_merge_and_union_length():
    assert merge([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)]) == [(0, 4), (5, 12)]
    assert union_length([(0, 10), (5, 15), (20, 25)]) == (15 - 0) + (25 - 20)
