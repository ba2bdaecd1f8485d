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

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import ModelsSettings
from tests.fixtures.tiny_models import tiny_cross_encoder_dir, tiny_embedder_dir  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parents[1]
MODELS_CACHE = REPO / "target" / "models"
CHROMA_START_TIMEOUT_S = 30.0
CHROMA_STOP_TIMEOUT_S = 10.0


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
    data = tmp_path_factory.mktemp("chroma-server")
    log_path = data / "server.log"
    chroma = Path(sys.executable).with_name("chroma")
    cmd = [str(chroma), "run", "--path", str(data / "db"), "--host", host, "--port", str(port)]
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    with log_path.open("wb") as log:  # a file, not a pipe: a full pipe would block the server
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for_heartbeat(proc, f"http://{host}:{port}/api/v2/heartbeat", log_path)
        yield host, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=CHROMA_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_heartbeat(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + CHROMA_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chroma run exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(
        f"chroma run did not answer {url} within {CHROMA_START_TIMEOUT_S:.0f}s:\n{_tail(log_path)}"
    )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"
