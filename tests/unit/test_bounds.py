"""Every request input is bounded (app/api/bounds.py), a body too large in shape is refused before any model
reads it, and a 422 is bounded too."""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from annotated_types import MaxLen
from fastapi.testclient import TestClient
from pydantic import BaseModel

from app.api import bounds
from app.api.bounds import json_shape_problem
from app.api.evaluations import EvaluationRunRequest
from app.api.label import JudgmentRequest
from app.api.querylog import QueryLogParams
from app.api.schemas import DocumentIn, DocumentsRequest, RetrieveRequest
from tests.fixtures.fake_api import FakeSieve, api_settings, post_json, serve_fake  # noqa: F401

REQUEST_MODELS = [
    RetrieveRequest,
    DocumentIn,
    DocumentsRequest,
    JudgmentRequest,
    EvaluationRunRequest,
    QueryLogParams,
]
# fields whose bound is a setting, checked by the route (named in app/api/bounds.py)
BOUND_BY_SETTING = {(RetrieveRequest, "query"), (DocumentIn, "text")}


def _unbounded(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(_unbounded(a) for a in typing.get_args(annotation) if a is not type(None))
    return annotation is str or origin in (list, dict)


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
def test_every_string_list_and_mapping_of_a_request_model_has_a_bound(model: type[BaseModel]) -> None:
    for name, info in model.model_fields.items():
        if (model, name) in BOUND_BY_SETTING or not _unbounded(info.annotation):
            continue
        assert any(isinstance(m, MaxLen) for m in info.metadata), f"{model.__name__}.{name} has no max_length"


def test_extra_fields_of_a_document_are_bounded_in_size() -> None:
    assert DocumentIn.model_config.get("extra") == "allow"
    with pytest.raises(ValueError, match="metadata value of 8193 characters"):
        DocumentIn.model_validate({"id": "a", "text": "t", "k": "x" * 8193})


def wide_document(keys: int, key_chars: int = 2) -> dict[str, Any]:
    return {"id": "wide", "text": "t", **{f"{i:0{key_chars}d}": i for i in range(keys)}}


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (wide_document(65), "has 65 metadata keys, more than rag.ingest.max_metadata_keys=64"),
        (wide_document(1, 129), "has a metadata key of 129 characters"),
        (
            {"id": "wide", "text": "t", **{f"k{i}": "v" * 8000 for i in range(9)}},
            f"has {9 * (2 + 8000)} bytes of metadata, more than rag.ingest.max_metadata_bytes=65536",
        ),
    ],
)
def test_the_write_api_applies_the_ingest_bounds_and_writes_nothing(
    client: TestClient, document: dict[str, Any], problem: str
) -> None:
    answer = post_json(
        client, "/api/documents", json.dumps({"documents": [{"id": "ok", "text": "t"}, document]})
    )
    assert answer.status_code == 422
    body = answer.json()
    assert [p["field"] for p in body["fields"]] == ["documents.1"]
    assert problem in body["error"] and "nothing of this request was written" in body["error"]


def test_a_6000_key_document_is_refused_before_any_model_reads_it(client: TestClient) -> None:
    answer = post_json(client, "/api/documents", json.dumps({"documents": [wide_document(6000, 4)]}))
    assert answer.status_code == 422
    assert answer.json()["fields"][0] == {
        "field": "documents.0",
        "message": "an object of 6002 keys; no request takes more than 67 (a document: id, title, text and "
        "rag.ingest.max_metadata_keys=64 metadata fields)",
    }


def test_the_write_api_follows_a_raised_max_metadata_keys(settings) -> None:  # noqa: F811
    ingest = settings.rag.ingest.model_copy(update={"max_metadata_keys": 200})
    raised = settings.model_copy(update={"rag": settings.rag.model_copy(update={"ingest": ingest})})
    fake = FakeSieve(raised)
    with serve_fake(fake) as c:
        fine = post_json(c, "/api/documents", json.dumps({"documents": [wide_document(150, 3)]}))
        over = post_json(c, "/api/documents", json.dumps({"documents": [wide_document(201, 3)]}))
    assert fine.status_code == 200, fine.text
    assert over.status_code == 422 and over.json()["fields"][0]["field"] == "documents.0"


@pytest.mark.parametrize(
    "value, problem",
    [
        ({"a": 1}, None),
        ({f"k{i}": i for i in range(68)}, ("body", "an object of 68 keys")),
        (
            {"documents": [{"id": 1, **{f"k{i}": i for i in range(70)}}]},
            ("documents.0", "an object of 71 keys"),
        ),
        ({"documents": list(range(bounds.MAX_ARRAY_ITEMS + 1))}, ("documents", "an array of 10001 items")),
    ],
)
def test_the_shape_check_names_the_first_object_or_array_over_its_bound(value: Any, problem: Any) -> None:
    found = json_shape_problem(json.dumps(value).encode(), bounds.max_object_keys(64))
    assert (found[0], found[1].split(";")[0]) == problem if problem else found is None


@pytest.fixture
def client(settings) -> Iterator[TestClient]:  # noqa: F811
    with serve_fake(FakeSieve(settings)) as c:
        yield c


def test_a_body_of_150000_keys_is_refused_at_once_with_a_small_422(client: TestClient) -> None:
    # 150,000 unknown keys in about 1.4 MB (under rag.server.max_body_bytes)
    body = json.dumps({"query": "pay", **{f"{i:x}": 1 for i in range(150_000)}}, separators=(",", ":"))
    assert 1_000_000 < len(body) < 2_000_000
    started = time.perf_counter()
    answer = post_json(client, "/api/retrieve", body)
    elapsed = time.perf_counter() - started
    assert answer.status_code == 422
    assert len(answer.content) < 2000 and answer.json()["count"] == 1
    assert elapsed < 1.0, elapsed


def test_a_422_lists_the_first_problems_and_counts_them_all(client: TestClient) -> None:
    docs = [{"id": "", "text": ""} for _ in range(50)]
    answer = post_json(client, "/api/documents", json.dumps({"documents": docs}))
    body = answer.json()
    assert answer.status_code == 422
    assert len(body["fields"]) == bounds.MAX_REPORTED_PROBLEMS and body["count"] == 100
    assert body["error"].endswith("; and 80 more")


def test_a_long_knowledge_tag_is_refused(client: TestClient) -> None:
    answer = post_json(client, "/api/retrieve", json.dumps({"query": "pay", "knowledgeTag": "x" * 257}))
    assert answer.status_code == 422 and answer.json()["fields"][0]["field"] == "knowledgeTag"
    assert len(answer.content) < 2000
