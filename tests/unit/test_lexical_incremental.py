"""The BM25 index updated in place (upsert, delete, compaction, save/load) scores exactly as a fresh
rank-bm25 BM25Okapi over the live chunks in the index's order."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from app.lexical.files import Journal, load_snapshot, read_manifest, save_snapshot
from app.lexical.index import Analyzer, Bm25Index

ANALYZER = Analyzer()
WORDS = ["vpn", "password", "reset", "travel", "pie", "common", "报销", "差旅", "密码"]
QUERIES = ["vpn password", "common common pie", "报销 差旅", "reset", "travel common"]

texts_st = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join)
ops_st = st.lists(
    st.tuples(
        st.sampled_from(["put", "del"]), st.integers(0, 11), texts_st, st.sampled_from([None, "it", "hr"])
    ),
    min_size=1,
    max_size=40,
)


def _assert_equals_fresh(index: Bm25Index, corpus: dict[str, tuple[str, str | None]]) -> None:
    ids = index.ids
    assert sorted(ids) == sorted(corpus)
    tokens = [ANALYZER.tokens(corpus[i][0]) for i in ids]
    if not any(tokens):
        for q in QUERIES:
            assert index.top(q, 50) == []
        return
    reference = BM25Okapi(tokens, k1=1.2, b=0.75, epsilon=0.25)
    for q in QUERIES:
        expected = reference.get_scores(ANALYZER.tokens(q))
        assert index.scores(q, ids) == {i: float(s) for i, s in zip(ids, expected, strict=True)}, q
        positive = {i: float(s) for i, s in zip(ids, expected, strict=True) if s > 0}
        assert dict(index.top(q, len(ids) + 1)) == positive, q
        for tag in ("it", "hr"):
            want = {i: s for i, s in positive.items() if corpus[i][1] == tag}
            assert dict(index.top(q, len(ids) + 1, knowledge_tag=tag)) == want, (q, tag)
        # the cut at every n (the score floor of the rarest term must never change it): score descending,
        # ties by id, as the definition says
        for tag in (None, "it", "hr"):
            ranked = sorted(
                ((i, s) for i, s in positive.items() if tag is None or corpus[i][1] == tag),
                key=lambda pair: (-pair[1], pair[0]),
            )
            for n in range(1, len(ranked) + 2):
                assert index.top(q, n, knowledge_tag=tag) == ranked[:n], (q, tag, n)


def _apply(
    index: Bm25Index, corpus: dict[str, tuple[str, str | None]], op: str, n: int, text: str, tag: str | None
) -> None:
    """One generated write, to the index and to the corpus it must equal."""
    if op == "put":
        index.upsert([(f"c{n}", text, tag)])
        corpus[f"c{n}"] = (text, tag)
    else:
        index.delete([f"c{n}"])
        corpus.pop(f"c{n}", None)


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_incremental_updates_score_like_a_fresh_bm25okapi(ops) -> None:
    index = Bm25Index(ANALYZER)
    corpus: dict[str, tuple[str, str | None]] = {}
    for op in ops:
        _apply(index, corpus, *op)
    _assert_equals_fresh(index, corpus)
    index.compact()
    _assert_equals_fresh(index, corpus)
    state, tags = index.export_state()
    _assert_equals_fresh(Bm25Index.from_state(state, tags, ANALYZER), corpus)


@settings(max_examples=100, deadline=None)
@given(ops_st)
def test_queries_between_writes_score_like_a_fresh_bm25okapi_after_every_write(ops) -> None:
    """Every write changes N, avgdl and idf: weights cached by the queries before it must not survive it."""
    index = Bm25Index(ANALYZER)
    corpus: dict[str, tuple[str, str | None]] = {}
    for op, n, text, tag in ops:
        _apply(index, corpus, op, n, text, tag)
        ids = index.ids
        tokens = [ANALYZER.tokens(corpus[i][0]) for i in ids]
        if not any(tokens):
            continue
        reference = BM25Okapi(tokens, k1=1.2, b=0.75, epsilon=0.25)
        for q in QUERIES:
            values = reference.get_scores(ANALYZER.tokens(q))
            expected = {i: float(v) for i, v in zip(ids, values, strict=True)}
            assert index.scores(q, ids) == expected, (q, op, n)
            assert dict(index.top(q, len(ids) + 1)) == {i: v for i, v in expected.items() if v > 0}, q


@settings(max_examples=100, deadline=None)
@given(ops_st)
def test_replaying_upserts_records_without_the_analyzer_gives_the_same_index(ops) -> None:
    """A journal holds `upsert`'s records (term counts, not text): applied to a copy of the index they were
    made on, they rebuild it exactly, with an analyzer that cannot tokenise anything."""

    class NoAnalyzer(Analyzer):
        def tokens(self, text: str) -> list[str]:
            raise AssertionError("replay must not tokenise")

    base = Bm25Index.build(
        ["c0", "c1"], ["vpn password", "common pie"], ANALYZER, knowledge_tags=["it", None]
    )
    state, tags = base.export_state()
    replayed = Bm25Index.from_state(state, tags, NoAnalyzer())
    corpus: dict[str, tuple[str, str | None]] = {"c0": ("vpn password", "it"), "c1": ("common pie", None)}
    for op, n, text, tag in ops:
        chunk_id = f"c{n}"
        if op == "put":
            replayed.upsert_analysed(base.upsert([(chunk_id, text, tag)]))
            corpus[chunk_id] = (text, tag)
        else:
            base.delete([chunk_id])
            replayed.delete([chunk_id])
            corpus.pop(chunk_id, None)
    assert replayed.ids == base.ids
    replayed.analyzer = ANALYZER  # the queries themselves need tokens
    _assert_equals_fresh(replayed, corpus)


def test_upsert_records_count_each_term_in_first_appearance_order() -> None:
    index = Bm25Index(ANALYZER)
    assert index.upsert([("a", "reset vpn reset", "it")]) == [
        ("a", zlib.crc32(b"reset vpn reset"), "it", 3, [("reset", 2), ("vpn", 1)])
    ]
    # the same text again: only the tag is set, and the record says so (no counts)
    assert index.upsert([("a", "reset vpn reset", "hr")]) == [
        ("a", zlib.crc32(b"reset vpn reset"), "hr", None, None)
    ]


def test_a_replaced_text_moves_to_the_end_and_an_unchanged_one_only_retags() -> None:
    index = Bm25Index.build(
        ["a", "b", "c"], ["vpn password", "travel", "lunch"], ANALYZER, knowledge_tags=["it", None, None]
    )
    index.upsert([("a", "vpn password", "hr")])
    assert index.ids == ["a", "b", "c"] and index.tag_of("a") == "hr"
    index.upsert([("a", "vpn reset", "hr")])
    assert index.ids == ["b", "c", "a"]
    assert index.top("password", 5) == [] and [i for i, _ in index.top("reset", 5)] == ["a"]


def test_compaction_happens_by_itself_and_keeps_scores() -> None:
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=5)) for _ in range(3000)]
    ids = [f"c{i}" for i in range(3000)]
    index = Bm25Index.build(ids, texts, ANALYZER)
    index.delete(ids[:1500])  # 1500 dead of 3000 slots: compacted
    assert len(index._slot_ids) == 1500
    _assert_equals_fresh(index, {i: (t, None) for i, t in zip(ids[1500:], texts[1500:], strict=True)})


def test_snapshot_and_journal_round_trip(tmp_path: Path) -> None:
    index = Bm25Index.build(
        ["a", "b", "c"],
        ["vpn password", "报销 差旅", "common pie"],
        ANALYZER,
        knowledge_tags=["it", "hr", None],
    )
    state, tags = index.export_state()
    manifest = save_snapshot(tmp_path, state, tags, {"k1": 1.2})
    assert read_manifest(tmp_path) == manifest and manifest["generation"] == 1
    loaded_state, loaded_tags = load_snapshot(tmp_path, manifest)
    loaded = Bm25Index.from_state(loaded_state, loaded_tags, ANALYZER)
    for q in QUERIES:
        assert loaded.top(q, 5) == index.top(q, 5)
        assert loaded.top(q, 5, "hr") == index.top(q, 5, "hr")
    journal = Journal(tmp_path, 1)
    journal.append([{"put": [["d", "vpn", None]]}, {"del": ["a"]}])
    with open(journal.path, "ab") as f:
        f.write(b'0badc0de {"del": ["b"]')  # a write cut short by a kill
    assert Journal(tmp_path, 1).read() == [{"put": [["d", "vpn", None]]}, {"del": ["a"]}]
    assert journal.path.read_bytes().endswith(b"\n")  # the torn tail is cut off


def test_a_new_snapshot_replaces_the_old_files_atomically(tmp_path: Path) -> None:
    index = Bm25Index.build(["a"], ["vpn"], ANALYZER)
    state, tags = index.export_state()
    first = save_snapshot(tmp_path, state, tags, {})
    (tmp_path / "manifest.json.tmp").write_text("{half a manif")  # a kill while writing the next one
    assert read_manifest(tmp_path) == first
    second = save_snapshot(tmp_path, state, tags, first)
    assert second["generation"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "journal-2.log",
        "manifest.json",
        "snap-2.json",
        "snap-2.npz",
    ]


def test_build_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="k1 > 0"):
        Bm25Index(ANALYZER, k1=0)
