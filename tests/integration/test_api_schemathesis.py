"""Schemathesis against /openapi.json: generated valid and invalid requests for every operation, on the real
app over a real Sieve (the packaged e5 embedder, an embedded Chroma holding a copy of the sample base).
Checks: no 5xx, every status code and content type declared, every body valid against its declared schema, and
requests that break the schema rejected with a 4xx. After every generated write (any request that is not a
read and got past the token check, whatever its answer), a canary document is written and read back: no
write, accepted or refused, may leave the store unable to take the next one or to serve it (issue 33: a
document of 6,000 metadata keys did).
Generated wide documents (many metadata fields, long keys, big values, up to and past every bound) are each
refused with 413 or 422 naming the document, or kept whole, exactly as the bounds say.

Bounded: `MAX_EXAMPLES` per operation and per mode (positive, negative), `WIDE_EXAMPLES` wide requests; about
a minute and a half on 2 busy cores.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from app.api import bounds
from app.main import create_app
from app.service import Sieve
from app.settings import IngestSettings, Settings, load_settings, merge, nested
from app.store import ChromaStore
from app.store.record import DocumentRecord, open_record
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
GOLDEN_SET = REPO / "golden_set" / "golden-set.json"
MAX_EXAMPLES = 30
WIDE_EXAMPLES = 25
ADMIN_TOKEN = "schemathesis-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# a real evaluation per generated request would take minutes: that operation gets no valid token (401)
NO_TOKEN_FOR = {"POST /api/evaluations", "POST /api/evaluations/runs"}
# the operations that send a body only to read; every other one but GET may write
READS_BY_POST = {"POST /api/retrieve"}
# a write refused for its token never reached a route (the canary after it would test nothing new)
REFUSED_AT_THE_GATE = (401, 403)
# the labelling routes compute a retrieval pool per golden case (again on each `refresh=true`): a few cases
# exercise them as well as the 67 of the golden set, at a fraction of the time
LABEL_CASES = 5
CANARY_ID = "schemathesis-canary"
JOB_TIMEOUT_S = 120.0


@schemathesis.check
def rejects_negative_data(ctx, response, case):  # type: ignore[no-untyped-def]
    """schemathesis' `negative_data_rejection`, with 413 counted as a rejection: a generated invalid body
    can be larger than rag.server.max_body_bytes, and the body limit refuses it with 413 (declared for every
    operation with a body, which `status_code_conformance` checks) before validation could answer 422."""
    if response.status_code == 413:
        return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    rejects_negative_data,
]


def few_golden_cases(path: Path) -> Path:
    """`path` becomes the golden set's first `LABEL_CASES` cases."""
    golden = json.loads(GOLDEN_SET.read_text(encoding="utf-8"))
    golden["cases"] = golden["cases"][:LABEL_CASES]
    path.write_text(json.dumps(golden, ensure_ascii=False), encoding="utf-8")
    return path


@dataclass
class Served:
    """The real app, its state set to ready over a real Sieve (no startup thread, no lifespan needed)."""

    app: Any
    sieve: Sieve
    record: DocumentRecord
    settings: Settings


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("schemathesis")
    app_settings = load_settings(
        merge(
            nested("rag.store.path", str(seeded_store(base / "store"))),
            nested("rag.evaluate.resource_location", str(few_golden_cases(base / "golden-set.json"))),
            nested("rag.models.cache_dir", str(MODELS_CACHE)),
            nested("rag.ingest.paths", []),
            nested("rag.evaluate.output_dir", str(base / "eval")),
            nested("rag.server.admin_token", ADMIN_TOKEN),
            nested("rag.server.jobs_dir", str(base / "jobs")),
            # the labelling routes append judgments: never to the repository's golden_set/
            nested("rag.label.drafts", str(base / "drafts.jsonl")),
            nested("rag.label.judgments", str(base / "judgments.jsonl")),
            nested("rag.label.queue", str(base / "label-queue.jsonl")),
        )
    )
    store = ChromaStore.open(app_settings.rag.store, real_embedder.identity())
    # the document record as `sieve serve` keeps it: every accepted write goes there before the index
    record = open_record(app_settings.rag.store, store.client)
    sieve = Sieve(app_settings, real_embedder, store, reranker=None, record=record)
    app = create_app(app_settings, start=lambda state: None)
    state = app.state.sieve_state
    state.sieve, state.phase, state.ready = sieve, "ready", True
    yield Served(app, sieve, record, app_settings)
    sieve.close()


@pytest.fixture(scope="module")
def api_schema(served: Served) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", served.app)


@dataclass
class Canary:
    """A small valid document, written (replacing the one before) and read back after each generated write."""

    client: TestClient
    writes: int = 0

    def write_and_read(self, after: str) -> None:
        """The store still takes a write and serves it: the canary, rewritten with a new text, is answered
        200 (or 202 and its job done) and retrieved with that text. `after` names the write before it."""
        self.writes += 1
        text = f"Canary note {self.writes}: the lighthouse keeper logged write number {self.writes}."
        body = {"documents": [{"id": CANARY_ID, "title": "Canary", "text": text}]}
        written = self.client.post("/api/documents", json=body, headers=ADMIN)
        assert written.status_code in (200, 202), f"after {after}, the canary write: {written.text[:2000]}"
        if written.status_code == 202:
            self.wait_for(written.json()["job"], after)
        found = self.client.post("/api/retrieve", json={"query": text, "topK": 3})
        assert found.status_code == 200, f"after {after}, the canary read: {found.text[:2000]}"
        texts = [d["text"] for d in found.json()["documents"] if d["docId"] == CANARY_ID]
        assert texts == [text], f"after {after}, the canary read back: {found.text[:2000]}"

    def wait_for(self, job: str, after: str) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            view = self.client.get(f"/api/jobs/{job}", headers=ADMIN).json()
            if view["state"] == "done":
                return
            assert view["state"] in ("queued", "running"), f"after {after}, the canary's job: {view}"
            time.sleep(0.05)
        pytest.fail(f"after {after}, the canary's job {job} not done within {JOB_TIMEOUT_S:.0f}s")


@pytest.fixture(scope="module")
def canary(served: Served) -> Canary:
    return Canary(TestClient(served.app))


def is_write(operation: schemathesis.APIOperation) -> bool:
    return operation.method.upper() not in ("GET", "HEAD", "OPTIONS") and operation.label not in READS_BY_POST


def test_the_schema_lists_every_operation(api_schema: schemathesis.BaseSchema) -> None:
    operations = {op.ok().label for op in api_schema.get_all_operations()}
    assert {"GET /health", "GET /ready", "POST /api/retrieve", "POST /api/documents"} <= operations


def exercise(
    operation: schemathesis.APIOperation, mode: GenerationMode, headers: dict[str, str], canary: Canary
) -> None:
    """MAX_EXAMPLES generated requests to `operation`, each checked with CHECKS; after each write that got
    past the token check, the canary."""
    writes = is_write(operation)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: schemathesis.Case) -> None:
        response = case.call_and_validate(headers=token_for(case, mode, headers), checks=CHECKS)
        if writes and response.status_code not in REFUSED_AT_THE_GATE:
            canary.write_and_read(after=f"{mode} {operation.label} answered {response.status_code}")

    check()


def token_for(case: schemathesis.Case, mode: GenerationMode, headers: dict[str, str]) -> dict[str, str]:
    """Our token replaces the one a generated case carries; a negative case whose Authorization header was
    taken away (the negated part may be the credential alone) is sent without it, not given it back."""
    if mode is GenerationMode.NEGATIVE and not any(k.lower() == "authorization" for k in case.headers or {}):
        return {}
    return headers


# (strategies driven by hand rather than `schema.parametrize()`: its lazy fixture loader does not run on
# pytest 9, and this way every operation the app declares is covered, including ones added later)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_generated_request_gets_a_5xx_or_an_undeclared_answer_or_breaks_the_store(
    api_schema: schemathesis.BaseSchema, mode: GenerationMode, canary: Canary
) -> None:
    tested, nothing_to_negate, canaries = [], [], canary.writes
    for result in api_schema.get_all_operations():
        operation = result.ok()
        headers = {} if operation.label in NO_TOKEN_FOR else {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        try:
            exercise(operation, mode, headers, canary)
        except Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise
            nothing_to_negate.append(operation.label)  # no parameters and no body: no invalid request
        else:
            tested.append(operation.label)
    assert {"POST /api/retrieve", "POST /api/documents"} <= set(tested), (tested, nothing_to_negate)
    assert canary.writes > canaries


# A wide document's metadata: field counts around the API's bound (64 fields; 67 keys in any object) and far
# past it (Chroma broke between 5,000 and 5,500 keys on one record), a long key and a big value around their
# bounds, and every value padded to a length that takes the total over rag.ingest.max_metadata_bytes or not.
FIELD_COUNTS = st.one_of(st.integers(0, 8), st.sampled_from([63, 64, 65, 66, 67, 200, 1000, 1001, 6000]))
KEY_CHARS = st.sampled_from([127, 128, 129, 1000, 200_000])
VALUE_CHARS = st.sampled_from([8191, 8192, 8193, 65_536, 1_000_000, 3_000_000])
PAD_CHARS = st.sampled_from([0, 100, 1024, 8192])
SMALL_VALUES: tuple[Any, ...] = (7, -2.5, True, "v", "é", "")
DOCUMENT_FIELDS = ("id", "title", "text")
wide_ids = itertools.count()


@st.composite
def wide_metadata(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(FIELD_COUNTS)
    prefix = draw(st.sampled_from(["k", "é", "键"]))
    pad = draw(PAD_CHARS) if fields <= 70 else 0  # 6,000 padded values would only test the body limit
    metadata = {
        f"{prefix}{i}": "x" * pad if pad else SMALL_VALUES[i % len(SMALL_VALUES)] for i in range(fields)
    }
    if draw(st.booleans()):
        metadata["k" * draw(KEY_CHARS)] = 1
    if draw(st.booleans()):
        metadata["big"] = "x" * draw(VALUE_CHARS)
    return metadata


def metadata_of(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in DOCUMENT_FIELDS}


def metadata_bytes(metadata: dict[str, Any]) -> int:
    """UTF-8 bytes of the keys and of the values as text, as rag.ingest.max_metadata_bytes counts them."""
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in metadata.items())


@dataclass
class WideRequest:
    """A write of a few documents, one of them wide (shown by its sizes: its values are long)."""

    documents: list[dict[str, Any]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        return {"documents": self.documents}

    def ids(self) -> list[str]:
        return [str(d["id"]) for d in self.documents]

    def __repr__(self) -> str:
        shown = []
        for document in self.documents:
            metadata = metadata_of(document)
            longest_key = max(map(len, metadata), default=0)
            longest_value = max((len(str(v)) for v in metadata.values()), default=0)
            shown.append(
                f"{document['id']}: {len(metadata)} metadata fields, keys up to {longest_key} characters, "
                f"values up to {longest_value}, {metadata_bytes(metadata)} bytes"
            )
        return f"WideRequest({'; '.join(shown)})"


@st.composite
def wide_requests(draw: st.DrawFn) -> WideRequest:
    n = next(wide_ids)
    before, after = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    plain = [
        {"id": f"plain-{n}-{i}", "title": f"Plain {n}", "text": f"An ordinary note, number {n}.{i}."}
        for i in range(before + after)
    ]
    wide = {"id": f"wide-{n}", "text": f"A wide note, number {n}.", **draw(wide_metadata())}
    return WideRequest([*plain[:before], wide, *plain[before:]])


def over_bounds(document: dict[str, Any], ingest: IngestSettings) -> bool:
    """Whether the API must refuse `document`: the shape bound of any object and a metadata value's bound
    (app/api/bounds.py), or a bound of rag.ingest on its metadata (keys, key length, bytes)."""
    metadata = metadata_of(document)
    return (
        len(document) > bounds.max_object_keys(ingest.max_metadata_keys)
        or len(metadata) > ingest.max_metadata_keys
        or any(len(k) > ingest.max_metadata_key_chars for k in metadata)
        or any(isinstance(v, str) and len(v) > bounds.MAX_METADATA_VALUE_CHARS for v in metadata.values())
        or metadata_bytes(metadata) > ingest.max_metadata_bytes
    )


def test_a_wide_document_is_refused_naming_it_or_kept_whole_and_the_store_keeps_working(
    api_schema: schemathesis.BaseSchema, served: Served, canary: Canary
) -> None:
    operation = api_schema["/api/documents"]["POST"]
    rag = served.settings.rag
    # the exact fault of issue 33, and the widest document the API takes
    keys, at_bound = [f"k{i}" for i in range(6000)], rag.ingest.max_metadata_keys

    @given(request=wide_requests())
    @example(request=WideRequest([{"id": "at-the-bound", "text": "t", **dict.fromkeys(keys[:at_bound], 1)}]))
    @example(request=WideRequest([{"id": "issue-33", "text": "t", **dict.fromkeys(keys, 1)}]))
    @settings(
        max_examples=WIDE_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(request: WideRequest) -> None:
        case = operation.Case(body=request.body(), media_type="application/json")
        response = case.call_and_validate(headers=ADMIN, checks=CHECKS)
        refused = [i for i, d in enumerate(request.documents) if over_bounds(d, rag.ingest)]
        if len(json.dumps(request.body()).encode()) > rag.server.max_body_bytes:
            assert response.status_code == 413, response.text[:2000]
        elif refused:
            assert response.status_code == 422, response.text[:2000]
            named = response.json()["fields"][0]["field"].split(".")
            assert named[0] == "documents" and int(named[1]) in refused, response.text[:2000]
        else:
            assert response.status_code in (200, 202), response.text[:2000]
            if response.status_code == 202:
                canary.wait_for(response.json()["job"], after="a wide write")
        written = set() if response.status_code in (413, 422) else set(request.ids())
        indexed = {str(m["doc_id"]) for m in served.sieve.store.metadata_of([], request.ids()).values()}
        assert (indexed, {d.doc_id for d in served.record.get(request.ids())}) == (written, written)
        canary.write_and_read(after=f"a wide write answered {response.status_code}")

    check()
