"""Fixtures the integration modules share (pytest injects them by name; a module's own fixture of the same
name takes precedence).

- `sieve` (module): a real Sieve (packaged e5, no reranker) over a seeded copy of the sample base's store,
  with the settings of tests/fixtures/api_app.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.service import Sieve
from app.store import ChromaStore
from tests.fixtures.api_app import make_settings
from tests.fixtures.seeded_store import seeded_store


@pytest.fixture(scope="module")
def sieve(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[Sieve]:
    base = tmp_path_factory.mktemp("api")
    store_path = seeded_store(base / "store")
    settings = make_settings(store_path, base / "unused-eval")
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    built = Sieve(settings, real_embedder, store, reranker=None)
    assert built.store.count() > 0
    yield built
    built.close()
