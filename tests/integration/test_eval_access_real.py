"""The evaluation of access scopes end to end: the real e5 embedder, an embedded Chroma and the real chain
over a four-document base with tenants and access lists; golden cases run as evaluation principals. A correct
filter leaks nothing (the gate's leak checks pass, the probe finds nothing); the same run with the
candidates' scope taken away fails the gate, naming case, principal and chunk; an expected document the
principal may not read is lost as ACL_FILTERED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.session import Outcome, evaluate
from app.service import Sieve
from app.settings import Settings, merge, nested
from app.store import ChromaStore
from tests.fixtures.api_app import make_settings

pytestmark = pytest.mark.integration

DOCS = {
    "hr-leave.md": (
        "acme",
        "[group:hr]",
        "Parental leave",
        "Parents get sixteen weeks of paid parental leave.",
    ),
    "sales-commission.md": (
        "acme",
        "[group:sales]",
        "Sales commission",
        "Account executives earn a commission of eight percent on closed deals.",
    ),
    "acme-hours.md": ("acme", "[public]", "Office hours", "The Acme office is open from eight to six."),
    "globex-leave.md": (
        "globex",
        "[public]",
        "Globex leave",
        "Globex staff get twelve weeks of paid parental leave.",
    ),
}
PRINCIPALS = {"hr": {"tenant": "acme", "groups": ["hr"]}, "sales": {"tenant": "acme", "groups": ["sales"]}}
CASES = [
    {
        "id": "hr-leave",
        "query": "how many weeks of parental leave",
        "principal": "hr",
        "expectedDocIds": ["hr-leave"],
    },
    {
        "id": "sales-commission",
        "query": "what commission do account executives earn",
        "principal": "sales",
        "expectedDocIds": ["sales-commission"],
    },
    {
        "id": "hr-asks-commission",
        "query": "what commission do account executives earn",
        "principal": "hr",
        "expectedDocIds": ["sales-commission"],
    },
    {"id": "hours", "query": "when is the office open", "expectedDocIds": ["acme-hours"]},
]


@pytest.fixture(scope="module")
def sieve(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[Sieve]:
    base = tmp_path_factory.mktemp("eval-access")
    kb = base / "kb"
    kb.mkdir()
    for name, (tenant, access, title, text) in DOCS.items():
        front = f"---\nid: {name[:-3]}\ntitle: {title}\ntenant: {tenant}\naccess: {access}\n---\n\n"
        (kb / name).write_text(front + f"# {title}\n\n{text}\n", encoding="utf-8")
    settings = settings_for(base, kb)
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    built = Sieve(settings, real_embedder, store, reranker=None)
    built.ingest([kb])
    assert built.store.count() == len(DOCS)
    yield built
    built.close()


def settings_for(base: Path, kb: Path) -> Settings:
    settings = make_settings(
        base / "store",
        base / "eval",
        nested("rag.ingest.paths", [str(kb)]),
        merge(
            nested("rag.access.eval_principals", PRINCIPALS),
            nested("rag.evaluate.baseline", "none"),
            nested("rag.evaluate.leak_probe", True),
            nested("rag.evaluate.sweep.enabled", False),
            nested("rag.evaluate.latency_sample", 0),
            nested("rag.evaluate.top_k", 3),
        ),
    )
    # exactly these principals: a mapping given here is merged into config/application.yml's (the sample's
    # hr-manager and sales-rep), and the leak probe runs every case as every evaluation principal
    settings.rag.access.eval_principals = settings.rag.access.model_validate(
        {"eval_principals": PRINCIPALS}
    ).eval_principals
    return settings


def run(sieve: Sieve) -> Outcome:
    golden = GoldenSet("t", [GoldenCase.model_validate(c) for c in CASES], "golden.json")
    return evaluate(sieve.evaluation_target(), sieve.settings.rag.evaluate, golden)


def test_a_correct_filter_leaks_nothing_and_an_out_of_scope_expectation_is_acl_filtered(sieve: Sieve) -> None:
    outcome = run(sieve)
    report = outcome.report
    access = report.access
    assert access is not None
    assert access.leaks == []
    assert access.probe is not None
    # the three cases of hr or sales as the other one, the unscoped case as both
    assert (access.probe.runs, access.probe.leaks, access.probe.errors) == (1 + 1 + 1 + 2, [], [])
    checks = {c.name: c for c in outcome.gate.checks}
    assert checks["max_access_leaks"].passed and checks["leak_probe"].passed
    by_id = {c.case.id: c for c in report.cases}
    assert by_id["hr-leave"].scores.metrics is not None and by_id["hr-leave"].scores.metrics["recall"] == 1.0
    assert [(x.id, x.where) for x in by_id["hr-asks-commission"].analysis.lost] == [
        ("sales-commission", "ACL_FILTERED")
    ]
    # hr reads its leave page and Acme's public one, never Globex's or the sales page
    returned = {d.doc_id for d in by_id["hr-leave"].outcome.ranked_documents}
    assert returned <= {"hr-leave", "acme-hours"}
    assert {s.name: s.cases for s in report.segments if s.kind == "principal"} == {
        "(unscoped)": 1,
        "hr": 2,
        "sales": 1,
    }


def test_the_same_run_without_the_candidates_scope_fails_the_leak_gate(
    sieve: Sieve, monkeypatch: pytest.MonkeyPatch
) -> None:
    candidates = sieve.chain.candidates
    generate_many = candidates.generate_many

    def unscoped(queries, embeddings, tags, principals=None):
        return generate_many(queries, embeddings, tags, [None] * len(queries))

    monkeypatch.setattr(candidates, "generate_many", unscoped)
    outcome = run(sieve)
    checks = {c.name: c for c in outcome.gate.checks}
    assert not outcome.gate.passed
    assert not checks["max_access_leaks"].passed
    assert not checks["leak_probe"].passed
    message = checks["max_access_leaks"].describe()
    assert "case hr-leave as hr: chunk " in message
    assert outcome.report.access is not None
    leaked_docs = {(x.case, x.doc_id) for x in outcome.report.access.leaks}
    assert ("hr-leave", "globex-leave") in leaked_docs
