"""A document's access scope as the loaders read it (front matter, JSONL, BEIR lines), the per-path defaults
(`rag.ingest.access_defaults`), and the chunker keeping `access` a list on every chunk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.ingest.chunker import chunk_document
from app.ingest.loaders import load_paths, with_default_scope
from app.ingest.types import Document
from app.settings import AccessDefault


def write(path: Path, content: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def markdown(doc_id: str, front: str = "") -> str:
    return f"---\nid: {doc_id}\ntitle: {doc_id}\n{front}---\n\nSalaries are paid on the 25th.\n"


def scope_of(doc: Document) -> tuple[Any, Any]:
    return doc.metadata.get("tenant"), doc.metadata.get("access")


@pytest.mark.parametrize(
    ("front", "tenant", "access"),
    [
        ("tenant: acme\naccess: [group:hr, user:ann]\n", "acme", ["group:hr", "user:ann"]),
        ("access:\n  - public\n", None, ["public"]),
        ("access: group:hr\n", None, ["group:hr"]),  # a lone string is one entry
        ('access: "group:hr,group:sales"\n', None, ["group:hr,group:sales"]),  # never split at commas
        ("access: [group:hr, group:hr]\n", None, ["group:hr"]),
        ("access: []\n", None, None),
        ("tenant: acme\n", "acme", None),
        ("", None, None),
    ],
)
def test_front_matter_scope(tmp_path: Path, front: str, tenant: str | None, access: list[str] | None) -> None:
    write(tmp_path / "kb" / "pay.md", markdown("pay", front))
    result = load_paths([tmp_path / "kb"])
    assert result.errors == []
    (doc,) = result.documents
    assert scope_of(doc) == (tenant, access)


@pytest.mark.parametrize("id_key", ["id", "_id"])  # `_id`: a BEIR corpus line
@pytest.mark.parametrize(
    ("fields", "tenant", "access"),
    [
        ({"tenant": "acme", "access": ["group:hr", "public"]}, "acme", ["group:hr", "public"]),
        ({"access": "group:hr,group:sales"}, None, ["group:hr,group:sales"]),
        ({"access": None, "tenant": None}, None, None),
        ({"tags": ["a", "b"]}, None, None),
    ],
)
def test_jsonl_and_beir_scope(
    tmp_path: Path, id_key: str, fields: dict[str, Any], tenant: str | None, access: list[str] | None
) -> None:
    line = {id_key: "d1", "title": "Pay", "text": "Salaries are paid on the 25th.", **fields}
    write(tmp_path / "corpus.jsonl", json.dumps(line) + "\n")
    result = load_paths([tmp_path / "corpus.jsonl"])
    assert result.errors == []
    (doc,) = result.documents
    assert scope_of(doc) == (tenant, access)
    if "tags" in fields:  # other lists are still comma-joined
        assert doc.metadata["tags"] == "a,b"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tenant": 5}, "field 'tenant': 'tenant' must be a string, got int"),
        ({"tenant": ""}, "field 'tenant': 'tenant' is empty"),
        ({"access": 7}, "field 'access': 'access' must be a list of strings, got int"),
        ({"access": ["public", 1]}, "field 'access': 'access' entry 1 must be a string, got int"),
        ({"access": ["public", {"g": 1}]}, "field 'access': 'access' entry 1 must be a string, got dict"),
        ({"access": [" group:hr"]}, "field 'access': 'access' entry 0 ' group:hr' has spaces around it"),
    ],
)
def test_a_bad_scope_in_jsonl_names_file_line_and_field(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    good = {"id": "ok", "text": "fine"}
    bad = {"id": "bad", "text": "Salaries.", **fields}
    path = write(tmp_path / "corpus.jsonl", json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    result = load_paths([path])
    assert [d.doc_id for d in result.documents] == ["ok"]
    assert [str(e) for e in result.errors] == [f"{path}:2: {message}"]


@pytest.mark.parametrize(
    ("front", "line", "message"),
    [
        ("tenant: 12\n", 4, "front matter key 'tenant': 'tenant' must be a string, got int"),
        (
            "owner: x\naccess: [public, 3]\n",
            5,
            "front matter key 'access': 'access' entry 1 must be a string, got int",
        ),
        (
            "access: {group: hr}\n",
            4,
            "front matter key 'access': 'access' must be a list of strings, got dict",
        ),
        (
            "access: [[group:hr]]\n",
            4,
            "front matter key 'access': 'access' entry 0 must be a string, got list",
        ),
    ],
)
def test_a_bad_scope_in_front_matter_names_file_line_and_field(
    tmp_path: Path, front: str, line: int, message: str
) -> None:
    path = write(tmp_path / "kb" / "pay.md", markdown("pay", front))
    result = load_paths([tmp_path / "kb"])
    assert result.documents == []
    assert [str(e) for e in result.errors] == [f"{path}:{line}: {message}"]


# -- rag.ingest.access_defaults ------------------------------------------------------------------------------


def test_the_longest_matching_default_applies_and_a_documents_own_fields_win(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "general.md", markdown("general"))
    write(kb / "hr" / "pay.md", markdown("pay"))
    write(kb / "hr" / "board" / "bonus.md", markdown("bonus"))
    write(kb / "hr" / "own.md", markdown("own", "tenant: globex\naccess: [user:ann]\n"))
    write(kb / "hr" / "half.md", markdown("half", "access: [group:sales]\n"))
    write(kb / "hrx" / "near.md", markdown("near"))  # "hrx" is not below "hr"
    lines = [
        {"id": "line-own", "text": "x", "access": ["user:bob"]},
        {"id": "line-bare", "text": "y"},
    ]
    write(kb / "hr" / "lines.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    defaults = [
        AccessDefault(path=str(kb), tenant="acme", access=["public"]),
        AccessDefault(path=str(kb / "hr" / "board"), tenant="acme", access=["group:board"]),
        AccessDefault(path=str(kb / "hr") + "/", tenant="acme", access=["group:hr"]),  # a trailing slash
    ]
    result = load_paths([kb], access_defaults=defaults)
    assert result.errors == []
    assert {d.doc_id: scope_of(d) for d in result.documents} == {
        "general": ("acme", ["public"]),
        "pay": ("acme", ["group:hr"]),
        "bonus": ("acme", ["group:board"]),
        "own": ("globex", ["user:ann"]),
        "half": ("acme", ["group:sales"]),  # its own access, the default's tenant
        "near": ("acme", ["public"]),
        "line-own": ("acme", ["user:bob"]),
        "line-bare": ("acme", ["group:hr"]),
    }


def test_the_longest_default_wins_whatever_the_order_or_spelling_of_the_paths(tmp_path: Path) -> None:
    doc = Document("d", "text", "d", {}, origin=str(tmp_path / "kb" / "hr" / "pay.md"))
    short = AccessDefault(path=str(tmp_path / "kb"), access=["public"])
    # four parts as written, two once normalised: still the longer match
    long = AccessDefault(path=str(tmp_path / "kb" / "x" / ".." / "hr"), access=["group:hr"])
    for defaults in ([short, long], [long, short]):
        assert scope_of(with_default_scope(doc, defaults)) == (None, ["group:hr"])
    wide = AccessDefault(path=str(tmp_path / "kb" / "a" / "b" / ".." / ".."), access=["user:x"])
    for defaults in ([wide, long], [long, wide]):
        assert scope_of(with_default_scope(doc, defaults)) == (None, ["group:hr"])


@pytest.mark.parametrize("front", ["access: []\n", "access: null\n", "tenant: globex\naccess: []\n"])
def test_an_empty_access_of_its_own_is_not_filled_from_the_defaults(tmp_path: Path, front: str) -> None:
    """`access: []` says "nobody but the admin": a folder's default must not widen it."""
    kb = tmp_path / "kb"
    write(kb / "secret.md", markdown("secret", front))
    write(kb / "lines.jsonl", json.dumps({"id": "line", "text": "x", "access": []}) + "\n")
    defaults = [AccessDefault(path=str(kb), tenant="acme", access=["public"])]
    result = load_paths([kb], access_defaults=defaults)
    assert result.errors == []
    scopes = {d.doc_id: scope_of(d) for d in result.documents}
    assert scopes["secret"] == ("globex" if "globex" in front else "acme", None)
    assert scopes["line"] == ("acme", None)
    for document in result.documents:
        (chunk,) = chunk_document(document, chunk_size=200, overlap=0)
        assert "access" not in chunk.metadata  # stored without access: the admin only


def test_a_document_no_default_matches_keeps_no_scope(tmp_path: Path) -> None:
    write(tmp_path / "kb" / "pay.md", markdown("pay"))
    result = load_paths([tmp_path / "kb"], access_defaults=[AccessDefault(path=str(tmp_path / "other"))])
    (doc,) = result.documents
    assert "tenant" not in doc.metadata and "access" not in doc.metadata


# -- the chunker ---------------------------------------------------------------------------------------------


def test_every_chunk_carries_the_access_list_as_a_list() -> None:
    text = "\n\n".join(
        f"## Part {i}\n\n" + "Salaries are paid on the 25th of every month. " * 8 for i in range(6)
    )
    doc = Document(
        "pay",
        text,
        "Pay",
        {"tenant": "acme", "access": ["group:hr", "group:hr,group:sales"], "tags": "a,b"},
        origin="kb/pay.md",
    )
    chunks = chunk_document(doc, chunk_size=200, overlap=0)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.metadata["access"] == ["group:hr", "group:hr,group:sales"]
        assert chunk.metadata["tenant"] == "acme"
        assert chunk.metadata["tags"] == "a,b"


def test_a_document_without_access_gives_chunks_without_it() -> None:
    doc = Document("pay", "Salaries are paid on the 25th.", "Pay", {"access": []}, origin="kb/pay.md")
    (chunk,) = chunk_document(doc, chunk_size=200, overlap=0)
    assert "access" not in chunk.metadata
