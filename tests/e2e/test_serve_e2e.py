"""`sieve serve --evaluate` as a user runs it: a real process on a free port, its log in a file, the reports
on disk, the API over HTTP, then SIGTERM. Each test gets its own store (a copy of the ingested sample base)
and its own report folder, through the environment."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app import exit_codes
from tests.fixtures.processes import stop_process
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
GOLDEN_SET = REPO / "golden_set" / "golden-set.json"
SIEVE = Path(sys.executable).with_name("sieve")
STAGE_NAMES = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]
READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 20.0
ADMIN_TOKEN = "e2e-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# -- the seeded store (same helper in tests/integration/test_api.py and tests/integration/test_cli.py) -----


# -- the server process ------------------------------------------------------------------------------------


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: Path
    output_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"sieve serve exited with {self.proc.returncode} before ready:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"sieve serve not ready after {READY_TIMEOUT_S:.0f}s:\n{self.tail()}")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"sieve serve still running after {timeout:.0f}s:\n{self.tail()}")


@pytest.fixture
def serve(tmp_path: Path, free_port: Callable[[], int]) -> Iterator[Callable[..., Server]]:
    """`serve(**env)` starts `sieve serve --evaluate --port <free>` from the repo root with this test's
    store and report folder (plus `env`); every server started is stopped at teardown."""
    started: list[subprocess.Popen] = []

    def start(**extra_env: str) -> Server:
        port = free_port()
        output_dir = tmp_path / "retrieval-eval"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
        env |= {
            # a second start in the same test reuses the store, as a second `make run` does
            "RAG__STORE__PATH": str(store if (store := tmp_path / "store").exists() else seeded_store(store)),
            "RAG__EVALUATE__OUTPUT_DIR": str(output_dir),
            "RAG__MODELS__CACHE_DIR": str(MODELS_CACHE),
            "RAG__SERVER__JOBS_DIR": str(tmp_path / "jobs"),
            "RAG__SERVER__ADMIN_TOKEN": ADMIN_TOKEN,
            **extra_env,
        }
        log_path = tmp_path / "serve.log"
        with log_path.open("wb") as log:  # a file, not a pipe: nobody drains a pipe while we poll
            proc = subprocess.Popen(
                [str(SIEVE), "serve", "--evaluate", "--port", str(port)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(proc)
        return Server(proc, f"http://127.0.0.1:{port}", log_path, output_dir)

    yield start
    for proc in started:
        stop_process(proc, EXIT_TIMEOUT_S)


@contextmanager
def api(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def golden_case_count(path: Path = GOLDEN_SET) -> int:
    return len(json.loads(path.read_text(encoding="utf-8"))["cases"])


# -- the used-by flow --------------------------------------------------------------------------------------

CASE_LINE = re.compile(
    r"\[RetrievalEval\] case done \[(\d+)/(\d+)\] caseId=(\S+), traceId=([0-9a-f]{16}), "
    r"(?:Recall@\d+=\d\.\d\d, MRR=\d\.\d\d, nDCG@\d+=\d\.\d\d|noAnswer=[^,]+), latency=\d+ms$"
)
SUMMARY_LINE = re.compile(
    r"\[RetrievalEval\] done cases=(?P<cases>\d+) succeeded=(?P<succeeded>\d+) failed=(?P<failed>\d+) "
    r"avgRecall=(?P<recall>\S+) avgMRR=(?P<mrr>\S+) avgNDCG=(?P<ndcg>\S+) hitRate=(?P<hitRate>\S+) "
    r"p50=(?P<p50>\d+)ms p95=(?P<p95>\d+)ms"
)


def test_serve_evaluates_at_startup_reports_and_answers_queries(serve) -> None:
    server = serve()
    server.wait_ready()
    cases = golden_case_count()

    # the log: one line per case, one summary, then where the reports are
    log = server.log()
    case_lines = [line for line in log.splitlines() if "[RetrievalEval] case done" in line]
    assert len(case_lines) == cases, server.tail()
    assert "[RetrievalEval] case done [1/" in log
    matches = [CASE_LINE.search(line) for line in case_lines]
    assert all(matches), [line for line, m in zip(case_lines, matches, strict=True) if not m]
    assert sorted(int(m[1]) for m in matches) == list(range(1, cases + 1))
    assert {int(m[2]) for m in matches} == {cases}
    assert any("Recall@" in line and "MRR=" in line and "nDCG@" in line for line in case_lines)
    summaries = [line for line in log.splitlines() if "[RetrievalEval] done cases=" in line]
    assert len(summaries) == 1, summaries
    summary_match = SUMMARY_LINE.search(summaries[0])
    assert summary_match, summaries[0]
    after_summary = log[log.index(summaries[0]) :]
    latest_json = server.output_dir / "retrieval-eval-latest.json"
    latest_md = server.output_dir / "retrieval-eval-latest.md"
    assert f"[RetrievalEval] report {latest_json}" in after_summary
    assert f"[RetrievalEval] report {latest_md}" in after_summary
    latest_html = server.output_dir / "retrieval-eval-latest.html"
    assert f"[RetrievalEval] report {latest_html}" in after_summary

    # the JSON report
    report = json.loads(latest_json.read_text(encoding="utf-8"))
    assert report["schemaVersion"] == 3
    assert report["status"] == "ok"
    summary = report["summary"]
    for key in ("cases", "recall", "hitRate", "mrr", "ndcg", "precision", "top1Accuracy", "duplicateRate"):
        assert key in summary
    assert set(summary["latencyMs"]) >= {"p50", "p95", "max"}
    assert {"cases", "correctAbstentionRate", "falseAnswerRate"} <= set(summary["noAnswer"])
    assert summary["cases"] == cases == len(report["cases"])
    stages = report["stages"]
    assert all({"name", "removed", "removedRelevant", "latencyMs"} <= set(s) for s in stages)
    assert [s["name"] for s in stages if s["name"] in STAGE_NAMES] == STAGE_NAMES
    for case in report["cases"]:
        assert {"id", "query", "metrics", "rankedDocuments", "filterStats", "lost"} <= set(case)
        assert [s["name"] for s in case["filterStats"]] == STAGE_NAMES
    # one id per case, the same in the server's log and in the report
    assert {m[3]: m[4] for m in matches} == {c["id"]: c["traceId"] for c in report["cases"]}

    # the log's figures are the report's
    got = summary_match.groupdict()
    assert int(got["cases"]) == summary["cases"]
    assert int(got["succeeded"]) == summary["succeeded"]
    assert int(got["failed"]) == summary["failed"]
    for key in ("recall", "mrr", "ndcg", "hitRate"):
        assert got[key] == f"{summary[key]:.2f}", key
    assert got["p50"] == f"{summary['latencyMs']['p50']:.0f}"
    assert got["p95"] == f"{summary['latencyMs']['p95']:.0f}"

    # timestamped copies beside -latest, with the same content
    for suffix in ("json", "md"):
        stamped = list(server.output_dir.glob(f"retrieval-eval-2*.{suffix}"))
        assert len(stamped) == 1, stamped
        assert re.fullmatch(rf"retrieval-eval-\d{{8}}T\d{{6}}Z\.{suffix}", stamped[0].name)
        latest = server.output_dir / f"retrieval-eval-latest.{suffix}"
        assert stamped[0].read_bytes() == latest.read_bytes()

    # the Markdown
    markdown = latest_md.read_text(encoding="utf-8")
    assert "## Summary" in markdown and "| Metric | Value |" in markdown
    assert f"| nDCG@K | {summary['ndcg']:.3f} |" in markdown  # a case has its own topK: "at each case's K"
    assert "## Per-stage filter statistics" in markdown
    for name in STAGE_NAMES:
        assert f"| {name} |" in markdown
    assert "## Worst cases" in markdown
    # per-case detail stays in the JSON (rag.evaluate.report.case_detail is off by default)
    assert not [line for line in markdown.splitlines() if line.startswith("### ")]
    assert (
        f"Every case's ranking, trace and judgments ({len(report['cases'])} cases) are in the JSON"
        in markdown
    )

    # the API, in both languages
    with api(server) as client:
        zh = client.post("/api/retrieve", json={"query": "工资什么时候发"})
        assert zh.status_code == 200
        assert zh.json()["documents"][0]["docId"] == "hr-payroll-zh"
        en = client.post("/api/retrieve", json={"query": "When is salary paid?"})
        assert en.status_code == 200
        assert "hr-payroll-en" in [d["docId"] for d in en.json()["documents"][:2]]
        assert client.get("/api/evaluations/latest", headers=ADMIN).json() == report

    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(EXIT_TIMEOUT_S) == 0, server.tail()


BASELINE_LOG_LINE = re.compile(
    r"\[RetrievalEval\] vs baseline (?P<when>\S+) \((?P<paired>\d+) paired[^)]*\): "
    r"nDCG@(?:K|\d+) \d\.\d{3} -> \d\.\d{3} "
    r"\([+-]\d\.\d{3}, 95% CI \[-?\d\.\d{3}, -?\d\.\d{3}\], p=[\d.e-]+, adjusted [\d.e-]+\) "
    r"fixed=\d+ broken=\d+"
    r"(?:; \d+ of the \d+ new top-K documents are unjudged(?: \(unverified regressions: [^)]+\))?)?$",
    re.MULTILINE,
)


def test_second_start_compares_itself_with_the_first(serve) -> None:
    first = serve()
    first.wait_ready()
    assert "[RetrievalEval] no baseline: no passing report yet" in first.log()
    first_report = json.loads((first.output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert first_report["comparison"] is None
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait_exit(EXIT_TIMEOUT_S) == 0, first.tail()

    second = serve()
    second.wait_ready()
    match = BASELINE_LOG_LINE.search(second.log())
    assert match, second.tail()
    assert match["when"] == first_report["run"]["evaluatedAt"]
    assert "[RetrievalEval] baseline: last passing report " in second.log()
    report = json.loads((second.output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    comparison = report["comparison"]
    assert comparison["baseline"]["evaluatedAt"] == first_report["run"]["evaluatedAt"]
    assert comparison["comparable"] and comparison["pairedCases"] == int(match["paired"])
    assert not [d for d in comparison["differences"] if d.startswith("rag.")]  # same settings both times
    stamped = sorted(p for p in second.output_dir.glob("retrieval-eval-2*.json"))
    assert len(stamped) == 2
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait_exit(EXIT_TIMEOUT_S) == 0, second.tail()


def test_failed_gate_with_fail_on_gate_stops_the_server_non_zero(serve) -> None:
    server = serve(RAG__EVALUATE__FAIL_ON_GATE="true", RAG__EVALUATE__THRESHOLDS__MIN_NDCG="0.999")
    assert server.wait_exit(READY_TIMEOUT_S) == exit_codes.GATE_FAILED, server.tail()
    log = server.log()
    assert re.search(r"\[RetrievalEval\] gate FAILED min_ndcg: ndcg=0\.\d{4}, needs >= 0\.999", log), (
        server.tail()
    )
    report = json.loads((server.output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["gate"]["passed"] is False
    assert [f["check"] for f in report["gate"]["failures"]] == ["min_ndcg"]


def test_broken_golden_set_is_reported_and_the_service_still_serves(serve, tmp_path: Path) -> None:
    data = json.loads(GOLDEN_SET.read_text(encoding="utf-8"))
    duplicated = dict(data["cases"][2])
    data["cases"].append(duplicated)
    broken = tmp_path / "broken-golden.json"
    broken.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    server = serve(RAG__EVALUATE__RESOURCE_LOCATION=str(broken))
    server.wait_ready()
    log = server.log()
    not_run = [line for line in log.splitlines() if "[RetrievalEval] not run:" in line]
    assert len(not_run) == 1, server.tail()
    assert str(broken) in not_run[0]
    assert f"duplicate id '{duplicated['id']}'" in log
    assert "[RetrievalEval] done cases=" not in log

    report = json.loads((server.output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["status"] == "invalid"
    assert str(broken) in report["error"]
    assert f"duplicate id '{duplicated['id']}'" in report["error"]
    assert report["cases"] == []
    markdown = (server.output_dir / "retrieval-eval-latest.md").read_text(encoding="utf-8")
    assert "**Nothing ran:" in markdown

    with api(server) as client:
        response = client.post("/api/retrieve", json={"query": "工资什么时候发"})
        assert response.status_code == 200
        assert response.json()["documents"][0]["docId"] == "hr-payroll-zh"
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(EXIT_TIMEOUT_S) == 0, server.tail()


# -- a large write, then SIGTERM ---------------------------------------------------------------------------


def big_document(doc_id: str, sections: int) -> dict[str, str]:
    """A Markdown document of `sections` sections, one chunk each."""
    body = "\n\n".join(
        f"## Topic {i}\n\nThe archive procedure number {i} describes how folder {i} is stored and retrieved."
        for i in range(sections)
    )
    return {"id": doc_id, "title": "Archive procedures", "text": body, "knowledge": "archive"}


# A job stopped by SIGTERM keeps the batches it committed (rag.ingest.commit_chunks, whole documents each) and
# is a promise still: the next start runs it again from the document record, embedding only the rest.
def test_sigterm_during_a_large_write_stops_in_time_and_the_job_ends_done_after_the_restart(serve) -> None:
    shutdown_seconds = 8  # headroom for a loaded machine; the assertion is against this same figure
    commit, per_document, count = 32, 10, 30  # batches of 3 whole documents (30 chunks)
    env = {"RAG__SERVER__SHUTDOWN_SECONDS": str(shutdown_seconds), "RAG__INGEST__COMMIT_CHUNKS": str(commit)}
    server = serve(**env)
    server.wait_ready()
    documents = [big_document(f"archive-{i:02d}", per_document) for i in range(count)]
    with api(server) as client:
        accepted = client.post("/api/documents", json={"documents": documents}, headers=ADMIN)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job"]
        deadline = time.monotonic() + 600
        while (
            client.get(f"/api/jobs/{job_id}", headers=ADMIN).json()["progress"]["stored"] < 3 * per_document
        ):
            assert time.monotonic() < deadline, server.tail()
            time.sleep(0.2)
        # the write is under way: a query still gets through
        assert client.post("/api/retrieve", json={"query": "工资什么时候发"}).status_code == 200

    stop_asked = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(shutdown_seconds + 10) == 0, server.tail()
    took = time.monotonic() - stop_asked
    assert took < shutdown_seconds, f"stopped after {took:.1f}s:\n{server.tail()}"
    assert f"job {job_id} stopped by the shutdown, resumes at the next start" in server.log()

    again = serve(**env)
    again.wait_ready()
    with api(again) as client:
        deadline = time.monotonic() + 900
        while (done := client.get(f"/api/jobs/{job_id}", headers=ADMIN).json())["state"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, again.tail()
            time.sleep(0.5)
        assert (done["state"], done["resumed"]) == ("done", 1), done
        report = done["report"]
        total = count * per_document
        assert report["chunks"] == total and report["added"] + report["unchanged"] == total, report
        # what the first run committed is not embedded again, and it committed whole documents
        assert report["unchanged"] >= 3 * per_document and report["unchanged"] % per_document == 0, report
        after = client.post(
            "/api/retrieve", json={"query": "archive procedure", "knowledgeTag": "archive", "topK": 50}
        ).json()
        assert after["documents"] and all(d["docId"].startswith("archive-") for d in after["documents"]), (
            after
        )
    again.proc.send_signal(signal.SIGTERM)
    assert again.wait_exit(EXIT_TIMEOUT_S) == 0, again.tail()
