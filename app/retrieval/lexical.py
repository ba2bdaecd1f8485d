"""Lexical retrieval: one analyzer for mixed Chinese/English text, and a BM25 index over the whole collection.

Analyzer (`Analyzer.tokens`), applied the same way to documents and queries:

1. NFKC-normalise (full-width `ＡＢＣ１２` becomes `ABC12`);
2. split into CJK runs and latin/digit runs; everything else (whitespace, punctuation, symbols) is dropped;
3. CJK runs are segmented by jieba in search mode (`lcut_for_search`: the words plus their
   in-dictionary sub-words, so `中华人民共和国` also yields `中华`, `人民`, `共和国`); a small list of
   Chinese stop words is dropped;
4. latin/digit runs are lowercased, split on non-alphanumerics, stripped of the Lucene English stop words
   (the 33-word list Lucene's `EnglishAnalyzer` and bm25s use), and stemmed with the Snowball English stemmer.

Search mode and plain `lcut` measured the same on the xquad-zh benchmark (BM25 alone, nDCG@10 0.9628
vs 0.9631); search mode is kept because a query's word (`人民`) then also matches a document's compound
(`中华人民共和国`) and the other way round, which plain `lcut` cannot do. (English side, BM25 alone on
SciFact test: nDCG@10 0.685, in line with the published 0.679-0.687.)

Limitation: jieba sees CJK runs only, so a user-dictionary entry that mixes scripts (`T恤`) is split anyway.

BM25 (`Bm25Index`) is rank-bm25's `BM25Okapi`, unchanged, so its scores equal rank-bm25's on the same tokens:

    score(q, d) = sum over query tokens t (repeats count) of
                  idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(N - df(t) + 0.5) - ln(df(t) + 0.5)

Negative idf (a term in more than half of the documents) is replaced by `epsilon * mean(idf)`, rank-bm25's
floor, with its default epsilon = 0.25: such a term still counts a little instead of pushing a document down
for containing it. In a tiny collection the mean idf can itself be negative and then so can a score; `top()`
returns only scores > 0, and the BM25 stage gives scores <= 0 no rank.

Knowledge tags: the index keeps each chunk's knowledge tag, and `top(query, n, knowledge_tag=t)` takes its
best n among the chunks tagged t only, so chunks of other tags can never push a tagged query's lexical
candidates out of the cut. The statistics (N, df, avgdl, so idf and every score) stay those of the whole
collection: restricting the candidates changes which chunks compete, never a chunk's score.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (also bm25s's "en" list).
ENGLISH_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)

# Function words and question words that carry no topic; kept modest on purpose.
CHINESE_STOP_WORDS = frozenset(
    "的 了 是 在 和 与 及 或 而 也 就 都 吗 呢 吧 啊 呀 么 着 之 把 被 让 给 这 那 这个 那个 "
    "什么 怎么 怎样 如何 为什么 哪 哪些 哪个 请问 一个 我 你 他 她 它 我们 你们 他们".split()
)

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# A CJK run, or a run of word characters that are not CJK and not "_" (so "foo_bar" -> foo, bar).
_RUNS = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")


class Analyzer:
    """Text to BM25 tokens; jieba's dictionary is loaded once, on first use, into a private tokenizer."""

    def __init__(self, user_dict: str | None = None):
        self.user_dict = user_dict
        self._jieba: Any = None  # jieba.Tokenizer, built on first use
        self._lock = threading.Lock()
        import Stemmer

        self._stemmer = Stemmer.Stemmer("english")

    def _segmenter(self) -> Any:
        if self._jieba is None:
            with self._lock:
                if self._jieba is None:
                    import jieba

                    # jieba prints "Building prefix dict..." at DEBUG/INFO on every initialisation.
                    logging.getLogger("jieba").setLevel(logging.WARNING)
                    tokenizer = jieba.Tokenizer()
                    tokenizer.initialize()
                    if self.user_dict:
                        tokenizer.load_userdict(self.user_dict)
                    self._jieba = tokenizer
        return self._jieba

    def tokens(self, text: str) -> list[str]:
        out: list[str] = []
        latin_at: list[int] = []  # positions in `out` of latin/digit words, stemmed together at the end
        for match in _RUNS.finditer(unicodedata.normalize("NFKC", text)):
            cjk, word = match.groups()
            if word is not None:
                word = word.lower()
                if word not in ENGLISH_STOP_WORDS:
                    latin_at.append(len(out))
                    out.append(word)
                continue
            for piece in self._segmenter().lcut_for_search(cjk):
                piece = piece.strip()
                if piece and piece not in CHINESE_STOP_WORDS:
                    out.append(piece)
        if latin_at:
            # One call into PyStemmer's C loop instead of one per word.
            for i, stem in zip(latin_at, self._stemmer.stemWords([out[i] for i in latin_at]), strict=True):
                out[i] = stem
        return out


class Bm25Index:
    """BM25Okapi over every chunk in the collection, addressed by chunk id, with each chunk's tag."""

    def __init__(
        self,
        ids: list[str],
        tokens: list[list[str]],
        analyzer: Analyzer,
        bm25: Any,
        knowledge_tags: Sequence[str | None] | None = None,
    ):
        self.ids = ids
        self.tokens = tokens
        self.analyzer = analyzer
        self._bm25 = bm25  # rank_bm25.BM25Okapi, or None when nothing can match
        self._position = {chunk_id: i for i, chunk_id in enumerate(ids)}
        self._ids_array = np.array(ids, dtype=object)
        # tag -> positions of the chunks with that tag (ascending); untagged chunks are in none of them
        by_tag: dict[str, list[int]] = {}
        for i, tag in enumerate(knowledge_tags if knowledge_tags is not None else [None] * len(ids)):
            if tag is not None:
                by_tag.setdefault(tag, []).append(i)
        self._by_tag = {tag: np.array(at, dtype=np.int64) for tag, at in by_tag.items()}
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._length_norm = np.zeros(0)
        if bm25 is not None:
            self._index_postings(bm25)

    def _index_postings(self, bm25: Any) -> None:
        """Term -> (positions, term frequencies), so scoring a query (`top` and `scores` both do it through
        `_all_scores`) touches only the chunks that contain one of its terms. BM25Okapi.get_scores walks every
        chunk's dict in Python for every query term: 43 ms a query over 15,500 chunks here, against 0.4 ms
        from the postings. The arithmetic is the same, term by term, so the scores are bit-for-bit its own
        (tests/unit/test_lexical.py)."""
        positions: dict[str, list[int]] = {}
        frequencies: dict[str, list[int]] = {}
        for i, counts in enumerate(bm25.doc_freqs):
            for term, tf in counts.items():
                positions.setdefault(term, []).append(i)
                frequencies.setdefault(term, []).append(tf)
        self._postings = {
            term: (np.array(positions[term], dtype=np.int64), np.array(frequencies[term], dtype=np.int64))
            for term in positions
        }
        doc_len = np.array(bm25.doc_len)
        self._length_norm = bm25.k1 * (1 - bm25.b + bm25.b * doc_len / bm25.avgdl)

    def _all_scores(self, query_tokens: list[str]) -> np.ndarray:
        bm25 = self._bm25
        score = np.zeros(bm25.corpus_size)
        for term in query_tokens:
            at, tf = self._postings[term]
            score[at] += (bm25.idf.get(term) or 0) * (tf * (bm25.k1 + 1) / (tf + self._length_norm[at]))
        return score

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        texts: Sequence[str],
        analyzer: Analyzer,
        k1: float = 1.2,
        b: float = 0.75,
        epsilon: float = 0.25,
        knowledge_tags: Sequence[str | None] | None = None,
    ) -> Bm25Index:
        """`knowledge_tags[i]`: the knowledge tag of `ids[i]` (None = untagged); omitted, none is tagged."""
        if len(ids) != len(texts):
            raise ValueError(f"Bm25Index.build: {len(ids)} ids but {len(texts)} texts")
        if knowledge_tags is not None and len(knowledge_tags) != len(ids):
            raise ValueError(f"Bm25Index.build: {len(ids)} ids but {len(knowledge_tags)} knowledge tags")
        seen: set[str] = set()
        for chunk_id in ids:
            if chunk_id in seen:
                raise ValueError(f"Bm25Index.build: duplicate id {chunk_id!r}")
            seen.add(chunk_id)
        if k1 <= 0 or not 0 <= b <= 1:
            raise ValueError(f"Bm25Index.build: need k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        tokens = [analyzer.tokens(text) for text in texts]
        bm25 = None
        # BM25Okapi divides by the collection size and by the vocabulary size: an empty collection (or one
        # with no tokens at all) simply matches nothing.
        if any(tokens):
            from rank_bm25 import BM25Okapi

            bm25 = BM25Okapi(tokens, k1=k1, b=b, epsilon=epsilon)
        return cls(list(ids), tokens, analyzer, bm25, knowledge_tags)

    def __len__(self) -> int:
        return len(self.ids)

    def _query_tokens(self, query: str) -> list[str]:
        # Tokens outside the vocabulary add exactly 0 in BM25Okapi; dropping them only saves the work.
        if self._bm25 is None:
            return []
        idf = self._bm25.idf
        return [tok for tok in self.analyzer.tokens(query) if tok in idf]

    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]:
        """BM25 of `query` against each of `ids`; an id the index does not hold scores 0.0 (no evidence)."""
        out = dict.fromkeys(ids, 0.0)
        q = self._query_tokens(query)
        known = [chunk_id for chunk_id in out if chunk_id in self._position]
        if not q or not known:
            return out
        values = self._all_scores(q)[[self._position[chunk_id] for chunk_id in known]]
        out.update(zip(known, (float(v) for v in values), strict=True))
        return out

    def top(self, query: str, n: int, knowledge_tag: str | None = None) -> list[tuple[str, float]]:
        """The best `n` chunks: score > 0 only, score descending, ties by id.

        Over the whole collection, or, with `knowledge_tag`, over the chunks with that tag only (taken
        before the cut, so other tags never crowd them out); the scores are the same either way."""
        q = self._query_tokens(query)
        if not q or n <= 0:
            return []
        all_scores = self._all_scores(q)
        if knowledge_tag is None:
            positive = np.flatnonzero(all_scores > 0)
        else:
            allowed = self._by_tag.get(knowledge_tag, np.zeros(0, dtype=np.int64))
            positive = allowed[all_scores[allowed] > 0]
        if len(positive) > n:
            # Keep everything tied with the n-th best, so the id tie-break sees all of them.
            nth = np.partition(all_scores[positive], -n)[-n]
            positive = positive[all_scores[positive] >= nth]
        ranked = sorted(
            ((str(self._ids_array[i]), float(all_scores[i])) for i in positive),
            key=lambda pair: (-pair[1], pair[0]),
        )
        return ranked[:n]
