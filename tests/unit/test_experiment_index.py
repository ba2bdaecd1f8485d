"""Which collection a variant needs, what it is called, when a stored one is reused, and the byte budget."""

from __future__ import annotations

import hashlib
import json

from app.experiment.index import (
    BYTES_KEY,
    COMPLETE_KEY,
    EXPERIMENT_KEY,
    Budget,
    collection_name,
    decide,
    estimated_bytes,
    experiment_collections_note,
    index_hash,
    is_experiment_collection,
    record_digest,
)
from app.settings import Settings, merge, nested


def _settings(*pairs: tuple[str, object]) -> Settings:
    return Settings(**merge({}, *(nested(k, v) for k, v in pairs)))


def test_chain_and_retrieval_variants_run_on_the_base_collection() -> None:
    base = Settings()
    for key, value in [("rag.chain.bm25.enabled", False), ("rag.retrieval.candidate_k", 10)]:
        assert decide(base, _settings((key, value)), None) == "base"
    assert decide(base, _settings(("rag.models.query_prompt", "q: ")), None) == "base"  # queries only


def test_index_variants_are_built_then_reused_once_complete_and_resumed_when_not() -> None:
    base = Settings()
    for key, value in [
        ("rag.ingest.chunk_size", 300),
        ("rag.ingest.chunk_overlap", 50),
        ("rag.models.embedder", "all-MiniLM-L6-v2"),
        ("rag.models.passage_prompt", "p: "),
        ("rag.store.hnsw_m", 16),
    ]:
        variant = _settings((key, value))
        assert decide(base, variant, None) == "build", key
        assert decide(base, variant, {EXPERIMENT_KEY: "x", COMPLETE_KEY: True}) == "reuse", key
        assert decide(base, variant, {EXPERIMENT_KEY: "x", COMPLETE_KEY: False}) == "resume", key
        assert decide(base, variant, {EXPERIMENT_KEY: "x"}) == "resume", key  # no mark: never complete


def test_the_name_hashes_the_index_settings_and_the_record() -> None:
    small, big = _settings(("rag.ingest.chunk_size", 300)), _settings(("rag.ingest.chunk_size", 900))
    digest = record_digest({"a": "h1"}, {})
    assert index_hash(small, digest) == index_hash(_settings(("rag.ingest.chunk_size", 300)), digest)
    assert index_hash(small, digest) != index_hash(big, digest)
    assert index_hash(small, digest) != index_hash(small, record_digest({"a": "h2"}, {}))
    # a chain setting does not name another collection
    assert index_hash(small, digest) == index_hash(
        _settings(("rag.ingest.chunk_size", 300), ("rag.chain.bm25.enabled", False)), digest
    )
    assert len(index_hash(small, digest)) == 12
    assert collection_name("sieve", "abc123abc123") == "sieve-exp-abc123abc123"


def test_the_record_digest_is_sha256_of_sorted_hashes_and_tombstones() -> None:
    expected = hashlib.sha256(json.dumps([[["a", "1"], ["b", "2"]], ["gone"]]).encode()).hexdigest()
    assert record_digest({"b": "2", "a": "1"}, {"gone": object()}) == expected
    assert record_digest({"a": "1"}, {}) != record_digest({"a": "1"}, {"a-deleted": 1})


def test_only_marked_collections_of_this_base_are_experiment_collections() -> None:
    assert is_experiment_collection("sieve", "sieve-exp-abc", {EXPERIMENT_KEY: "abc"})
    assert not is_experiment_collection("sieve", "sieve-exp-abc", {})  # someone else's name
    assert not is_experiment_collection("sieve", "other-exp-abc", {EXPERIMENT_KEY: "abc"})
    assert not is_experiment_collection("sieve", "sieve", None)


def test_estimated_bytes_are_text_metadata_and_float32_vectors() -> None:
    assert estimated_bytes(1000, 500, 10, 384) == 1000 + 500 + 10 * 384 * 4


def test_the_budget_counts_kept_and_new_collections() -> None:
    assert Budget(limit=100, kept=40, new=60).problem() is None
    problem = Budget(limit=100, kept=40, new=61).problem()
    assert problem is not None
    assert "about 101 bytes (40 stored, 61 to build)" in problem
    assert "rag.experiment.max_store_bytes 100" in problem
    assert "sieve experiment --clean" in problem


def test_store_check_notes_experiment_collections_as_known_with_their_state_and_bytes() -> None:
    collections = {
        "sieve": {},
        "sieve-exp-aaa": {EXPERIMENT_KEY: "aaa", COMPLETE_KEY: True, BYTES_KEY: 1000},
        "sieve-exp-bbb": {EXPERIMENT_KEY: "bbb", BYTES_KEY: 250},  # a stopped build
        "other-exp-ccc": {EXPERIMENT_KEY: "ccc", COMPLETE_KEY: True, BYTES_KEY: 99},  # another base's
        "sieve-exp-ddd": {},  # the name without the mark: not an experiment's
    }
    assert experiment_collections_note("sieve", collections) == (
        f"experiment collections: 2 (1 complete, 1 unfinished (the next experiment resumes them); "
        f"~{1000 + 250:,} bytes estimated), never served; `sieve experiment --clean` drops them"
    )


def test_store_check_has_no_experiment_note_without_experiment_collections() -> None:
    assert experiment_collections_note("sieve", {"sieve": {}, "sieve-documents": {}}) is None
