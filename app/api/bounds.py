"""The bounds of every request input, in one place (docs/api.md lists them).

Each string, list and mapping a request model accepts has a bound here or a setting named here, so no client
can make the server keep, log or answer with more than these:

- `query` (retrieve): rag.retrieval.max_query_chars (checked by the route);
- `knowledgeTag` (retrieve): `MAX_TAG_CHARS`;
- a document's `id`: `MAX_ID_CHARS`; `title`: `MAX_TITLE_CHARS`; `text`: rag.ingest.max_document_chars;
  metadata: rag.ingest.max_metadata_keys fields, keys of rag.ingest.max_metadata_key_chars, together
  rag.ingest.max_metadata_bytes (the bounds every loader applies, checked by the route), string values of
  `MAX_METADATA_VALUE_CHARS`;
- `documents` (ingest): `MAX_DOCUMENTS`;
- a judgment's `caseId` and `id`, the path's `case_id`: `MAX_ID_CHARS`;
- a judgment's `who`: `MAX_WHO_CHARS`, no control or line-break character;
- any JSON body, before a model reads it (`json_shape_problem`): objects of at most `max_object_keys` keys (a
  document's id, title, text and rag.ingest.max_metadata_keys metadata fields), arrays of at most
  `MAX_ARRAY_ITEMS` items;
- a 422 answer: the first `MAX_REPORTED_PROBLEMS` problems and their `count`; a field name of at most
  `MAX_FIELD_NAME_CHARS` characters and a message of at most `MAX_MESSAGE_CHARS` (longer ones are cut).

Every string must also be valid Unicode (no lone surrogate, `Text`).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from app.store import unicode_problem

MAX_ID_CHARS = 1000
MAX_TAG_CHARS = 256
MAX_TITLE_CHARS = 1000
MAX_WHO_CHARS = 100
MAX_METADATA_VALUE_CHARS = 8192
MAX_DOCUMENTS = 10_000
MAX_ARRAY_ITEMS = MAX_DOCUMENTS
MAX_REPORTED_PROBLEMS = 20
MAX_FIELD_NAME_CHARS = 200
MAX_MESSAGE_CHARS = 1000


def _valid_unicode(value: str) -> str:
    problem = unicode_problem(value)
    if problem:
        raise PydanticCustomError("invalid_unicode", "{problem}", {"problem": problem})
    return value


def _printable_name(value: str) -> str:
    for i, char in enumerate(value):
        if unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp"):
            raise PydanticCustomError(
                "invalid_name",
                "{problem}",
                {"problem": f"U+{ord(char):04X} at character {i}: no control or line-break characters"},
            )
    return value


# A string that can be encoded as UTF-8: JSON lets a "\\ud800" escape through as a lone surrogate, which the
# tokenizer, Chroma and the response encoder would all fail on later.
Text = Annotated[str, AfterValidator(_valid_unicode)]
Tag = Annotated[Text, Field(max_length=MAX_TAG_CHARS)]
Id = Annotated[Text, Field(min_length=1, max_length=MAX_ID_CHARS)]
Title = Annotated[Text, Field(max_length=MAX_TITLE_CHARS)]
# a rater's name: printable, one line
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_WHO_CHARS, pattern=r"\S"), AfterValidator(_printable_name)
]


def max_object_keys(max_metadata_keys: int) -> int:
    """The most keys an object of any request may have: no request model has more fields than a document,
    its id, title and text and `max_metadata_keys` (rag.ingest.max_metadata_keys) metadata fields."""
    return max_metadata_keys + 3


def metadata_problem(key: str, value: Any) -> str | None:
    """Why a document's metadata value is over its bound, or None (the number of keys, their length and
    the metadata's size are rag.ingest's bounds, which the route checks)."""
    if isinstance(value, str) and len(value) > MAX_METADATA_VALUE_CHARS:
        return f"metadata value of {len(value)} characters, more than {MAX_METADATA_VALUE_CHARS}"
    return None


def json_shape_problem(body: bytes, max_keys: int) -> tuple[str, str] | None:
    """(field, problem) for a JSON body holding an object with more than `max_keys` keys or an array
    with more than `MAX_ARRAY_ITEMS` items, else None (also for a body that is not JSON: the route's parser
    names that problem). Stops at the first one found, so its cost is the parse, not the size of the
    answer."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("body", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            if len(item) > max_keys:
                return where, (
                    f"an object of {len(item)} keys; no request takes more than {max_keys} (a document: "
                    f"id, title, text and rag.ingest.max_metadata_keys={max_keys - 3} metadata fields)"
                )
            stack.extend((f"{where}.{key}" if where != "body" else str(key), v) for key, v in item.items())
        elif isinstance(item, list):
            if len(item) > MAX_ARRAY_ITEMS:
                return where, f"an array of {len(item)} items; no request takes more than {MAX_ARRAY_ITEMS}"
            stack.extend((f"{where}.{i}" if where != "body" else str(i), v) for i, v in enumerate(item))
    return None
