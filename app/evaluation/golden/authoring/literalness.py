"""Literalness: how much of a question is copied from the passage it was made from.

    literalness(q, p) = |T(q) ∩ T(p)| / |T(q)|

T(x) is the set of distinct terms of x by the BM25 index's analyzer (`app.lexical.index.Analyzer`):
NFKC-normalised, CJK runs segmented by jieba in search mode, latin/digit words lowercased and
Snowball-stemmed, punctuation, whitespace and the analyzer's Chinese and English stop words dropped.
So a term counts once however often it occurs, "policies" in the query matches "policy" in the passage (both
stem to "polici"), and a question word such as 什么 or "the" never counts on either side.

The passage is the text the BM25 index holds for the chunk (its title and heading path, then its text:
`app.ingest.chunker.embedding_text`), so a question that repeats a heading is literal.

Range 0..1: 1 = every term of the question occurs in the passage, 0 = none does. A question with no
terms at all (only stop words or punctuation) has no literalness: None.

Bands (`band`): low < 1/3 <= mid < 2/3 <= high.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Tokenizer = Callable[[str], Iterable[str]]

LOW_BELOW = 1 / 3
HIGH_FROM = 2 / 3


def literalness(query: str, passage: str, tokens: Tokenizer) -> float | None:
    """|T(query) ∩ T(passage)| / |T(query)| over distinct terms by `tokens` (the BM25 analyzer's
    `tokens` in use); None when the query has no term."""
    query_terms = set(tokens(query))
    if not query_terms:
        return None
    return len(query_terms & set(tokens(passage))) / len(query_terms)


def band(value: float | None) -> str | None:
    """ "low" when value < 1/3, "mid" when 1/3 <= value < 2/3, "high" when value >= 2/3; None for None."""
    if value is None:
        return None
    if value < LOW_BELOW:
        return "low"
    if value < HIGH_FROM:
        return "mid"
    return "high"
