"""Schemathesis against /openapi.json: generated valid and invalid requests for every operation, on the real
app over a real Sieve (the packaged e5 embedder, an embedded Chroma holding a copy of the sample base).
Checks: no 5xx, every status code and content type declared, every body valid against its declared schema, and
requests that break the schema rejected with a 4xx.

Bounded: `MAX_EXAMPLES` per operation and per mode (positive, negative); about a minute on 2 busy cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from app.main import create_app
from app.service import Sieve
from app.settings import load_settings, merge, nested
from app.store import ChromaStore
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
MAX_EXAMPLES = 30
ADMIN_TOKEN = "schemathesis-admin-token"
# a real evaluation per generated request would take minutes: that operation gets no valid token (401)
NO_TOKEN_FOR = {"POST /api/evaluations", "POST /api/evaluations/runs"}


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


@pytest.fixture(scope="module")
def ready_app(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[object]:
    """The real app, its state set to ready over a real Sieve (no startup thread, no lifespan needed)."""
    base = tmp_path_factory.mktemp("schemathesis")
    app_settings = load_settings(
        merge(
            nested("rag.store.path", str(seeded_store(base / "store"))),
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
    sieve = Sieve(app_settings, real_embedder, store, reranker=None)
    app = create_app(app_settings, start=lambda state: None)
    state = app.state.sieve_state
    state.sieve, state.phase, state.ready = sieve, "ready", True
    yield app
    sieve.close()


@pytest.fixture(scope="module")
def api_schema(ready_app: object) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", ready_app)


def test_the_schema_lists_every_operation(api_schema: schemathesis.BaseSchema) -> None:
    operations = {op.ok().label for op in api_schema.get_all_operations()}
    assert {"GET /health", "GET /ready", "POST /api/retrieve", "POST /api/documents"} <= operations


def exercise(operation: schemathesis.APIOperation, mode: GenerationMode, headers: dict[str, str]) -> None:
    """MAX_EXAMPLES generated requests to `operation`, each checked with CHECKS."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    check()


# (strategies driven by hand rather than `schema.parametrize()`: its lazy fixture loader does not run on
# pytest 9, and this way every operation the app declares is covered, including ones added later)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_generated_request_gets_a_5xx_or_an_undeclared_answer(
    api_schema: schemathesis.BaseSchema, mode: GenerationMode
) -> None:
    tested, nothing_to_negate = [], []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        headers = {} if operation.label in NO_TOKEN_FOR else {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        try:
            exercise(operation, mode, headers)
        except Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise
            nothing_to_negate.append(operation.label)  # no parameters and no body: no invalid request
        else:
            tested.append(operation.label)
    assert {"POST /api/retrieve", "POST /api/documents"} <= set(tested), (tested, nothing_to_negate)
