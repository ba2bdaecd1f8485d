"""`sieve experiment`'s refusals, before any model loads: a bad file (exit 2, the key named), a second
experiment on the same store (the lock file), an embedded store another process holds (exit 3: ask the
server with `--server`; the holder is a real other process holding the lock file, as `sieve serve` does);
and `--server` against a stand-in server (httpx's MockTransport)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.exit_codes import BAD_INPUT, UNAVAILABLE
from app.store.chroma import LOCK_FILE
from tests.fixtures.experiment_data import experiment_data
from tests.fixtures.store_holder import holding, holding_file

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
    assert "is open in `sieve serve` (pid" in err and "listening on http://127.0.0.1:8123" in err
    assert "Ask that server instead: --server http://127.0.0.1:8123" in err
    assert "rag.server.admin_token" in err and "rag.store.mode: http" in err
    assert err.count("\n") == 1


assert LOCK_FILE == "sieve.lock"  # the store lock `holding` takes


def test_server_sends_the_file_waits_for_the_job_and_prints_its_table(
    shell: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import httpx

    import app.cli.client as client_module
    import app.cli.experiment as cli_experiment

    seen: list[tuple[str, str, Any]] = []
    polls = iter(["queued", "running", "done"])

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body))
        if request.url.path == "/api/experiments":
            return httpx.Response(202, json={"job": "j-1"})
        state = next(polls)
        report = (
            {"experiment": experiment_data(), "files": ["/srv/out/experiment.json"]}
            if state == "done"
            else None
        )
        return httpx.Response(200, json={"id": "j-1", "state": state, "report": report, "error": None})

    class Mocked(client_module.SieveClient):
        def __init__(self, url: str, token: str | None = None) -> None:
            super().__init__(url, token, transport=httpx.MockTransport(answer))

    monkeypatch.setattr(client_module, "SieveClient", Mocked)
    monkeypatch.setattr(cli_experiment, "POLL_S", 0.0)
    monkeypatch.setenv("SIEVE_TOKEN", "t0ken-0123456789abc")
    code = main(["experiment", str(shell / "exp.yml"), "--server", "http://127.0.0.1:8080", "--rerun"])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = (shell / "exp.yml").read_text(encoding="utf-8")
    assert seen[0] == ("POST", "/api/experiments", {"experiment": text, "rerun": True})
    assert [s[:2] for s in seen[1:]] == [("GET", "/api/jobs/j-1")] * 3
    assert "small" in out and "Winner: **small**" in out
    assert "experiment (on the server): /srv/out/experiment.json" in out
    assert "experiment: job j-1 on http://127.0.0.1:8080" in err


def test_server_refuses_local_only_flags(shell: Path, capsys) -> None:
    url = "http://127.0.0.1:8080"
    assert main(["experiment", str(shell / "exp.yml"), "--server", url, "--output-dir", "x"]) == BAD_INPUT
    assert main(["experiment", "--clean", "--server", url]) == BAD_INPUT
    assert "with --server give an experiment FILE only" in capsys.readouterr().err
