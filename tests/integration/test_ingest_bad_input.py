"""Ingest of hostile folders into a real embedded Chroma: every problem is in the report, nothing raises
half-way, nothing outside the folder is read unless `rag.ingest.follow_symlinks` says so.

The tiny random embedder stands in for e5 (only the plumbing is under test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.ingest.pipeline import Ingestor
from app.models import load_embedder
from app.settings import IngestSettings, ModelsSettings, StoreSettings
from app.store import ChromaStore

pytestmark = pytest.mark.integration

DEEP = 100_000


@pytest.fixture(scope="module")
def tiny_embedder(tiny_embedder_dir):
    return load_embedder(ModelsSettings(embedder=str(tiny_embedder_dir)))


@pytest.fixture
def store(tmp_path: Path, tiny_embedder):
    opened = ChromaStore.open(StoreSettings(path=str(tmp_path / "chroma")), tiny_embedder.identity())
    yield opened
    opened.close()


def ingestor(store: ChromaStore, embedder, follow_symlinks: bool = False) -> Ingestor:
    return Ingestor(store, embedder, IngestSettings(paths=[], follow_symlinks=follow_symlinks))


def hostile_folder(root: Path) -> Path:
    """Good files around bad entries (a link loop, links out of the folder, a too-deep JSON line, a reserved
    key), sorted so that bad ones come between."""
    kb = root / "kb"
    (kb / "sub").mkdir(parents=True)
    (root / "outside").mkdir()
    (root / "outside" / "private.md").write_text("# Private\n\nthe outside secret\n", encoding="utf-8")
    (kb / "a.md").write_text("# A\n\nalpha text\n", encoding="utf-8")
    os.symlink("b-loop.md", kb / "b-loop.md")
    os.symlink(root / "outside" / "private.md", kb / "c-private.md")
    os.symlink(root / "outside", kb / "d-outside")
    lines = [
        json.dumps({"id": "e1", "text": "echo one"}),
        "[" * DEEP + "]" * DEEP,
        json.dumps({"id": "e3", "text": "echo three", "#document": "x"}),
        json.dumps({"id": "e4", "text": "echo four"}),
    ]
    (kb / "e.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (kb / "sub" / "z.md").write_text("# Z\n\nzulu text\n", encoding="utf-8")
    return kb


def stored(store: ChromaStore) -> dict[str, str]:
    return {c.metadata["doc_id"]: c.text for c in store.iter_all()}


def test_a_hostile_folder_is_reported_file_by_file_and_the_good_files_are_ingested(
    tmp_path: Path, store: ChromaStore, tiny_embedder
) -> None:
    kb = hostile_folder(tmp_path)
    report = ingestor(store, tiny_embedder).ingest([kb])
    assert sorted(stored(store)) == ["a", "e1", "e4", "sub/z"]
    assert [str(e) for e in report.errors] == [
        f"{kb / 'b-loop.md'}: symbolic link loop (the link leads back to itself)",
        f"{kb / 'c-private.md'}: symbolic link not followed "
        f"(it points to {tmp_path / 'outside' / 'private.md'}); "
        "set rag.ingest.follow_symlinks: true to read links",
        f"{kb / 'd-outside'}: symbolic link not followed (it points to {tmp_path / 'outside'}); "
        "set rag.ingest.follow_symlinks: true to read links",
        f"{kb / 'e.jsonl'}:2: invalid JSON: nested too deeply to read",
        f"{kb / 'e.jsonl'}:3: field '#document': metadata key '#document' is reserved by the store "
        "(keys may not start with '#', '$', 'chroma:')",
    ]
    assert "outside secret" not in " ".join(stored(store).values())
    assert (report.documents, report.added) == (4, 4)

    # a second run changes nothing and still reports the same problems (the loop never crashes the
    # deletion check that runs after the writes)
    again = ingestor(store, tiny_embedder).ingest([kb])
    assert (again.added, again.deleted, len(again.errors)) == (0, 0, 5)


def test_follow_symlinks_reads_the_links_and_still_reports_the_loop(
    tmp_path: Path, store: ChromaStore, tiny_embedder
) -> None:
    kb = hostile_folder(tmp_path)
    report = ingestor(store, tiny_embedder, follow_symlinks=True).ingest([kb])
    assert sorted(stored(store)) == ["a", "c-private", "d-outside/private", "e1", "e4", "sub/z"]
    assert [e.path for e in report.errors] == [
        str(kb / "b-loop.md"),
        str(kb / "e.jsonl"),
        str(kb / "e.jsonl"),
    ]


def test_a_file_replaced_by_a_loop_keeps_its_chunks_and_nothing_raises(
    tmp_path: Path, store: ChromaStore, tiny_embedder
) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.md").write_text("# A\n\nalpha\n", encoding="utf-8")
    (kb / "b.md").write_text("# B\n\nbravo\n", encoding="utf-8")
    ingestor(store, tiny_embedder).ingest([kb])
    (kb / "b.md").unlink()
    os.symlink("b.md", kb / "b.md")
    report = ingestor(store, tiny_embedder).ingest([kb])
    assert [str(e) for e in report.errors] == [
        f"{kb / 'b.md'}: symbolic link loop (the link leads back to itself)"
    ]
    assert sorted(stored(store)) == ["a", "b"]  # a bad file keeps what it had in the index
    assert report.deleted == 0
