"""Stable, content-derived ids for chunks, and a hash of a document's text for spotting copies.

An id is a hash over a canonical encoding of its fields, never a counter or a random value, so re-ingesting
the same corpus gives the same ids (the store can upsert and skip unchanged work), and any change that could
alter retrieval gives a new one.

Canonical encoding: every field is UTF-8 encoded and written as `<byte length>:<bytes>`; a sequence (the
heading path) is written as `<count>:` followed by its encoded items. Length prefixes make the encoding
injective: ("a", "bc") and ("ab", "c") encode differently, whatever characters the fields contain.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

CHUNK_ID_PREFIX = "c_"
CHUNK_ID_HEX_CHARS = 24  # 96 bits: collisions are negligible for any corpus this service will hold

_WHITESPACE = re.compile(r"\s+")
_CHUNK_ID = re.compile(rf"{CHUNK_ID_PREFIX}[0-9a-f]{{{CHUNK_ID_HEX_CHARS}}}")


def normalise_text(text: str) -> str:
    """NFKC-normalise, collapse every run of whitespace to one space, strip both ends. Case is kept.

    NFKC folds full-width forms (`ＡＢＣ１２３` -> `ABC123`, the ideographic space -> a space), so text
    that differs only in such presentation forms, or in line wrapping and indentation, normalises alike.
    """
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def _field(value: str) -> bytes:
    data = value.encode("utf-8")
    return str(len(data)).encode("ascii") + b":" + data


def _sequence(values: Iterable[str]) -> bytes:
    items = [_field(v) for v in values]
    return str(len(items)).encode("ascii") + b":" + b"".join(items)


def chunk_id(
    doc_id: str,
    chunker_version: str,
    position: int,
    heading_path: Iterable[str],
    text: str,
    *,
    title: str,
) -> str:
    """`"c_"` + the first 24 hex chars of sha256 over the canonical encoding of the fields.

    The fields cover everything the chunk's embedding is computed from (`embedding_text`: the document
    title, the heading path and the text), so a change to any of them gives a new id and a new vector.
    Encoded in this order: the encoding version `chunk/2`, `doc_id`, `chunker_version`, `position`, `title`,
    the heading path, the text. `doc_id`, `chunker_version` and `position` are taken as they are; the title,
    each heading and the text are passed through `normalise_text` first, so whitespace-only reformatting
    keeps the id.
    """
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be a non-negative int, got {position!r}")
    payload = b"".join(
        [
            _field("chunk/2"),  # the encoding's own version: changing this layout must change every id
            _field(doc_id),
            _field(chunker_version),
            _field(str(position)),
            _field(normalise_text(title)),
            _sequence(normalise_text(h) for h in heading_path),
            _field(normalise_text(text)),
        ]
    )
    return CHUNK_ID_PREFIX + hashlib.sha256(payload).hexdigest()[:CHUNK_ID_HEX_CHARS]


def looks_like_chunk_id(value: str) -> bool:
    """True when `value` has the shape `chunk_id` gives every id: "c_" and 24 lowercase hex characters. A
    golden set can then tell a chunk id the index no longer holds (re-chunked) from a document id."""
    return _CHUNK_ID.fullmatch(value) is not None


def text_sha256(text: str) -> str:
    """Full sha256 hex digest of `normalise_text(text)` in UTF-8.

    Two documents get the same value exactly when their texts are equal after normalisation (whitespace and
    NFKC presentation forms aside, case kept): the diversity stage treats such documents as copies.
    """
    return hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()
