"""`sieve experiment`'s refusals, before any model loads: a bad file (exit 2, the key named), a second
experiment on the same store (the lock file), and an embedded store another process holds (exit 3, what to
do). The holder is a real other process holding the lock file (`flock`), as `sieve serve` does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.cli import main
from app.exit_codes import BAD_INPUT, UNAVAILABLE
from app.store.chroma import LOCK_FILE
from tests.unit.test_cli_store_held import holding

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "chroma"))
    monkeypatch.setenv("RAG__EXPERIMENT__CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "exp.yml").write_text("variants:\n  small: {rag.ingest.chunk_size: 300}\n", encoding="utf-8")

    def no_model(settings):
        raise AssertionError("no model may load before the refusal")

    for where in (
        "app.service.load_embedder",
        "app.models.load_embedder",
        "app.experiment.run.load_embedder",
    ):
        monkeypatch.setattr(where, no_model)
    return tmp_path


def test_a_misspelt_key_exits_2_naming_it(shell: Path, capsys) -> None:
    (shell / "bad.yml").write_text("variants:\n  a: {rag.chain.bm25.enabeld: false}\n", encoding="utf-8")
    assert main(["experiment", str(shell / "bad.yml")]) == BAD_INPUT
    err = capsys.readouterr().err
    assert (
        "variant 'a': unknown settings key 'rag.chain.bm25.enabeld'; did you mean rag.chain.bm25.enabled?"
        in err
    )


def test_file_and_clean_go_alone(shell: Path, capsys) -> None:
    assert main(["experiment"]) == BAD_INPUT
    assert main(["experiment", str(shell / "exp.yml"), "--clean"]) == BAD_INPUT
    assert "give an experiment FILE, or --clean" in capsys.readouterr().err


def test_a_second_experiment_on_the_store_is_refused(shell: Path, capsys) -> None:
    (shell / "chroma").mkdir()
    with holding_file(shell / "chroma" / "experiment.lock"):
        assert main(["experiment", str(shell / "exp.yml")]) == BAD_INPUT
    err = capsys.readouterr().err
    assert "another experiment (pid" in err and "is running on this store" in err


def test_an_embedded_store_held_by_another_process_says_what_to_do(shell: Path, capsys) -> None:
    with holding(shell / "chroma", "http://127.0.0.1:8123"):
        assert main(["experiment", str(shell / "exp.yml")]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert "is open in another process" in err and "listening on http://127.0.0.1:8123" in err
    assert "`sieve experiment --server` is not available yet" in err
    assert "rag.store.mode: http" in err


class holding_file:
    """Another process holding the lock file at `path` (the helper of test_cli_store_held, on any file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        import subprocess
        import sys

        from tests.unit.test_cli_store_held import HOLD

        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"

    def __exit__(self, *exc: object) -> None:
        self.proc.communicate(timeout=10)


assert LOCK_FILE == "sieve.lock"  # the store lock `holding` takes
