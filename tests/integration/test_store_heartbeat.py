"""`ChromaStore.heartbeat()`, what /ready asks: embedded and a real `chroma run`, up and gone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.settings import StoreSettings
from app.store import ChromaStore, StoreUnavailableError
from app.store.chroma import HEARTBEAT_TIMEOUT_S
from tests.conftest import find_free_port
from tests.fixtures.processes import chroma_run, stop_process

pytestmark = pytest.mark.integration

IDENTITY = {"name": "heartbeat-test", "dimension": 2, "checksum": "0"}


def test_an_embedded_store_answers_its_heartbeat(tmp_path: Path) -> None:
    store = ChromaStore.open(StoreSettings(path=str(tmp_path / "chroma")), IDENTITY)
    try:
        store.heartbeat()
    finally:
        store.close()


def test_a_chroma_server_heartbeat_fails_fast_once_the_server_is_gone(tmp_path: Path) -> None:
    port = find_free_port()
    settings = StoreSettings(mode="http", host="127.0.0.1", port=port, collection="heartbeat-test")
    with chroma_run(tmp_path, port) as server:
        store = ChromaStore.open(settings, IDENTITY)
        store.heartbeat()
        stop_process(server)
        start = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            store.heartbeat()
        assert time.monotonic() - start < HEARTBEAT_TIMEOUT_S + 0.5
    assert str(info.value).startswith(
        f"Chroma server at http://127.0.0.1:{port} is unreachable: ConnectError"
    )


def test_a_server_that_never_answers_fails_the_heartbeat_after_the_timeout() -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = ChromaStore(
            None, None, "silent server", heartbeat_url=f"http://127.0.0.1:{port}/api/v2/heartbeat"
        )
        start = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="^silent server is unreachable: ReadTimeout"):
            store.heartbeat()
        took = time.monotonic() - start
    assert HEARTBEAT_TIMEOUT_S - 0.1 <= took < HEARTBEAT_TIMEOUT_S + 1.0
