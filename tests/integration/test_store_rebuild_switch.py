"""The rebuild's staging collection and switch against a real Chroma, embedded and `chroma run`: a stopped
rebuild leaves the configured collection serving, a rerun keeps what the staging collection holds, and a
switch stopped between the drop and the rename is finished by the next open."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from app.settings import StoreSettings
from app.store import ChromaStore, StoredChunk
from app.store.chroma import REBUILD_COMPLETE_KEY, staging_collection_name

pytestmark = pytest.mark.integration

DIM = 8
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}
OTHER = {"name": "other-embedder", "dimension": DIM, "checksum": "fedcba9876543210"}


@pytest.fixture(params=["embedded", "http"])
def store_settings(request, tmp_path) -> StoreSettings:
    collection = f"rebuild-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        return StoreSettings(mode="embedded", path=str(tmp_path / "chroma"), collection=collection)
    host, port = request.getfixturevalue("chroma_server")
    return StoreSettings(mode="http", host=host, port=port, collection=collection)


def write(store: ChromaStore, *ids: str) -> None:
    vectors = np.eye(DIM, dtype=np.float32)[: len(ids)]
    store.upsert([StoredChunk(i, f"text of {i}", {"doc_id": i}) for i in ids], vectors)


def names(store: ChromaStore) -> set[str]:
    return {c if isinstance(c, str) else c.name for c in store._client.list_collections()}


def test_a_switch_replaces_the_collection_under_its_name(store_settings):
    live = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live, "c_old")
        before = live.collection_id
        staging = live.staging(store_settings, OTHER)
        write(staging, "c_new1", "c_new2")
        assert live.count() == 1  # the old collection serves until the switch
        live.switch_to(staging)
        assert (live.name, live.count()) == (store_settings.collection, 2)
        assert live.collection_id != before
        assert staging_collection_name(store_settings.collection) not in names(live)
        assert REBUILD_COMPLETE_KEY not in live.metadata()
        entry, _ = live.rebuilt(before)
        assert [e.pruned_before is not None for e in live.changes_since(0) if e.entry == entry] == [True]
    finally:
        live.close()
    reopened = ChromaStore.open(store_settings, OTHER)  # the new embedder's collection now
    try:
        assert sorted(c.chunk_id for c in reopened.iter_all()) == ["c_new1", "c_new2"]
    finally:
        reopened.close()


def test_a_rerun_keeps_the_staging_chunks_of_the_same_embedder_and_drops_another(store_settings):
    live = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live.staging(store_settings, IDENTITY), "c_done")
        assert live.staging(store_settings, IDENTITY).count() == 1  # a stopped rebuild, resumed
        assert live.staging(store_settings, OTHER).count() == 0  # another embedder: started again
    finally:
        live.close()


def test_a_switch_stopped_after_the_drop_is_finished_at_the_next_open(store_settings):
    live = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live, "c_old")
        staging = live.staging(store_settings, IDENTITY)
        write(staging, "c_new")
        staging._collection.modify(metadata={**staging.metadata(), REBUILD_COMPLETE_KEY: True})
        live._client.delete_collection(store_settings.collection)  # killed here, before the rename
    finally:
        live.close()
    reopened = ChromaStore.open(store_settings, IDENTITY)
    try:
        assert [c.chunk_id for c in reopened.iter_all()] == ["c_new"]
        assert staging_collection_name(store_settings.collection) not in names(reopened)
    finally:
        reopened.close()


def test_an_incomplete_staging_collection_is_never_switched_to_at_open(store_settings):
    live = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live.staging(store_settings, IDENTITY), "c_partial")
        live._client.delete_collection(store_settings.collection)
    finally:
        live.close()
    reopened = ChromaStore.open(store_settings, IDENTITY)
    try:
        assert reopened.count() == 0  # created empty; the partial staging collection stays for a rerun
        assert staging_collection_name(store_settings.collection) in names(reopened)
    finally:
        reopened.close()


def test_the_probe_writes_reads_and_deletes_a_scratch_chunk(store_settings):
    live = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live, "c_a")
        assert live.probe() == []
        assert [c.chunk_id for c in live.iter_all()] == ["c_a"]
    finally:
        live.close()


def test_another_process_on_the_old_collection_follows_the_switch_through_the_change_log(store_settings):
    if store_settings.mode == "embedded":
        pytest.skip("an embedded store has one process: no other one to follow")
    live = ChromaStore.open(store_settings, IDENTITY)
    replica = ChromaStore.open(store_settings, IDENTITY)
    try:
        write(live, "c_old")
        assert replica.count() == 1
        staging = live.staging(store_settings, IDENTITY)
        write(staging, "c_new1", "c_new2")
        before = live.collection_id
        live.switch_to(staging)
        live.rebuilt(before)
        assert replica.collection_id == before  # still on the dropped one
        assert any(e.pruned_before is not None for e in replica.changes_since(0))
        assert replica.collection_id == live.collection_id
        assert sorted(replica.iter_ids()) == ["c_new1", "c_new2"]
        replica.changes_since(0)  # the marker names the old id: read again, nothing is reopened
        assert replica.collection_id == live.collection_id
    finally:
        replica.close()
        live.close()
