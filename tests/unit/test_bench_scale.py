"""The bench-scale script's own pieces: a deterministic corpus whose ids can be listed without text, a hash
embedder with unit-length deterministic vectors, the exact top-k merge, and the doc block it writes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_scale  # noqa: E402
from scale_corpus import Corpus, HashEmbedder  # noqa: E402


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(seed=11)


def test_the_corpus_is_the_same_in_any_order_and_its_ids_are_listed_without_text(corpus) -> None:
    chunks = [c for doc in corpus.chunks(60) for c in doc]
    assert len(chunks) == 60
    assert corpus.chunk_ids(60) == [c.chunk_id for c in chunks]
    doc_no = int(chunks[-1].doc_id[1:])
    assert corpus.document(doc_no)[: len([c for c in chunks if c.doc_id == chunks[-1].doc_id])] == [
        c for c in chunks if c.doc_id == chunks[-1].doc_id
    ]
    assert [c.position for c in corpus.document(3)] == list(range(len(corpus.document(3))))
    assert Corpus(seed=11).document(5) == corpus.document(5)


def test_the_hash_embedder_gives_unit_vectors_equal_for_equal_texts() -> None:
    embedder = HashEmbedder()
    vectors = embedder.embed(["Frate dufea.", "frate DUFEA", "工资", ""])
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.array_equal(vectors[0], vectors[1])  # case and punctuation are not tokens
    assert vectors[3].tolist() == [1.0] + [0.0] * 383  # no token: a fixed unit vector
    # 工资 is two CJK tokens, weighted 1 each: the normalised sum of their own vectors
    expected = embedder.embed(["工"])[0] + embedder.embed(["资"])[0]
    assert np.allclose(vectors[2], expected / np.linalg.norm(expected), atol=1e-6)


def test_merge_top_keeps_the_best_k_of_both_blocks() -> None:
    scores = np.array([[0.9, 0.1]], dtype=np.float32)
    ids = np.array([["a", "b"]], dtype=object)
    block = (np.array([[0.5], [0.95], [0.05]], dtype=np.float32), np.array(["c", "d", "e"], dtype=object))
    top_scores, top_ids = bench_scale._merge_top(scores, ids, block, 2)
    assert sorted(zip(top_scores[0].tolist(), top_ids[0].tolist(), strict=True)) == [
        (pytest.approx(0.9), "a"),
        (pytest.approx(0.95), "d"),
    ]


def test_percentile_is_nearest_rank() -> None:
    assert bench_scale.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert bench_scale.percentile([float(i) for i in range(1, 21)], 95) == 19.0  # ceil(20 * 0.95) = 19th


def test_the_block_replaces_only_what_lies_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Top\nkept\n{bench_scale.BEGIN}\nold\n{bench_scale.END}\ntail kept\n", encoding="utf-8")
    bench_scale.write_block(doc, "new | table")
    assert doc.read_text(encoding="utf-8") == (
        f"# Top\nkept\n{bench_scale.BEGIN}\nnew | table\n{bench_scale.END}\ntail kept\n"
    )
