"""Shared test fixtures. Keep these names stable: other test files depend on them.

- `REPO`: the repository root (tests run from anywhere).
- `e5_settings` (session): `ModelsSettings` for the real packaged e5, converted once into
  `<repo>/target/models` (the cache the CLI and CI use: the ~10 s conversion happens once per machine).
- `real_embedder` (session): the loaded e5 `Embedder` (about 3 s after the conversion); share it.
- `tiny_embedder_dir`, `tiny_cross_encoder_dir` (session): folders of tiny random-weight models for plumbing
  tests (see tests/fixtures/tiny_models.py); their scores mean nothing.
- `free_port` (session): a callable, `free_port()` -> a TCP port on 127.0.0.1 nothing listens on right now.
  `find_free_port()` is the same function, importable (`from tests.conftest import find_free_port`).
- `chroma_server` (session): a real `chroma run` server in a temporary directory; yields (host, port).
  Tests sharing it must use their own collection names (they all see one server).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from app.settings import ModelsSettings
from tests.fixtures.processes import chroma_run
from tests.fixtures.tiny_models import tiny_cross_encoder_dir, tiny_embedder_dir  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parents[1]
MODELS_CACHE = REPO / "target" / "models"

# Property tests check values, not speed: on shared cores one example can take past Hypothesis' default
# 200 ms deadline, which would fail a correct test (seen on a loaded machine), so there is no deadline.
hypothesis_settings.register_profile("sieve", deadline=None)
hypothesis_settings.load_profile("sieve")


def find_free_port() -> int:
    """A port the OS just handed out on 127.0.0.1 and we released; another process could take it, but
    binding port 0 is the standard way to get one that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    return find_free_port


@pytest.fixture(scope="session")
def e5_settings() -> ModelsSettings:
    return ModelsSettings(embedder="multilingual-e5-small", cache_dir=str(MODELS_CACHE))


@pytest.fixture(scope="session")
def real_embedder(e5_settings: ModelsSettings):
    from app.models import load_embedder

    return load_embedder(e5_settings)


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`<venv>/bin/chroma run` on a free port, ready when its heartbeat answers (at most 30 s)."""
    host, port = "127.0.0.1", find_free_port()
    with chroma_run(tmp_path_factory.mktemp("chroma-server"), port, host):
        yield host, port
