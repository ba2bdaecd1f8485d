"""The golden-set audit end to end: the real packaged e5 embedder, a real embedded Chroma holding a small base
with one problem of each kind, `sieve eval` (the report's audit section and its recorded content hashes) and
`sieve golden check` after a document moved to a new id."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.cli import main, open_sieve, settings_with
from app.evaluation.session import evaluate
from app.settings import nested

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"

DOCS = {
    "hr/payroll.md": (
        "payroll",
        "Payroll",
        "hr",
        "hr-wiki",
        "active",
        "Salary is paid on the 10th of every month.",
    ),
    "hr/leave-old.md": (
        "leave-old",
        "Annual leave",
        "hr",
        "hr-wiki",
        "active",
        "Every employee gets 15 days.",
    ),
    "it/vpn.md": ("vpn", "VPN setup", "it", "it-wiki", "active", "Install HexaConnect, then sign in."),
    "it/vpn-mirror.md": (
        "vpn-mirror",
        "VPN setup",
        "it",
        "mirror",
        "active",
        "Install HexaConnect, then sign in.",
    ),
    "it/printer.md": ("printer", "Printers", "it", "it-wiki", "active", "The printers are on floor 3."),
    "travel/travel-2022.md": ("travel-2022", "Meals", "travel", "portal", "retired", "Meals: 80 a day."),
    "facilities/canteen.md": (
        "canteen",
        "Canteen",
        "facilities",
        "fm",
        "active",
        "The canteen opens at 11:30.",
    ),
}

CASES = [
    {"id": "pay-1", "query": "When is salary paid?", "group": "pay", "expectedDocIds": ["payroll"]},
    {"id": "pay-2", "query": "When does salary get paid?", "group": "pay", "expectedDocIds": ["payroll"]},
    {"id": "pay-4", "query": "When is the salary paid?", "expectedDocIds": ["payroll"]},
    {"id": "leave-1", "query": "How many days of annual leave do I get?", "expectedDocIds": ["leave-old"]},
    {"id": "leave-2", "query": "how many days of annual leave do I get", "expectedDocIds": ["leave-old"]},
    {"id": "vpn-1", "query": "How do I set up the VPN?", "group": "vpn", "expectedDocIds": ["vpn"]},
    {
        "id": "vpn-2",
        "query": "How do I install the VPN client?",
        "group": "vpn",
        "expectedDocIds": ["vpn-mirror"],
        "forbiddenDocIds": ["vpn"],
    },
    {
        "id": "travel-1",
        "query": "What is the meal allowance on business trips?",
        "expectedDocIds": ["travel-2022"],
    },
]


def write_doc(path: Path, doc_id: str, title: str, tag: str, source: str, status: str, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"---\nid: {doc_id}\ntitle: {title}\nsource: {source}\nknowledge: {tag}\nstatus: {status}\n"
        f"effectiveFrom: 2020-01-01\neffectiveTo:\n---\n\n# {title}\n\n## Policy\n\n{body}\n",
        encoding="utf-8",
    )


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_embedder) -> dict[str, Path]:
    kb = tmp_path / "kb"
    for rel, fields in DOCS.items():
        write_doc(kb / rel, *fields)
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"datasetVersion": "t", "cases": CASES}), encoding="utf-8")
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    out = tmp_path / "reports"
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(out))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setenv("RAG__INGEST__ON_STARTUP", "false")
    monkeypatch.setenv("RAG__EVALUATE__AS_OF", "2026-01-01")
    monkeypatch.setenv("RAG__EVALUATE__LATENCY_SAMPLE", "0")
    monkeypatch.setattr("app.service.load_embedder", lambda settings: real_embedder)
    return {"kb": kb, "golden": golden, "out": out}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_records_content_and_check_remaps_a_moved_document(base, capsys) -> None:
    kb, golden, out = base["kb"], str(base["golden"]), base["out"]
    assert run(capsys, "ingest", str(kb))[0] == 0

    code, stdout, err = run(capsys, "eval", "--golden-set", golden)
    assert code in (0, 1), err  # 1: the forbidden vpn reaches vpn-2's top K, a gate failure
    assert "golden-set audit: 8 findings" in stdout
    report = json.loads((out / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["audit"]["ran"] is True
    assert report["audit"]["findings"]["staleIds"] == 0
    content = {c["id"]: c["expectedContent"] for c in report["cases"]}
    leave_hash = content["leave-1"]["leave-old"]
    assert len(leave_hash) == 64 and content["leave-2"] == {"leave-old": leave_hash}
    assert "## Golden-set audit" in (out / "retrieval-eval-latest.md").read_text(encoding="utf-8")

    # the leave policy moves to a new id with the same text; the old id's chunks leave the index
    (kb / "hr" / "leave-old.md").unlink()
    _, title, tag, source, status, body = DOCS["hr/leave-old.md"]
    write_doc(kb / "hr" / "leave-new.md", "leave-new", title, tag, source, status, body)
    assert run(capsys, "ingest", str(kb))[0] == 0
    # a second evaluation carries the recorded hash of the now stale id forward
    run(capsys, "eval", "--golden-set", golden)
    report = json.loads((out / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert {c["id"]: c["expectedContent"] for c in report["cases"]}["leave-1"] == {"leave-old": leave_hash}

    code, stdout, err = run(capsys, "golden", "check", "--golden-set", golden, "--json")
    assert code == 0, err
    audit = json.loads(stdout)
    remap = {"ids": ["leave-new"], "by": "contentHash", "guess": False}
    assert [(s["case"], s["id"], s["suggestion"]) for s in audit["staleIds"]] == [
        ("leave-1", "leave-old", remap),
        ("leave-2", "leave-old", remap),
    ]
    assert audit["duplicateQueries"] == [
        {"normalised": "how many days of annual leave do i get", "cases": ["leave-1", "leave-2"]}
    ]
    # measured e5 cosines: pay-1/pay-4 0.9965, pay-2/pay-4 0.9799, pay-1/pay-2 0.9837, vpn-1/vpn-2 0.9537
    assert [p["cases"] for p in audit["nearDuplicateQueries"]] == [["pay-1", "pay-4"], ["pay-2", "pay-4"]]
    assert [(p["group"], p["cases"]) for p in audit["paraphrases"]] == [
        ("pay", ["pay-1", "pay-2"]),
        ("vpn", ["vpn-1", "vpn-2"]),
    ]
    assert all(p["cosine"] >= 0.95 for p in audit["nearDuplicateQueries"] + audit["paraphrases"])
    assert audit["hardFilterExcluded"] == [
        {"case": "travel-1", "id": "travel-2022", "level": "doc", "reasons": ["status=retired"]}
    ]
    assert audit["contentCopies"] == [
        {
            "case": "vpn-1",
            "id": "vpn",
            "role": "relevant",
            "copies": ["vpn-mirror"],
            "unjudgedCopies": ["vpn-mirror"],
        },
        {"case": "vpn-2", "id": "vpn-mirror", "role": "relevant", "copies": ["vpn"], "unjudgedCopies": []},
        {"case": "vpn-2", "id": "vpn", "role": "forbidden", "copies": ["vpn-mirror"], "unjudgedCopies": []},
    ]
    assert audit["relevantAndForbidden"] == [
        {"group": "vpn", "id": "vpn", "relevantIn": ["vpn-1"], "forbiddenIn": ["vpn-2"]}
    ]
    assert audit["coverage"] == {
        "documents": 7,
        "untouchedCount": 3,
        "untouchedDocuments": ["canteen", "leave-new", "printer"],
        "tags": [
            {"tag": "facilities", "documents": 1, "untouchedDocuments": 1, "cases": 0},
            {"tag": "hr", "documents": 2, "untouchedDocuments": 1, "cases": 3},
            {"tag": "it", "documents": 3, "untouchedDocuments": 1, "cases": 2},
            {"tag": "travel", "documents": 1, "untouchedDocuments": 0, "cases": 1},
        ],
        "untouchedTags": ["facilities"],
    }
    assert audit["findings"] == {
        "duplicateQueries": 1,
        "nearDuplicateQueries": 2,
        "staleIds": 2,
        "hardFilterExcluded": 1,
        "contentCopies": 3,
        "relevantAndForbidden": 1,
    }

    code, stdout, _ = run(capsys, "golden", "check", "--golden-set", golden)
    assert code == 0
    assert "  leave-1: expectedDocIds 'leave-old': same content now under leave-new" in stdout.splitlines()
    assert stdout.splitlines()[-1].startswith(
        "summary: 10 findings (duplicate queries 1, near-duplicate queries 2"
    )
    assert run(capsys, "golden", "check", "--golden-set", golden, "--strict")[0] == 1

    # the service's evaluation (startup, POST /api/evaluations) audits with the same function
    settings = settings_with(nested("rag.evaluate.resource_location", golden))
    sieve = open_sieve(settings)
    try:
        outcome = evaluate(sieve.evaluation_target(), settings.rag.evaluate)
    finally:
        sieve.close()
    assert outcome.report is not None and outcome.report.audit is not None
    assert outcome.report.audit.findings == audit["findings"]
    assert outcome.report.to_json()["audit"]["staleIds"] == audit["staleIds"]
