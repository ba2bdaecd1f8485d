"""literalness(query, passage) = |T(q) ∩ T(p)| / |T(q)| over distinct BM25 analyzer terms, and its bands."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.golden.authoring.literalness import band, literalness
from app.lexical.index import Analyzer

ANALYZER = Analyzer()


def test_english_terms_are_stemmed_distinct_and_stop_words_do_not_count() -> None:
    query = "What is the payday for policies?"
    passage = "Under this policy, the payday is the 10th."
    # query terms: what, payday, polici ("is", "the", "for" are stop words); "payday" and "polici" occur
    assert ANALYZER.tokens(query) == ["what", "payday", "polici"]
    assert literalness(query, passage, ANALYZER.tokens) == 2 / 3


def test_a_repeated_query_term_counts_once() -> None:
    # terms {payday, salari}: payday occurs in the passage, salary does not, however often repeated
    assert literalness("payday payday payday salary", "The payday is fixed.", ANALYZER.tokens) == 1 / 2


def test_chinese_terms_by_jieba_search_mode() -> None:
    query = "工资什么时候发放？"
    passage = "每月10日发放工资。"
    # 什么 is a stop word; 时候 is not in the passage: {工资, 时候, 发放} -> 2 of 3
    assert set(ANALYZER.tokens(query)) == {"工资", "时候", "发放"}
    assert literalness(query, passage, ANALYZER.tokens) == 2 / 3


def test_a_query_with_no_terms_has_no_literalness() -> None:
    assert literalness("什么？ the, of!", "anything", ANALYZER.tokens) is None


def test_full_and_no_overlap() -> None:
    assert literalness("VPN client", "Install the VPN client first.", ANALYZER.tokens) == 2 / 2
    assert literalness("parking fee", "Install the VPN client first.", ANALYZER.tokens) == 0 / 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "low"),
        (1 / 3 - 1e-12, "low"),
        (1 / 3, "mid"),
        (2 / 4, "mid"),
        (2 / 3 - 1e-12, "mid"),
        (2 / 3, "high"),
        (4 / 6, "high"),
        (1.0, "high"),
        (None, None),
    ],
)
def test_bands(value, expected) -> None:
    assert band(value) == expected


def words(text: str) -> list[str]:
    return text.split()


@given(st.text(alphabet="abcde ", max_size=30), st.text(alphabet="abcde ", max_size=30))
def test_literalness_is_a_share_between_0_and_1(query: str, passage: str) -> None:
    value = literalness(query, passage, words)
    if not words(query):
        assert value is None
    else:
        assert value is not None and 0.0 <= value <= 1.0
        assert literalness(query, query + " " + passage, words) == 1.0
