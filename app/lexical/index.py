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

Knowledge tags and scopes: the index keeps each chunk's label (`app.access.scope.chunk_label`: its knowledge
tag, and its tenant and access list when it has them), and `top(query, n, knowledge_tag=t, principal=p)`
takes its best n among the chunks tagged t that p may read only, so chunks of other tags or out of scope can
never push a query's lexical candidates out of the cut. The statistics (N, df, avgdl, so idf and every
score) stay those of the whole collection: restricting the candidates changes which chunks compete, never a
chunk's score.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import unicodedata
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.access.scope import Principal, label_matches, parse_label
from app.store.types import LabelMasks

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


ANALYZER_VERSION = (
    1  # bump when `Analyzer.tokens` changes: a persisted index made by another version is rebuilt
)


# (chunk id, crc32 of its text, knowledge tag, token count, [(term, frequency), ...] in first-appearance
# order); token count and terms are None for a chunk whose text was unchanged (only its tag was set)
Analysed = tuple[str, int, str | None, int | None, list[tuple[str, int]] | None]


class Bm25Index:
    """BM25Okapi over every chunk in the collection, addressed by chunk id, with each chunk's tag, kept up
    to date in place (`upsert`, `delete`) instead of rebuilt.

    Layout (all append-only between compactions, so a write costs the size of what it writes):
    - slots: chunk `i` of the index lives in slot `i` (its id, length, tag, alive flag, text digest);
      a deleted or replaced chunk leaves a dead slot, dropped by `compact()` (done on its own when dead
      slots pass a quarter of all slots, and before every snapshot);
    - postings: term number -> (slots, term frequencies), in slot order; they may hold dead slots, which
      are masked out of every result;
    - forward lists: slot -> its (term number, frequency) pairs in first-appearance order, so a delete
      knows which document frequencies to lower without re-tokenising anything.

    Scores equal a fresh `BM25Okapi` over the live chunks in slot order, bit for bit: N, avgdl and every
    document frequency are exact integers, each idf is computed on demand from them with the same
    `math.log` expression, and the epsilon floor's mean idf (a float sum whose order matters) is summed in
    BM25Okapi's own order (terms by first appearance in the corpus), only when a query meets a term with a
    negative idf, and cached until the next write."""

    # Scoring postings kept between queries, in postings (16 bytes each: 16M = 256 MB at most): room for
    # what queries at 1M chunks touch; a smaller bound made BM25 slower (docs/benchmarks.md#code-figures).
    POSTINGS_CACHE_LIMIT = 16_000_000
    # Queries whose term numbers are kept: more than an evaluation's batch of queries (32).
    RECENT_QUERIES = 64

    def __init__(self, analyzer: Analyzer, k1: float = 1.2, b: float = 0.75, epsilon: float = 0.25):
        if k1 <= 0 or not 0 <= b <= 1:
            raise ValueError(f"Bm25Index.build: need k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.analyzer = analyzer
        self.k1, self.b, self.epsilon = k1, b, epsilon
        self._lock = threading.RLock()
        self.refresher: Callable[[], None] | None = None  # set by LexicalSync: catches up with the store
        self._clear()

    def refresh(self) -> None:
        """Bring the index up to date with other processes' writes (a no-op for an index nobody syncs)."""
        if self.refresher is not None:
            self.refresher()

    def _clear(self) -> None:
        self._slot_ids: list[str | None] = []
        self._slot_of: dict[str, int] = {}
        self._doc_len = array("I")
        self._tag = array("i")  # tag number, -1 = untagged
        self._alive = bytearray()
        self._digest = array("I")  # crc32 of the indexed text: an unchanged text is not re-indexed
        self._fwd_start = array("Q", [0])
        self._fwd_terms = array("I")
        self._fwd_tf = array("I")
        self._term_no: dict[str, int] = {}
        self._terms: list[str] = []
        self._df = array("I")
        self._post_slots: list[array[int]] = []
        self._post_tf: list[array[int]] = []
        self._tag_no: dict[str, int] = {}
        self._tags: list[str] = []
        self._live = 0
        self._total_len = 0
        self._version = 0  # bumped by every change; keys the caches below
        self._norm: tuple[int, np.ndarray] | None = None
        self._mean_idf: tuple[int, float] | None = None
        self._alive_mask: tuple[int, np.ndarray] | None = None
        self._tag_counts: tuple[int, np.ndarray] | None = None  # live chunks per tag number
        # per (knowledge tag, principal's key): per label number whether it matches, the untagged chunks'
        # answer last (labels are only ever added, so a mask grows, never changes)
        self._label_masks = LabelMasks()
        # (knowledge tag, principal's key) -> (version, per slot whether it matches): `_slot_mask`'s answer
        # until the next change (gathering the label mask over every slot is a pass over the index per query)
        self._slot_masks: dict[tuple[Any, ...], tuple[int, np.ndarray]] = {}
        # term number -> (postings length when converted, slots as int64, each posting's term weight, the
        # version the weights are for): postings only grow between compactions, so the slots are valid
        # while the length is unchanged, the weights while the version is (N, avgdl and the idf change with
        # every write). Least recently used first; at most POSTINGS_CACHE_LIMIT postings in all.
        self._post_np: OrderedDict[int, tuple[int, np.ndarray, np.ndarray, int]] = OrderedDict()
        self._post_np_size = 0
        # (version, query terms, every slot's score) of the last query scored: the chain asks top() for the
        # BM25 candidates and then scores() for the bm25 stage with the same query
        self._last_scores: tuple[int, tuple[int, ...], np.ndarray] | None = None
        # query text -> (version, its term numbers) of the latest queries, see _query_terms
        self._recent_terms: OrderedDict[str, tuple[int, list[int]]] = OrderedDict()

    # -- building and updating ----------------------------------------------------------------------

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
        index = cls(analyzer, k1=k1, b=b, epsilon=epsilon)
        tags = knowledge_tags if knowledge_tags is not None else [None] * len(ids)
        index.upsert(list(zip(ids, texts, tags, strict=True)))
        return index

    def upsert(self, items: Sequence[tuple[str, str, str | None]]) -> list[Analysed]:
        """Add or replace chunks, each `(id, indexed text, knowledge tag)`. A chunk whose text is unchanged
        only gets its tag updated; a changed one is re-indexed (in a new slot, at the end).

        Returns what was done as `Analysed` records (the tokens' counts, not the text), which
        `upsert_analysed` applies again without the analyzer: a journal of them replays in milliseconds."""
        prepared = []
        for chunk_id, text, tag in items:
            digest = zlib.crc32(text.encode("utf-8"))
            prepared.append((chunk_id, digest, tag, text))
        done: list[Analysed] = []
        with self._lock:
            for chunk_id, digest, tag, text in prepared:
                slot = self._slot_of.get(chunk_id)
                if slot is not None and self._digest[slot] == digest:
                    self._tag[slot] = self._tag_number(tag)
                    done.append((chunk_id, digest, tag, None, None))
                    continue
                if slot is not None:
                    self._kill(slot)
                tokens = self.analyzer.tokens(text)
                counts = _counts(tokens)
                self._append_counts(chunk_id, counts, len(tokens), tag, digest)
                done.append((chunk_id, digest, tag, len(tokens), list(counts.items())))
            self._changed()
        return done

    def upsert_analysed(self, records: Sequence[Analysed]) -> None:
        """Apply `upsert`'s records again, in order (on the index they were made on, this gives the very
        same index): a record with counts replaces the chunk; one without only sets the tag of a chunk
        whose text has that digest."""
        with self._lock:
            for chunk_id, digest, tag, length, counts in records:
                slot = self._slot_of.get(chunk_id)
                if counts is None or length is None:
                    if slot is not None and self._digest[slot] == digest:
                        self._tag[slot] = self._tag_number(tag)
                    continue
                if slot is not None:
                    self._kill(slot)
                self._append_counts(chunk_id, dict(counts), length, tag, digest)
            self._changed()

    def delete(self, ids: Sequence[str]) -> None:
        """Remove chunks by id; ids the index does not hold are ignored."""
        with self._lock:
            for chunk_id in ids:
                slot = self._slot_of.get(chunk_id)
                if slot is not None:
                    self._kill(slot)
            self._changed()

    def _tag_number(self, tag: str | None) -> int:
        if tag is None:
            return -1
        number = self._tag_no.get(tag)
        if number is None:
            number = self._tag_no[tag] = len(self._tags)
            self._tags.append(tag)
            self._label_masks.parse(self._tags)
        return number

    def _append_counts(
        self, chunk_id: str, counts: dict[str, int], length: int, tag: str | None, digest: int
    ) -> None:
        """Index a chunk in a new slot: `counts` = its tokens' frequencies in first-appearance order,
        `length` = how many tokens it has."""
        slot = len(self._slot_ids)
        for term, tf in counts.items():
            number = self._term_no.get(term)
            if number is None:
                number = self._term_no[term] = len(self._terms)
                self._terms.append(term)
                self._df.append(0)
                self._post_slots.append(array("I"))
                self._post_tf.append(array("I"))
            self._df[number] += 1
            self._post_slots[number].append(slot)
            self._post_tf[number].append(tf)
            self._fwd_terms.append(number)
            self._fwd_tf.append(tf)
        self._fwd_start.append(len(self._fwd_terms))
        self._slot_ids.append(chunk_id)
        self._slot_of[chunk_id] = slot
        self._doc_len.append(length)
        self._tag.append(self._tag_number(tag))
        self._alive.append(1)
        self._digest.append(digest)
        self._live += 1
        self._total_len += length

    def _kill(self, slot: int) -> None:
        for number in self._fwd_terms[self._fwd_start[slot] : self._fwd_start[slot + 1]]:
            self._df[number] -= 1
        self._alive[slot] = 0
        self._live -= 1
        self._total_len -= self._doc_len[slot]
        chunk_id = self._slot_ids[slot]
        if chunk_id is not None:
            del self._slot_of[chunk_id]
        self._slot_ids[slot] = None

    def _changed(self) -> None:
        self._version += 1
        dead = len(self._slot_ids) - self._live
        if dead > 1000 and dead * 4 > len(self._slot_ids):
            self.compact()

    def compact(self) -> None:
        """Drop dead slots and unused terms, keeping the live slots' order (so every score stays the same)."""
        with self._lock:
            if self._live == len(self._slot_ids) and all(self._df):
                return
            state = self._export_arrays()
            tags = list(self._tags)
            self._restore(state, tags)

    # -- persistence (the files themselves: app/lexical/files.py) ---------------------------

    def _export_arrays(self) -> dict[str, Any]:
        """The live slots, renumbered densely, as flat arrays (postings in CSR form) and string lists
        (`_export`, over views of this index's arrays: the caller holds the lock throughout)."""
        return _export(self._raw(copy=False))

    def _raw(self, copy: bool) -> dict[str, Any]:
        """The arrays `_export` reads: views of this index's own (`copy=False`, valid while the lock is
        held and nothing is appended), or copies, which stay valid after the lock is released."""

        def arr(buffer: Any, dtype: Any) -> np.ndarray:
            view = np.frombuffer(buffer, dtype=dtype)
            return view.copy() if copy else view

        return {
            "alive": arr(self._alive, np.uint8),
            "fwd_start": arr(self._fwd_start, np.uint64),
            "fwd_terms": arr(self._fwd_terms, np.uint32),
            "fwd_tf": arr(self._fwd_tf, np.uint32),
            "df": arr(self._df, np.uint32),
            "doc_len": arr(self._doc_len, np.uint32),
            "tag": arr(self._tag, np.int32),
            "digest": arr(self._digest, np.uint32),
            "slot_ids": list(self._slot_ids),
            "terms": list(self._terms),
        }

    def _restore(self, state: dict[str, Any], tags: list[str]) -> None:
        self._clear()
        ids: list[str] = list(state["ids"])
        self._slot_ids = list(ids)
        self._slot_of = {chunk_id: i for i, chunk_id in enumerate(ids)}
        if len(self._slot_of) != len(ids):
            raise ValueError("lexical index: duplicate chunk ids in the saved state")
        self._doc_len = _array("I", state["doc_len"])
        self._tag = _array("i", state["tag"])
        self._digest = _array("I", state["digest"])
        self._alive = bytearray(b"\x01" * len(ids))
        self._fwd_start = _array("Q", state["fwd_start"])
        self._fwd_terms = _array("I", state["fwd_terms"])
        self._fwd_tf = _array("I", state["fwd_tf"])
        self._terms = list(state["terms"])
        self._term_no = {term: i for i, term in enumerate(self._terms)}
        self._df = _array("I", state["df"])
        starts = np.asarray(state["post_start"], dtype=np.int64).tolist()
        slots = np.ascontiguousarray(state["post_slots"], dtype=np.uint32).tobytes()
        tfs = np.ascontiguousarray(state["post_tf"], dtype=np.uint32).tobytes()
        for lo, hi in zip(starts, starts[1:], strict=False):
            a = array("I")
            a.frombytes(slots[lo * 4 : hi * 4])
            self._post_slots.append(a)
            f = array("I")
            f.frombytes(tfs[lo * 4 : hi * 4])
            self._post_tf.append(f)
        self._tags = list(tags)
        self._tag_no = {tag: i for i, tag in enumerate(self._tags)}
        self._label_masks.parse(self._tags)  # at load, not at the first filtered query
        self._live = len(ids)
        self._total_len = int(np.asarray(state["doc_len"], dtype=np.int64).sum())
        self._version += 1
        if not (
            len(self._doc_len) == len(self._tag) == len(self._digest) == len(ids) == len(self._fwd_start) - 1
            and len(self._terms) == len(self._df) == len(starts) - 1
            and len(self._fwd_terms) == len(self._fwd_tf) == self._fwd_start[-1] == starts[-1]
        ):
            raise ValueError("lexical index: the saved arrays do not agree in length")

    def export_state(self) -> tuple[dict[str, Any], list[str]]:
        """(arrays and string lists of the live chunks, tag names), for `files.save_snapshot`.

        The lock is held only while the index's arrays are copied, a small part of the export; the sort
        that puts the postings in CSR form runs after it, beside queries and writes. Held for the whole
        export, it would stall every query for seconds at 1M chunks (docs/benchmarks.md#code-figures,
        docs/scaling.md)."""
        with self._lock:
            raw, tags = self._raw(copy=True), list(self._tags)
        return _export(raw), tags

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        tags: list[str],
        analyzer: Analyzer,
        k1: float = 1.2,
        b: float = 0.75,
        epsilon: float = 0.25,
    ) -> Bm25Index:
        index = cls(analyzer, k1=k1, b=b, epsilon=epsilon)
        index._restore(state, tags)
        return index

    # -- reading --------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._live

    @property
    def ids(self) -> list[str]:
        """The live chunk ids, in slot order."""
        with self._lock:
            return [i for i in self._slot_ids if i is not None]

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._slot_of

    def digest(self, chunk_id: str) -> int | None:
        slot = self._slot_of.get(chunk_id)
        return None if slot is None else self._digest[slot]

    def tag_of(self, chunk_id: str) -> str | None:
        return self.tags_of([chunk_id])[0]

    def tags_of(self, ids: Sequence[str]) -> list[str | None]:
        """The label of each id (`app.store.types.index_label_of`; None: untagged and unscoped, or not in
        the index)."""
        with self._lock:  # a compaction renumbers slots and tags: read both under the lock
            slot_of, tag, tags = self._slot_of, self._tag, self._tags
            slots = [slot_of.get(chunk_id) for chunk_id in ids]
            return [None if slot is None or tag[slot] < 0 else tags[tag[slot]] for slot in slots]

    def tag_count(self, knowledge_tag: str | None, principal: Principal | None = None) -> int:
        """How many live chunks carry `knowledge_tag` (any, for None) and are readable by `principal` (all,
        for None): counted once per change of the index."""
        with self._lock:
            if knowledge_tag is None and (principal is None or principal.admin):
                return self._live
            if self._tag_counts is None or self._tag_counts[0] != self._version:
                tags = np.frombuffer(self._tag, dtype=np.int32)[self._alive_now()]
                counts = np.bincount(tags[tags >= 0], minlength=len(self._tags))
                self._tag_counts = (self._version, counts)
            counts = self._tag_counts[1]
            mask = self._label_mask(knowledge_tag, principal)[: len(counts)]
            return int(counts[: len(mask)][mask].sum())

    def unscoped_count(self) -> int:
        """How many live chunks carry no access list: only the admin reads them (`may_read`)."""
        with self._lock:
            labels = [parse_label(label).access for label in self._tags]
            unscoped = np.asarray([not access for access in labels] + [True], dtype=bool)
            tags = np.frombuffer(self._tag, dtype=np.int32)[self._alive_now()]
            return int(np.count_nonzero(unscoped[tags]))

    def readable(
        self, ids: Sequence[str], knowledge_tag: str | None, principal: Principal | None
    ) -> list[bool]:
        """Per id, whether the index holds it with `knowledge_tag` (any, for None) and readable by
        `principal` (everyone, for None)."""
        with self._lock:
            mask = self._label_mask(knowledge_tag, principal)
            slot_of, tag = self._slot_of, self._tag
            slots = [slot_of.get(chunk_id) for chunk_id in ids]
            return [slot is not None and bool(mask[tag[slot]]) for slot in slots]

    def _label_mask(self, knowledge_tag: str | None, principal: Principal | None) -> np.ndarray:
        """Per label number, whether a chunk so labelled matches; one more entry, last, for the unlabelled
        chunks, so that indexing it with a slot's label number (-1: none) answers for every slot."""
        if principal is not None and principal.admin:
            principal = None
        untagged = label_matches(None, knowledge_tag, principal)
        return self._label_masks(self._tags, knowledge_tag, principal, [untagged])

    def _slot_mask(self, knowledge_tag: str | None, principal: Principal | None) -> np.ndarray | None:
        """Per slot, whether it matches (None: every slot does)."""
        if principal is not None and principal.admin:
            principal = None
        if knowledge_tag is None and principal is None:
            return None
        key = (knowledge_tag, None if principal is None else principal.key)
        kept = self._slot_masks.get(key)
        if kept is not None and kept[0] == self._version:
            return kept[1]
        mask = self._label_mask(knowledge_tag, principal)[np.frombuffer(self._tag, dtype=np.int32)]
        if len(self._slot_masks) >= 32:  # bounded: a byte per slot each
            self._slot_masks.clear()
        self._slot_masks[key] = (self._version, mask)
        return mask

    def _query_terms(self, query: str) -> list[int]:
        """The query's term numbers, reused while the index is unchanged: a query's `top` and the bm25
        stage's `scores` for its candidates tokenise it once, also when a batch of queries (up to
        `RECENT_QUERIES`) asks `top` for each before the stages run (callers never modify it)."""
        recent = self._recent_terms.get(query)
        if recent is not None and recent[0] == self._version:
            self._recent_terms.move_to_end(query)
            return recent[1]
        # Tokens outside the vocabulary add exactly 0 in BM25Okapi; dropping them only saves the work.
        out = []
        for token in self.analyzer.tokens(query):
            number = self._term_no.get(token)
            if number is not None and self._df[number] > 0:
                out.append(number)
        self._recent_terms[query] = (self._version, out)
        self._recent_terms.move_to_end(query)
        if len(self._recent_terms) > self.RECENT_QUERIES:
            self._recent_terms.popitem(last=False)
        return out

    def _idf(self, number: int) -> float:
        """BM25Okapi's idf, floored at epsilon * mean idf when negative."""
        df = self._df[number]
        idf = math.log(self._live - df + 0.5) - math.log(df + 0.5)
        if idf < 0:
            return self.epsilon * self._mean_idf_now()
        return idf

    def _mean_idf_now(self) -> float:
        """BM25Okapi's `average_idf`: the idf of every term of the corpus summed in the order the terms
        first appear (slot order, then the order within the chunk), divided by the vocabulary size."""
        if self._mean_idf is not None and self._mean_idf[0] == self._version:
            return self._mean_idf[1]
        alive = np.frombuffer(self._alive, dtype=np.uint8).astype(bool)
        starts = np.frombuffer(self._fwd_start, dtype=np.uint64).astype(np.int64)
        terms = np.frombuffer(self._fwd_terms, dtype=np.uint32)[np.repeat(alive, np.diff(starts))]
        unique, first = np.unique(terms, return_index=True)
        total = 0.0
        n = self._live
        for number in unique[np.argsort(first)].tolist():
            df = self._df[number]
            total += math.log(n - df + 0.5) - math.log(df + 0.5)
        mean = total / len(unique)
        self._mean_idf = (self._version, mean)
        return mean

    def _length_norm(self) -> np.ndarray:
        if self._norm is None or self._norm[0] != self._version:
            doc_len = np.frombuffer(self._doc_len, dtype=np.uint32).astype(np.int64)
            avgdl = self._total_len / self._live
            self._norm = (self._version, self.k1 * (1 - self.b + self.b * doc_len / avgdl))
        return self._norm[1]

    def _all_scores(self, query_terms: list[int]) -> np.ndarray:
        """Every slot's score (dead slots included: callers mask them). The postings make scoring touch
        only the chunks that contain a query term: BM25Okapi.get_scores walks every chunk's dict in Python
        for every query term, far slower than the postings (docs/benchmarks.md#code-figures). The
        arithmetic is its own, term by term, so the scores are bit-for-bit equal
        (tests/unit/test_lexical.py)."""
        score = np.zeros(len(self._slot_ids))
        for number in query_terms:
            at, weights = self._weights(number)
            score[at] += weights
        return score

    def _scores_of(self, query_terms: list[int]) -> np.ndarray:
        """`_all_scores`, reused while the index and the query are unchanged (callers never modify it)."""
        key = tuple(query_terms)
        last = self._last_scores
        if last is not None and last[0] == self._version and last[1] == key:
            return last[2]
        score = self._all_scores(query_terms)
        self._last_scores = (self._version, key, score)
        return score

    def _weights(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """A term's postings as scoring adds them: slots (int64) and each posting's term weight
        idf * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avgdl))), BM25Okapi's expression with tf
        converted to float64 (exactly): the same IEEE operations on the same values, so adding a cached
        weight gives the very bits computing it in the query would.

        Kept for the next query, so that a query whose terms are cached only gathers, adds and scatters
        (the weights are recomputed after a write: N, avgdl and idf change). 16 bytes a posting, so the
        cache is bounded (`POSTINGS_CACHE_LIMIT` postings, the least recently used term dropped first).
        Unbounded, it grew with every term ever queried: common terms of a 1M-chunk collection have ~500k
        postings (8 MB) each."""
        size = len(self._post_slots[number])
        cache = self._post_np
        cached = cache.get(number)
        if cached is not None and cached[0] == size:
            cache.move_to_end(number)
            if cached[3] == self._version:
                return cached[1], cached[2]
            at = cached[1]
        else:
            at = np.frombuffer(self._post_slots[number], dtype=np.uint32).astype(np.int64)
        tf = np.frombuffer(self._post_tf[number], dtype=np.uint32).astype(np.float64)
        weights = (self._idf(number) or 0) * ((tf * (self.k1 + 1)) / (tf + self._length_norm()[at]))
        if cached is not None:
            del cache[number]
            self._post_np_size -= cached[0]
        if size <= self.POSTINGS_CACHE_LIMIT:
            cache[number] = (size, at, weights, self._version)
            self._post_np_size += size
            while self._post_np_size > self.POSTINGS_CACHE_LIMIT:
                _, (dropped, *_rest) = cache.popitem(last=False)
                self._post_np_size -= dropped
        return at, weights

    def _alive_now(self) -> np.ndarray:
        if self._alive_mask is None or self._alive_mask[0] != self._version:
            self._alive_mask = (self._version, np.frombuffer(self._alive, dtype=np.uint8).astype(bool))
        return self._alive_mask[1]

    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]:
        """BM25 of `query` against each of `ids`; an id the index does not hold scores 0.0 (no evidence)."""
        out = dict.fromkeys(ids, 0.0)
        with self._lock:
            q = self._query_terms(query)
            slot_of = self._slot_of
            known = [chunk_id for chunk_id in out if chunk_id in slot_of]
            if not q or not known:
                return out
            values = self._scores_of(q)[[slot_of[chunk_id] for chunk_id in known]]
        out.update(zip(known, values.tolist(), strict=True))  # tolist: Python floats, the same values
        return out

    def top(
        self, query: str, n: int, knowledge_tag: str | None = None, principal: Principal | None = None
    ) -> list[tuple[str, float]]:
        """The best `n` chunks: score > 0 only, score descending, ties by id.

        Over the whole collection, or only over the chunks tagged `knowledge_tag` and readable by
        `principal` (taken before the cut, so other chunks never crowd them out); the scores are the same
        either way."""
        if n <= 0:
            return []
        with self._lock:
            q = self._query_terms(query)
            if not q:
                return []
            matching = self._slot_mask(knowledge_tag, principal)
            if matching is not None and not matching.any():
                return []
            all_scores = self._scores_of(q)
            floor = self._score_floor(q, all_scores, n, matching)
            keep = all_scores >= floor if floor > 0 else all_scores > 0
            keep &= self._alive_now()
            if matching is not None:
                keep &= matching
            positive = np.flatnonzero(keep)
            if len(positive) > n:
                # Keep everything tied with the n-th best, so the id tie-break sees all of them.
                nth = np.partition(all_scores[positive], -n)[-n]
                positive = positive[all_scores[positive] >= nth]
            ranked = sorted(
                ((str(self._slot_ids[i]), float(all_scores[i])) for i in positive.tolist()),
                key=lambda pair: (-pair[1], pair[0]),
            )
        return ranked[:n]

    def _score_floor(
        self, query_terms: list[int], scores: np.ndarray, n: int, matching: np.ndarray | None
    ) -> float:
        """A score the n-th best of `top` cannot be below (0.0 when none is found): the n-th best score
        among the live (matching) chunks holding the query's rarest term, a subset of those `top` ranks.

        `top` then masks `scores >= floor` instead of `scores > 0`: at 1M chunks a query's common terms
        give half the collection a positive score, and finding, gathering and partitioning all of those
        cost more than scoring; the rarest term's postings are usually a few hundred. The result is the
        same: every one of the n best, and everything tied with the n-th, scores at least the floor."""
        rarest = min(query_terms, key=lambda number: len(self._post_slots[number]))
        if len(self._post_slots[rarest]) < n:
            return 0.0
        at = self._weights(rarest)[0]
        eligible = self._alive_now()[at]
        if matching is not None:
            eligible &= matching[at]
        values = scores[at[eligible]]
        values = values[values > 0]
        if len(values) < n:
            return 0.0
        return float(np.partition(values, -n)[-n])


def _export(raw: dict[str, Any]) -> dict[str, Any]:
    """`Bm25Index._raw`'s arrays -> the live slots, renumbered densely, as flat arrays (postings in CSR
    form) and string lists. Every array returned is a new one, never a view of `raw`'s."""
    alive = raw["alive"].astype(bool)
    starts = raw["fwd_start"].astype(np.int64)
    lengths = np.diff(starts)
    entry_alive = np.repeat(alive, lengths)
    fwd_terms = raw["fwd_terms"][entry_alive]
    fwd_tf = raw["fwd_tf"][entry_alive]
    live_lengths = lengths[alive]
    # keep the terms still in use, in their current order
    df = raw["df"]
    used = df > 0
    renumber = np.cumsum(used) - 1
    fwd_terms = renumber[fwd_terms].astype(np.uint32)
    n_terms = int(used.sum())
    entry_slot = np.repeat(np.arange(len(live_lengths), dtype=np.uint32), live_lengths)
    order = np.argsort(fwd_terms, kind="stable")  # stable: each term's postings stay in slot order
    return {
        "ids": [i for i in raw["slot_ids"] if i is not None],
        "terms": [t for t, u in zip(raw["terms"], used.tolist(), strict=True) if u],
        "doc_len": raw["doc_len"][alive].copy(),
        "tag": raw["tag"][alive].copy(),
        "digest": raw["digest"][alive].copy(),
        "fwd_start": np.concatenate([[0], np.cumsum(live_lengths)]).astype(np.uint64),
        "fwd_terms": fwd_terms,
        "fwd_tf": fwd_tf.copy(),
        "df": df[used].copy(),
        "post_start": np.concatenate([[0], np.cumsum(np.bincount(fwd_terms, minlength=n_terms))]).astype(
            np.uint64
        ),
        "post_slots": entry_slot[order],
        "post_tf": fwd_tf[order],
    }


def _counts(tokens: list[str]) -> dict[str, int]:
    """Each token's frequency, in the order the tokens first appear."""
    counts: dict[str, int] = {}
    for token in tokens:
        counts[token] = counts.get(token, 0) + 1
    return counts


def _array(typecode: str, values: Any) -> array[int]:
    dtype = {"I": np.uint32, "i": np.int32, "Q": np.uint64}[typecode]
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values, dtype=dtype).tobytes())
    return out
