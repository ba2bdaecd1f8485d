"""`POST /api/evaluations/runs` (what `sieve eval --server` calls) on the real app around a fake Sieve: who
may call it, the body that adjusts one run's `rag.evaluate`, the refusals (bad body, busy, not ready), and the
answer built from the evaluation's outcome. The evaluation itself is a stand-in here; the real one over HTTP
is in tests/integration/test_cli_server.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.evaluations import EvaluationRunRequest
from app.evaluation.compare.gate import GateCheck, GateResult
from app.evaluation.report.model import Report, Summary
from app.evaluation.session import Outcome
from app.main import create_app
from app.settings import EvaluateSettings, Settings
from tests.fixtures.fake_api import (
    ADMIN_TOKEN,
    FakeSieve,
    api_settings,  # noqa: F401  (the `settings` fixture)
    serve_fake,
)

ROUTE = "/api/evaluations/runs"
# the report's summary as its JSON holds it (every figure, these set)
SUMMARY = Summary.model_validate(
    {
        "cases": 3,
        "succeeded": 3,
        "failed": 0,
        "recall": 1.0,
        "mrr": 0.5,
        "ndcg": 0.75,
        "hitRate": 1.0,
        "latencyMs": {"p50": 12.0, "p95": 20.0},
        "noAnswer": {"cases": 0, "correctAbstentionRate": None},
        "forbidden": {"hits": 0},
    }
).to_json()


class EvaluatedSieve(FakeSieve):
    def evaluation_target(self) -> str:
        return "the target"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, EvaluateSettings]]:
    """Each call of the evaluation: its target and settings; it answers with a fixed outcome."""
    calls: list[tuple[Any, EvaluateSettings]] = []
    gate = GateResult(
        checks=[
            GateCheck("min_ndcg", "ndcg", ">=", 0.9, 0.75, passed=False),
            GateCheck(
                "no_answer_policy", "noAnswer", ">=", 1, 0, passed=False, message="0 of 1", severity="warn"
            ),
        ],
        notes=["max_drop: no baseline"],
    )

    def run(target: Any, settings: EvaluateSettings, progress: Any = None) -> Outcome:
        calls.append((target, settings))
        report = {"summary": SUMMARY, "comparison": None, "baselineNote": "rag.evaluate.baseline is none"}
        typed = Report.model_validate({"run": {}, **report})
        return Outcome(
            report=typed,
            gate=gate,
            paths=[Path("out/r-latest.json")],
            invalid_golden_set=None,
            promotion="baseline kept: this run did not replace out/r-passing.json (the gate failed); ...",
        )

    monkeypatch.setattr("app.evaluation.session.evaluate", run)
    return calls


@pytest.fixture
def client(settings: Settings) -> Any:  # noqa: F811
    with serve_fake(EvaluatedSieve(settings)) as c:
        yield c


def test_a_run_answers_with_the_lines_files_and_gate_of_its_outcome(
    client: TestClient, runs: list[tuple[Any, EvaluateSettings]]
) -> None:
    response = client.post(ROUTE, json={"topK": 3, "baseline": "none", "minNdcg": 0.9, "maxP95Ms": 50})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "lines": [
            "done cases=3 succeeded=3 failed=0 avgRecall=1.00 avgMRR=0.50 avgNDCG=0.75 hitRate=1.00 "
            "p50=12ms p95=20ms",
            "no baseline: rag.evaluate.baseline is none",
            "baseline kept: this run did not replace out/r-passing.json (the gate failed); ...",
        ],
        "reports": ["out/r-latest.json"],
        "gate": {
            "passed": False,
            "failures": ["min_ndcg: ndcg=0.7500, needs >= 0.9"],
            "warnings": ["no_answer_policy: 0 of 1"],
            "notes": ["max_drop: no baseline"],
        },
        "summary": SUMMARY,
    }
    [(target, ran)] = runs
    assert target == "the target"
    assert (ran.top_k, ran.baseline) == (3, "none")
    assert (ran.thresholds.min_ndcg, ran.thresholds.max_p95_ms, ran.thresholds.min_recall) == (
        0.9,
        50.0,
        None,
    )


def test_without_a_body_the_run_keeps_the_servers_settings(
    client: TestClient,
    runs: list[tuple[Any, EvaluateSettings]],
    settings: Settings,  # noqa: F811
) -> None:
    assert client.post(ROUTE).status_code == 200
    assert runs[0][1] == settings.rag.evaluate


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"topK": 0}, "topK"),
        ({"baseline": "/etc/passwd"}, "baseline"),
        ({"minRecall": 1.5}, "minRecall"),
        ({"goldenSet": "other.json"}, "goldenSet"),
        ({"topK": "5"}, "topK"),
    ],
    ids=["top-k-0", "baseline-file", "recall-above-1", "unknown-field", "string-top-k"],
)
def test_a_bad_body_is_422_naming_the_field_and_runs_nothing(
    client: TestClient, runs: list[tuple[Any, EvaluateSettings]], body: dict[str, Any], field: str
) -> None:
    response = client.post(ROUTE, json=body)
    assert response.status_code == 422, response.text
    assert [f["field"] for f in response.json()["fields"]] == [field]
    assert runs == []


@pytest.mark.parametrize(
    ("headers", "status"), [({"Authorization": "Bearer wrong"}, 401), ({"Authorization": ""}, 401)]
)
def test_the_admin_token_is_needed(
    client: TestClient, runs: list[tuple[Any, EvaluateSettings]], headers: dict[str, str], status: int
) -> None:
    assert client.post(ROUTE, headers=headers).status_code == status
    assert runs == []


def test_a_run_while_another_write_holds_the_lock_is_409(
    client: TestClient, runs: list[tuple[Any, EvaluateSettings]]
) -> None:
    state = client.app.state.sieve_state  # type: ignore[attr-defined]
    with state.write_lock:
        response = client.post(ROUTE)
    assert (response.status_code, response.json()) == (
        409,
        {"error": "an evaluation or ingest is already running"},
    )
    assert runs == []


def test_a_golden_set_that_cannot_run_is_422_with_its_reason(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(target: Any, settings: EvaluateSettings, progress: Any = None) -> SimpleNamespace:
        return SimpleNamespace(invalid_golden_set="golden.json line 3: case q1: query must not be blank")

    monkeypatch.setattr("app.evaluation.session.evaluate", broken)
    response = client.post(ROUTE)
    assert (response.status_code, response.json()["error"]) == (
        422,
        "golden.json line 3: case q1: query must not be blank",
    )


def test_the_request_applies_only_what_it_sets() -> None:
    base = EvaluateSettings()
    assert EvaluationRunRequest().apply(base) == base
    changed = EvaluationRunRequest(minRecall=0.8, maxDuplicateRate=0.1).apply(base)
    assert changed.thresholds.min_recall == 0.8
    assert changed.thresholds.max_duplicate_rate == 0.1
    assert changed.model_copy(update={"thresholds": base.thresholds}) == base


def test_a_server_still_starting_is_503_with_its_phase(
    settings: Settings,  # noqa: F811
    runs: list[tuple[Any, EvaluateSettings]],
) -> None:
    app = create_app(settings, start=lambda state: None)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        response = client.post(ROUTE)
    assert (response.status_code, response.json()) == (503, {"error": "not ready: starting"})
    assert runs == []
