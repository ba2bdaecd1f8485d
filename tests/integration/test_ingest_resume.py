"""A `sieve ingest` killed with -9 mid-ingest keeps the batches it committed; the rerun embeds only the rest.

Ingest stores new chunks in committed batches of `rag.ingest.commit_chunks`. The tiny random
embedder stands in for e5 (plumbing only), one passage per model call so the ingest lasts long enough to be
killed in the middle; the CLI's progress bar (stderr, a file here) says how far it got.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.models import load_embedder
from app.settings import ModelsSettings, StoreSettings
from app.store import ChromaStore
from tests.fixtures.tiny_models import TINY_WORDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SIEVE = Path(sys.executable).with_name("sieve")
DOCUMENTS = 1200
COMMIT = 50
BAR = re.compile(r"(\d+)/(\d+) \[")
SUMMARY = re.compile(r"chunks=(\d+) added=(\d+) updated=(\d+) unchanged=(\d+)")


def write_corpus(folder: Path) -> Path:
    rng = random.Random(11)
    folder.mkdir()
    with (folder / "docs.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(DOCUMENTS):
            words = " ".join(rng.choice(TINY_WORDS) for _ in range(40))
            fh.write(json.dumps({"id": f"d{i}", "title": f"doc {i}", "text": words}) + "\n")
    return folder


def env_for(store: Path, embedder_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__")}
    return env | {
        "RAG__STORE__PATH": str(store),
        "RAG__MODELS__EMBEDDER": str(embedder_dir),
        "RAG__MODELS__BATCH_SIZE": "1",
        "RAG__INGEST__COMMIT_CHUNKS": str(COMMIT),
        "PYTHONPATH": str(REPO),
    }


def stored_count(store: Path, embedder_dir: Path) -> int:
    embedder = load_embedder(ModelsSettings(embedder=str(embedder_dir)))
    opened = ChromaStore.open(StoreSettings(path=str(store)), embedder.identity())
    try:
        return opened.count()
    finally:
        opened.close()


def test_kill_9_mid_ingest_then_the_rerun_embeds_only_what_is_missing(tmp_path, tiny_embedder_dir) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    store = tmp_path / "store"
    env = env_for(store, tiny_embedder_dir)
    err_path = tmp_path / "first.err"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [str(SIEVE), "ingest", str(corpus)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    deadline = time.monotonic() + 300
    embedded = 0
    while embedded < 3 * COMMIT + COMMIT // 2:
        assert proc.poll() is None, f"ingest ended before it could be killed:\n{err_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, err_path.read_text()[-2000:]
        time.sleep(0.05)
        found = BAR.findall(err_path.read_text(errors="replace"))
        embedded = int(found[-1][0]) if found else 0
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    total = int(BAR.findall(err_path.read_text(errors="replace"))[-1][1])
    assert total == DOCUMENTS  # one chunk a document

    committed = stored_count(store, tiny_embedder_dir)
    assert committed >= 3 * COMMIT  # every batch finished before the kill is stored
    assert committed % COMMIT == 0  # and each is stored whole or not at all
    assert committed < DOCUMENTS

    rerun = subprocess.run(
        [str(SIEVE), "ingest", str(corpus)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    chunks, added, updated, unchanged = map(int, SUMMARY.search(rerun.stdout).groups())  # type: ignore[union-attr]
    assert (chunks, added, updated, unchanged) == (DOCUMENTS, DOCUMENTS - committed, 0, committed)
    assert stored_count(store, tiny_embedder_dir) == DOCUMENTS
