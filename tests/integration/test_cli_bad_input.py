"""`sieve ingest` and `sieve eval` given hostile files: exit 2 with lines naming file and line, never a
traceback or exit 1 (the "gate failed" code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.settings import load_settings, merge, nested
from app.store import ChromaStore
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SIEVE = Path(sys.executable).with_name("sieve")
EXIT_INPUT = 2
EXIT_OK = 0
DEEP = 100_000


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_store(tmp_path_factory.mktemp("cli-bad-input") / "store")


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, store_path: Path, tmp_path: Path, real_embedder) -> None:
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    for name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(store_path))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(tmp_path / "eval"))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setattr("app.service.load_embedder", lambda _: real_embedder)


def doc_ids(store_path: Path, real_embedder) -> set[str]:
    settings = load_settings(merge(nested("rag.store.path", str(store_path))))
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    try:
        return {c.metadata["doc_id"] for c in store.iter_all(include_text=False)}
    finally:
        store.close()


def test_ingest_of_a_hostile_folder_exits_2_naming_every_bad_file_and_keeps_the_good_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_path: Path, real_embedder
) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "good.md").write_text("---\nid: robust-good\n---\n# Good\n\nA good document.\n", encoding="utf-8")
    os.symlink("loop.md", kb / "loop.md")
    os.symlink("/etc/hostname", kb / "hostname.txt")
    lines = [
        json.dumps({"id": "robust-line-1", "text": "first line"}),
        "[" * DEEP + "]" * DEEP,
        json.dumps({"id": "robust-line-3", "text": "third", "chroma:document": "x"}),
    ]
    (kb / "lines.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    code = main(["ingest", str(kb)])
    out, err = capsys.readouterr()
    assert code == EXIT_INPUT
    assert "Traceback" not in err and "RecursionError" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {kb / 'hostname.txt'}: symbolic link not followed (it points to /etc/hostname); "
        "set rag.ingest.follow_symlinks: true to read links",
        f"error: {kb / 'lines.jsonl'}:2: invalid JSON: nested too deeply to read",
        f"error: {kb / 'lines.jsonl'}:3: field 'chroma:document': metadata key 'chroma:document' is reserved "
        "by the store (keys may not start with '#', '$', 'chroma:')",
        f"error: {kb / 'loop.md'}: symbolic link loop (the link leads back to itself)",
    ]
    assert "errors=4" in out
    ids = doc_ids(store_path, real_embedder)
    assert {"robust-good", "robust-line-1"} <= ids
    assert "robust-line-3" not in ids and "hostname" not in ids


def test_ingest_loads_the_query_model_untraced_and_no_exact_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_embedder
) -> None:
    # `sieve ingest` makes no query: it skips the trace and the read of every vector, and their seconds
    asked = []
    monkeypatch.setattr("app.service.load_embedder", lambda models: asked.append(models) or real_embedder)
    limits = []
    load_exact = ChromaStore.load_exact
    monkeypatch.setattr(
        ChromaStore,
        "load_exact",
        lambda self, limit, *held: limits.append(limit) or load_exact(self, limit, *held),
    )
    (tmp_path / "one.md").write_text("---\nid: cli-untraced\n---\n# One\n\nA document.\n", encoding="utf-8")

    assert main(["ingest", str(tmp_path / "one.md")]) == EXIT_OK
    assert [m.trace_queries for m in asked] == [False]
    assert limits == [0]


def test_eval_with_a_too_deep_golden_set_line_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    golden = tmp_path / "golden.jsonl"
    case = {"id": "q1", "query": "工资什么时候发", "expectedDocIds": ["hr-payroll-zh"]}
    golden.write_text(
        json.dumps(case, ensure_ascii=False) + "\n" + "[" * DEEP + "]" * DEEP + "\n", encoding="utf-8"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAG__") and k not in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN")
    }
    env |= {"RAG__MODELS__CACHE_DIR": str(MODELS_CACHE), "RAG__EVALUATE__OUTPUT_DIR": str(tmp_path / "eval")}
    done = subprocess.run(
        [str(SIEVE), "eval", "--golden-set", str(golden)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_INPUT, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[:2] == [
        f"error: invalid golden set {golden} (1 error):",
        f"  - {golden}:2: invalid JSON: nested too deeply to read",
    ]
