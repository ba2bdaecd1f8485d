"""A local `sieve query` / `sieve eval` whose embedded store another process holds (a running `sieve serve`)
fails at once, before any model loads: one line, exit 3, suggesting `--server` at the address the holder
recorded with its lock (`sieve serve` records where it listens), else at this shell's rag.server address.

The holder is a real other process holding the store's lock file (`flock`), as `sieve serve` does; the one
tests/integration/test_cli_server.py starts is a real `sieve serve`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.exit_codes import UNAVAILABLE
from app.store.chroma import LOCK_FILE, StoreLockedError
from tests.fixtures.store_holder import holding

REPO = Path(__file__).resolve().parents[2]
SIEVE = Path(sys.executable).with_name("sieve")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "chroma"


@pytest.fixture
def holder(store: Path) -> Iterator[subprocess.Popen[str]]:
    """A holder that recorded no address (a `sieve serve` still starting, or any other command)."""
    with holding(store) as proc:
        yield proc


@pytest.fixture
def env(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__") or n.startswith("SIEVE_")]:
        monkeypatch.delenv(name)
    values = {
        "RAG__STORE__PATH": str(store),
        "RAG__EVALUATE__OUTPUT_DIR": str(tmp_path / "reports"),
        "RAG__SERVER__PORT": "8010",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def held_message(store: Path, pid: int, command: str) -> str:
    url = "http://127.0.0.1:8010"
    token = ", with its rag.server.admin_token (in $SIEVE_TOKEN or this shell's settings)"
    return (
        f"error: the embedded store {store} is open in another process (pid {pid}), and it allows one "
        f"process at a time. If that is `sieve serve`, ask it instead: --server {url} "
        f"(or SIEVE_SERVER={url}){token if command == 'eval' else ''}; otherwise stop it, or share the store "
        "through a Chroma server (rag.store.mode: http)\n"
    )


def no_models(*args: object, **kwargs: object) -> None:
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize("argv", [["query", "工资什么时候发"], ["eval"], ["eval", "--top-k", "3"]])
def test_a_held_store_fails_before_any_model_loads(
    argv: list[str],
    env: dict[str, str],
    store: Path,
    holder: subprocess.Popen[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("app.service.load_embedder", no_models)
    monkeypatch.setattr("app.service.load_reranker", no_models)
    assert main(argv) == UNAVAILABLE
    out, err = capsys.readouterr()
    assert (out, err) == ("", held_message(store, holder.pid, argv[0]))
    assert (store / LOCK_FILE).read_text() == str(holder.pid)  # the check took nothing from the holder


def test_commands_without_server_keep_the_store_message(
    env: dict[str, str],
    store: Path,
    holder: subprocess.Popen[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("app.service.load_embedder", no_models)
    assert main(["golden", "check"]) == UNAVAILABLE
    _, err = capsys.readouterr()
    assert err.startswith(f"error: the embedded store {store} is already open in another process (pid ")
    assert "--server" not in err and err.count("\n") == 1


def test_the_sieve_command_prints_that_one_line_and_nothing_else(
    env: dict[str, str], store: Path, holder: subprocess.Popen[str]
) -> None:
    done = subprocess.run(
        [str(SIEVE), "query", "工资什么时候发"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        UNAVAILABLE,
        "",
        held_message(store, holder.pid, "query"),
    )


@pytest.mark.parametrize(
    ("recorded", "url"),
    [
        ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
        ("http://0.0.0.0:8124", "http://127.0.0.1:8124"),  # a server on every interface is asked here
        ("http://[::1]:8125", "http://[::1]:8125"),
    ],
)
@pytest.mark.parametrize("command", ["query", "eval"])
def test_the_hint_names_the_address_the_server_recorded_with_its_lock(
    recorded: str,
    url: str,
    command: str,
    env: dict[str, str],
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("app.service.load_embedder", no_models)
    token = ", with its rag.server.admin_token (in $SIEVE_TOKEN or this shell's settings)"
    with holding(store, recorded) as proc:
        assert main([command, "工资什么时候发"] if command == "query" else [command]) == UNAVAILABLE
    _, err = capsys.readouterr()
    assert err == (
        f"error: the embedded store {store} is open in `sieve serve` (pid {proc.pid}, listening on "
        f"{recorded}), and it allows one process at a time. Ask that server instead: --server {url} "
        f"(or SIEVE_SERVER={url}){token if command == 'eval' else ''}; otherwise stop it, or share the store "
        "through a Chroma server (rag.store.mode: http)\n"
    )
    assert "8010" not in err  # this shell's rag.server.port is not where that server listens


def test_a_store_held_by_sieve_serve_names_its_address_to_commands_without_server() -> None:
    error = StoreLockedError(Path("/data/chroma"), "4242", "http://127.0.0.1:8010")
    assert str(error).startswith(
        "the embedded store /data/chroma is already open in `sieve serve` (pid 4242, listening on "
        "http://127.0.0.1:8010). Chroma's embedded mode allows one process per path: stop the other process"
    )
