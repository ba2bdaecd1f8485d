"""Bounds on a document's metadata before anything is written: `rag.ingest.max_metadata_*` on the files a run
ingests (an error naming the file and line, the other documents kept), and the store's own limit on any chunk,
whatever path it came by."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.ingest.loaders import load_paths
from app.ingest.pipeline import Ingestor
from app.settings import IngestSettings
from app.store import StoreError, store_metadata_problem
from app.store.chroma import STORE_MAX_METADATA_KEYS, _refuse_wide_metadata


def pipeline(**settings: object) -> Ingestor:
    return Ingestor(store=None, embedder=None, settings=IngestSettings(**settings))  # type: ignore[arg-type]


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_wide_jsonl_line_is_refused_naming_file_and_line_and_the_others_are_kept(tmp_path: Path) -> None:
    wide = ", ".join(f'"k{i}": {i}' for i in range(6000))
    file = write_jsonl(
        tmp_path / "docs.jsonl",
        [
            '{"id": "ok-1", "text": "fine"}',
            f'{{"id": "wide", "text": "x", {wide}}}',
            '{"id": "ok-2", "text": "also"}',
        ],
    )
    loaded = load_paths([file])
    kept, errors = pipeline().split_too_long(loaded.documents)
    assert [d.doc_id for d in kept] == ["ok-1", "ok-2"]
    (error,) = errors
    assert (error.path, error.line) == (str(file), 2)
    # 6,000 keys plus the source the loader adds
    assert (
        "document 'wide' has 6000 metadata keys, more than rag.ingest.max_metadata_keys=64" in error.message
    )


def test_front_matter_keys_their_length_and_their_bytes_are_bounded(tmp_path: Path) -> None:
    many = "".join(f"k{i}: v\n" for i in range(10))
    (tmp_path / "many.md").write_text(f"---\n{many}---\n# Title\nbody\n", encoding="utf-8")
    (tmp_path / "long.md").write_text(f"---\n{'k' * 200}: v\n---\nbody\n", encoding="utf-8")
    (tmp_path / "heavy.md").write_text(f"---\nnote: {'é' * 300}\n---\nbody\n", encoding="utf-8")
    loaded = load_paths([tmp_path])
    bounds = {"max_metadata_keys": 8, "max_metadata_key_chars": 128, "max_metadata_bytes": 500}
    kept, errors = pipeline(**bounds).split_too_long(loaded.documents)
    assert kept == []
    messages = {Path(e.path).name: e.message for e in errors}
    assert "has 11 metadata keys, more than rag.ingest.max_metadata_keys=8" in messages["many.md"]  # + source
    assert "has a metadata key of 200 characters" in messages["long.md"]
    # "note" (4) + 300 × "é" (2 bytes each) + "source" (6) + "heavy.md" (8)
    assert f"has {4 + 300 * 2 + 6 + 8} bytes of metadata" in messages["heavy.md"]


def test_the_store_refuses_a_chunk_past_its_own_limit_before_anything_is_written() -> None:
    fine = {f"k{i}": i for i in range(STORE_MAX_METADATA_KEYS)}
    assert store_metadata_problem("c1", fine) is None
    wide = {**fine, "one-more": 1}
    problem = store_metadata_problem("c2", wide)
    assert problem == (
        f"chunk 'c2' carries {STORE_MAX_METADATA_KEYS + 1} metadata keys, more than the store takes "
        f"({STORE_MAX_METADATA_KEYS}): refused before it reaches Chroma"
    )
    with pytest.raises(StoreError, match="chunk 'c2' carries 1001 metadata keys"):
        _refuse_wide_metadata([("c1", fine), ("c2", wide)])
