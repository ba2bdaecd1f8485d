"""Invalid chain-stage settings stop `sieve eval` and `sieve query` with exit 2 naming the key, before
any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main

REPO = Path(__file__).resolve().parents[2]
EXIT_INPUT = 2
BAD_WEIGHTS = {"RAG__CHAIN__BM25__DENSE_WEIGHT": "0", "RAG__CHAIN__BM25__BM25_WEIGHT": "0"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith("RAG__") or name == "SIEVE_CONFIG":
            monkeypatch.delenv(name)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))  # never touched: loading fails first


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("a model was loaded before the settings were checked")


@pytest.mark.parametrize("argv", [["eval"], ["query", "工资什么时候发"]])
def test_invalid_stage_settings_exit_2_naming_the_key_before_loading_models(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    monkeypatch.setattr("app.service.load_embedder", _no_model)
    monkeypatch.setattr("app.service.load_reranker", _no_model)
    for name, value in BAD_WEIGHTS.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == EXIT_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert "environment variable RAG__CHAIN__BM25__BM25_WEIGHT: 'rag.chain.bm25.bm25_weight'" in err
    assert "dense_weight and bm25_weight are both 0" in err
    assert "Traceback" not in err
    assert not (tmp_path / "store").exists()


def test_the_real_command_fails_fast_without_a_traceback() -> None:
    env = {**os.environ, **BAD_WEIGHTS, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "app", "eval"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == EXIT_INPUT, done.stderr
    assert "'rag.chain.bm25.bm25_weight'" in done.stderr
    assert "Traceback" not in done.stderr
    # Loading the e5 model alone takes several seconds; failing at settings load takes about one.
    assert elapsed < 10, elapsed
