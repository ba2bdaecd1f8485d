"""A title change re-embeds: the title is part of every chunk's embedded text, so it is part of its id.

Real e5 embedder, real embedded Chroma."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.ingest.chunker import chunk_document, embedding_text
from app.ingest.loaders import load_paths
from app.ingest.pipeline import Ingestor
from app.settings import IngestSettings, StoreSettings
from app.store import ChromaStore
from tests.fixtures.embedders import CountingEmbedder

pytestmark = pytest.mark.integration

DOC = """---
id: doc-a
title: {title}
knowledge: support
---

# Returns handbook

## Refunds

A refund is paid to the card used for the order within 5 days.

## Shipping

Return shipping is free for orders over 50.
"""


def test_reingesting_with_only_a_new_title_gives_new_ids_and_vectors_of_the_new_text(
    tmp_path: Path, real_embedder
) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    page = kb / "a.md"
    store = ChromaStore.open(StoreSettings(path=str(tmp_path / "chroma")), real_embedder.identity())
    try:
        embedder = CountingEmbedder(real_embedder)
        ingestor = Ingestor(store, embedder, IngestSettings(paths=[]))
        page.write_text(DOC.format(title="Returns handbook"), encoding="utf-8")
        first = ingestor.ingest([kb])
        old_ids = {c.chunk_id for c in store.iter_all(include_text=False)}
        assert (first.added, len(old_ids)) == (2, 2)

        page.write_text(DOC.format(title="Refunds and returns guide"), encoding="utf-8")
        embedder.embedded.clear()
        second = ingestor.ingest([kb])

        (doc,) = load_paths([kb]).documents
        settings = ingestor.settings
        chunks = chunk_document(doc, settings.chunk_size, settings.chunk_overlap, settings.min_chunk_chars)
        new_texts = [embedding_text(c, doc.title) for c in chunks]
        assert all(t.startswith("Refunds and returns guide › Returns handbook › ") for t in new_texts)
        assert (second.added, second.deleted, second.unchanged) == (2, 2, 0)
        assert embedder.embedded == new_texts  # re-embedded, with the new title
        stored = store.get([c.chunk_id for c in chunks], include_embeddings=True)
        assert {c.chunk_id for c in stored} == {c.chunk_id for c in chunks}
        assert not {c.chunk_id for c in stored} & old_ids  # the old ids (and vectors) are gone
        assert store.count() == 2
        assert {c.metadata["title"] for c in stored} == {"Refunds and returns guide"}
        expected = real_embedder.embed_passages(new_texts)
        got = np.stack([c.embedding for c in stored])
        np.testing.assert_allclose(got, expected, atol=1e-6)  # Chroma keeps float32
    finally:
        store.close()
