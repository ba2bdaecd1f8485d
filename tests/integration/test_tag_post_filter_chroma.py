"""The tag post-filter on a real embedded Chroma: for every tag, its candidates equal Chroma's own filtered
search (`tag_post_filter_max: 0`), both for tags the post-filter serves and for the rare one it leaves to
`where`, and an unfiltered search of more results than the collection holds is answered in full."""

from __future__ import annotations

import numpy as np
import pytest

from app.retrieval.candidates import CandidateGenerator
from app.settings import RetrievalSettings, StoreSettings
from app.store import ChromaStore, StoredChunk
from tests.fixtures.indexes import index_of

pytestmark = pytest.mark.integration

DIM = 16
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}
SHARES = {"finance": 300, "hr": 120, "it": 60, "legal": 6, None: 114}  # 600 chunks
K = 8


@pytest.fixture(scope="module")
def tagged_store(tmp_path_factory):
    rng = np.random.default_rng(23)
    chunks, vectors = [], []
    for tag, count in SHARES.items():
        for i in range(count):
            meta = {"doc_id": f"{tag}-{i}"} | ({"knowledge": tag} if tag else {})
            chunks.append(StoredChunk(f"{tag}-{i:03d}", f"chunk {i} of {tag}", meta))
            vectors.append(rng.normal(size=DIM))
    matrix = np.asarray(vectors, dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    path = tmp_path_factory.mktemp("tag-post-filter")
    store = ChromaStore.open(StoreSettings(path=str(path / "chroma"), collection="tags"), IDENTITY)
    store.upsert(chunks, matrix)
    index = index_of(chunks)
    yield store, index
    store.close()


def candidate_ids(store, index, post_filter_max: int, queries: np.ndarray, tag: str) -> list[list[str]]:
    settings = RetrievalSettings(candidate_k=K, hybrid=False, tag_post_filter_max=post_filter_max)
    generator = CandidateGenerator(store, settings, index)
    sets = generator.generate_many(["q"] * len(queries), queries, [tag] * len(queries))
    return [[c.chunk_id for c in s.candidates] for s in sets]


@pytest.mark.parametrize("tag", ["finance", "hr", "it", "legal"])
def test_post_filtered_candidates_equal_chromas_filtered_search(tagged_store, tag: str) -> None:
    store, index = tagged_store
    queries = np.random.default_rng(1).normal(size=(20, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    filtered = candidate_ids(store, index, 0, queries, tag)
    post = candidate_ids(store, index, 4000, queries, tag)  # legal: 2 * 8 * 600 / 6 = 1,600, all 601 asked
    small = candidate_ids(store, index, 100, queries, tag)  # finance 32, hr 80: post; it 160, legal: where
    assert post == filtered == small
    assert all(len(ids) == min(K, SHARES[tag]) for ids in post)
    assert all(chunk_id.startswith(f"{tag}-") for ids in post for chunk_id in ids)


def test_more_results_than_the_collection_holds_come_back_in_full(tagged_store) -> None:
    store, _ = tagged_store
    (hits,) = store.query_ids(np.ones((1, DIM), dtype=np.float32) / 4, 601)
    assert len(hits) == 600 and len({cid for cid, _ in hits}) == 600
