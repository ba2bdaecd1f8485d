"""Hostile corpus folders: the loader reports every problem as a LoadError naming the file (and line), and
never raises, so ingest has read and validated everything before it writes anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.ingest.loaders import load_paths
from app.ingest.types import LoadError

DEEP = 100_000


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def good_line(doc_id: str) -> str:
    return json.dumps({"id": doc_id, "text": f"text of {doc_id}"})


# -- JSONL -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * DEEP + "]" * DEEP, "invalid JSON: nested too deeply to read"),
        ('{"id": "x", "text": "t", "meta": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
        ('{"id": "x", "text": "t", "n": ' + "1" * 5000 + "}", "invalid JSON: Exceeds the limit"),
    ],
    ids=["deep-array", "deep-field", "huge-int"],
)
def test_an_unreadable_jsonl_line_is_a_load_error_naming_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write(tmp_path / "corpus.jsonl", "\n".join([good_line("a"), line, good_line("b")]) + "\n")
    result = load_paths([path])
    assert [d.doc_id for d in result.documents] == ["a", "b"]
    [error] = result.errors
    assert (error.path, error.line) == (str(path), 2)
    assert message in error.message


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"id": "\\ud800", "text": "t"}', "field 'id': not valid Unicode: a lone surrogate U+D800"),
        (
            '{"id": "x", "text": "a\\udfffb"}',
            "field 'text': not valid Unicode: a lone surrogate U+DFFF at character 1",
        ),
        ('{"id": "x", "title": "\\ud800", "text": "t"}', "field 'title': not valid Unicode"),
        ('{"id": "x", "text": "t", "owner": "\\ud800"}', "field 'owner': not valid Unicode"),
        ('{"id": "x", "text": "t", "tags": ["a", "\\ud800"]}', "field 'tags': not valid Unicode"),
        ('{"id": "x", "text": "t", "\\ud800": "v"}', "field '\\ud800': not valid Unicode"),
        ('{"id": "x", "text": "t", "": "v"}', "field '': metadata key must not be empty"),
        (
            '{"id": "x", "text": "t", "#document": "v"}',
            "field '#document': metadata key '#document' is reserved",
        ),
        ('{"id": "x", "text": "t", "chroma:document": "v"}', "field 'chroma:document': metadata key"),
        ('{"id": "x", "text": "t", "$contains": "v"}', "is reserved by the store"),
        ('{"id": "x", "text": "t", "w": NaN}', "field 'w': nan is not a finite number"),
        ('{"id": "x", "text": "t", "w": -Infinity}', "field 'w': -inf is not a finite number"),
    ],
)
def test_bad_strings_and_metadata_keys_in_jsonl_name_file_line_and_field(
    tmp_path: Path, record: str, message: str
) -> None:
    path = write(tmp_path / "c.jsonl", good_line("a") + "\n" + record + "\n")
    result = load_paths([path])
    assert [d.doc_id for d in result.documents] == ["a"]
    [error] = result.errors
    assert (error.path, error.line) == (str(path), 2)
    assert message in error.message, error.message
    str(error).encode("utf-8")  # the message itself can be printed and logged


def test_a_surrogate_pair_in_jsonl_is_an_ordinary_character(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl", '{"id": "x", "text": "smile \\ud83d\\ude00"}\n')
    [doc] = load_paths([path]).documents
    assert doc.text == "smile \U0001f600"


# -- front matter ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("front", "line", "message"),
    [
        ('title: T\n"": v\n', 3, "front matter key '': metadata key must not be empty"),
        (
            'title: T\n"#document": v\n',
            3,
            "front matter key '#document': metadata key '#document' is reserved",
        ),
        ("title: T\nchroma:document: v\n", 3, "front matter key 'chroma:document'"),
        ('owner: "\\ud800"\n', 2, "front matter key 'owner': not valid Unicode"),
        ('title: "\\udc00"\n', 2, "front matter key 'title': not valid Unicode"),
        ("title: T\nweight: .nan\n", 3, "front matter key 'weight': nan is not a finite number"),
        ("title: T\nweight: -.inf\n", 3, "front matter key 'weight': -inf is not a finite number"),
        (
            "a: " + "[" * DEEP + "]" * DEEP + "\n",
            2,
            "front matter is not valid YAML: nested too deeply to read",
        ),
    ],
)
def test_bad_front_matter_keys_and_values_name_file_and_line(
    tmp_path: Path, front: str, line: int, message: str
) -> None:
    path = write(tmp_path / "kb" / "doc.md", f"---\n{front}---\n# Body\n\ntext\n")
    result = load_paths([tmp_path / "kb"])
    assert result.documents == []
    [error] = result.errors
    assert (error.path, error.line) == (str(path), line)
    assert message in error.message, error.message


# -- symbolic links ----------------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file and a folder outside the corpus folder, like /etc/hostname."""
    write(tmp_path / "outside" / "secret.md", "# Secret\n\nnot for the index\n")
    return tmp_path / "outside"


@pytest.fixture
def corpus(tmp_path: Path, outside: Path) -> Path:
    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\ntext a\n")
    write(kb / "sub" / "b.md", "# B\n\ntext b\n")
    os.symlink(outside / "secret.md", kb / "secret.md")  # a file outside
    os.symlink(outside, kb / "elsewhere")  # a folder outside
    os.symlink("loop.md", kb / "loop.md")  # a link to itself
    os.symlink(kb / "sub" / "b.md", kb / "b-again.md")  # a file inside
    return kb


def by_path(errors: list[LoadError]) -> dict[str, str]:
    return {Path(e.path).name: e.message for e in errors}


def test_symlinks_are_reported_and_not_followed_by_default(corpus: Path) -> None:
    result = load_paths([corpus])
    assert sorted(d.doc_id for d in result.documents) == ["a", "sub/b"]
    errors = by_path(result.errors)
    assert set(errors) == {"secret.md", "elsewhere", "loop.md", "b-again.md"}
    assert errors["loop.md"] == "symbolic link loop (the link leads back to itself)"
    for name in ("secret.md", "elsewhere", "b-again.md"):
        assert errors[name].startswith("symbolic link not followed (it points to ")
        assert "rag.ingest.follow_symlinks" in errors[name]
    assert all(e.line is None for e in result.errors)
    assert not any("secret" in d.text for d in result.documents)


def test_the_etc_hostname_link_is_not_read(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "a.txt", "ok")
    os.symlink("/etc/hostname", kb / "hostname.txt")
    result = load_paths([kb])
    assert [d.doc_id for d in result.documents] == ["a"]
    assert [(Path(e.path).name, e.message.split(" (")[0]) for e in result.errors] == [
        ("hostname.txt", "symbolic link not followed")
    ]


def test_with_follow_symlinks_links_are_read_and_loops_still_reported(corpus: Path) -> None:
    result = load_paths([corpus], follow_symlinks=True)
    assert sorted(d.doc_id for d in result.documents) == [
        "a",
        "b-again",
        "elsewhere/secret",
        "secret",
        "sub/b",
    ]
    assert by_path(result.errors) == {"loop.md": "symbolic link loop (the link leads back to itself)"}


def test_with_follow_symlinks_a_link_to_an_ancestor_is_walked_once(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "sub" / "a.md", "# A\n\ntext\n")
    os.symlink(kb, kb / "sub" / "up")
    result = load_paths([kb], follow_symlinks=True)
    assert [d.doc_id for d in result.documents] == ["sub/a"]
    [error] = result.errors
    assert error.path == str(kb / "sub" / "up")
    assert error.message.startswith("symbolic link loop: it leads to ")
    assert "already walked" in error.message


def test_a_broken_link_is_a_bad_file(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\ntext\n")
    os.symlink(tmp_path / "gone.md", kb / "gone.md")
    for follow in (False, True):
        result = load_paths([kb], follow_symlinks=follow)
        assert [d.doc_id for d in result.documents] == ["a"]
        assert [str(e) for e in result.errors] == [
            f"{kb / 'gone.md'}: broken symbolic link (its target {tmp_path / 'gone.md'} does not exist)"
        ]


def test_a_link_named_directly_is_read_because_it_was_asked_for(tmp_path: Path, outside: Path) -> None:
    link = tmp_path / "named.md"
    os.symlink(outside / "secret.md", link)
    [doc] = load_paths([link]).documents
    assert doc.doc_id == "named"
    loop = tmp_path / "self.md"
    os.symlink("self.md", loop)
    assert [str(e) for e in load_paths([loop]).errors] == [
        f"{loop}: symbolic link loop (the link leads back to itself)"
    ]


# -- things that are not files -----------------------------------------------------------------------------


def test_a_fifo_is_reported_not_read(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\ntext\n")
    os.mkfifo(kb / "pipe.md")  # reading it would block for ever
    result = load_paths([kb])
    assert [d.doc_id for d in result.documents] == ["a"]
    assert [str(e) for e in result.errors] == [
        f"{kb / 'pipe.md'}: not a regular file (a FIFO, socket or device)"
    ]
    assert [str(e) for e in load_paths([kb / "pipe.md"]).errors] == [
        f"{kb / 'pipe.md'}: not a regular file or a directory"
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_directory_is_reported(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\ntext\n")
    write(kb / "locked" / "b.md", "# B\n\ntext\n")
    (kb / "locked").chmod(0)
    try:
        result = load_paths([kb])
    finally:
        (kb / "locked").chmod(0o755)
    assert [d.doc_id for d in result.documents] == ["a"]
    assert [str(e) for e in result.errors] == [f"{kb / 'locked'}: cannot list directory: Permission denied"]
