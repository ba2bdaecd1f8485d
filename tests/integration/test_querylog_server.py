"""The query log as a user runs it: a real `sieve serve` process with rag.querylog enabled on a free port,
queries over HTTP, the admin-only read route, SIGTERM; then `sieve golden sample --from-log` with the real
packaged embedder over the recorded sample log (golden_set/query-log.sample.jsonl)."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.evaluation.golden.cases import load_golden_set
from tests.fixtures.processes import stop_process
from tests.fixtures.seeded_store import seeded_store
from tests.fixtures.sieve_serve import EXIT_TIMEOUT_S, clean_env, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SIEVE = Path(sys.executable).with_name("sieve")
SAMPLE_LOG = REPO / "golden_set" / "query-log.sample.jsonl"
GOLDEN_SET = REPO / "golden_set" / "golden-set.json"
ADMIN_TOKEN = "querylog-it-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
QUERIES = [
    {"query": "病假工资怎么算", "knowledgeTag": "hr"},
    {"query": "How do I request a new laptop?", "topK": 3},
    {"query": "???"},
]


def test_a_server_with_the_query_log_on_writes_a_line_per_query_that_only_the_admin_reads(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_file = tmp_path / "querylog" / "queries.jsonl"
    env = clean_env(
        RAG__STORE__PATH=str(seeded_store(tmp_path / "store")),
        RAG__SERVER__JOBS_DIR=str(tmp_path / "jobs"),
        RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        RAG__EVALUATE__ENABLED="false",
        RAG__QUERYLOG__ENABLED="true",
        RAG__QUERYLOG__PATH=str(log_file),
    )
    server_log = tmp_path / "serve.log"
    with server_log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(proc, url, server_log)
        with httpx.Client(base_url=url, timeout=60) as client:
            answers = [client.post("/api/retrieve", json=body).json() for body in QUERIES]
            assert client.get("/api/querylog").status_code == 401
            wrong = client.get("/api/querylog", headers={"Authorization": "Bearer not-the-admin-token-42"})
            assert wrong.status_code == 401
            read = client.get("/api/querylog", params={"limit": 2}, headers=ADMIN)
        assert read.status_code == 200
        body = read.json()
        assert (body["enabled"], body["dropped"]) == (True, 0)
        assert [e["query"] for e in body["entries"]] == ["???", "How do I request a new laptop?"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(proc, EXIT_TIMEOUT_S)

    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    lines = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
    assert [(e["query"], e["knowledgeTag"], e["topK"]) for e in lines] == [
        ("病假工资怎么算", "hr", 5),
        ("How do I request a new laptop?", None, 3),
        ("???", None, 5),
    ]
    for entry, answer in zip(lines, answers, strict=True):
        assert [(r["chunkId"], r["docId"]) for r in entry["results"]] == [
            (d["chunkId"], d["docId"]) for d in answer["documents"]
        ]
        # no reranker is configured: the fused score ordered the list
        assert [(r["scoreKey"], r["score"]) for r in entry["results"]] == [
            ("fused", d["scores"]["fused"]) for d in answer["documents"]
        ]
        assert entry["abstained"] is (answer["documents"] == [])
        assert entry["latencyMs"] == answer["latencyMs"]
        assert entry["time"].endswith("Z")


def test_golden_sample_drafts_cases_from_the_recorded_sample_log(tmp_path: Path) -> None:
    out = tmp_path / "drafts.jsonl"
    kept = {"id": "mine-1", "query": "打印机怎么连接", "draft": True, "note": "already here"}
    out.write_text(json.dumps(kept, ensure_ascii=False) + "\n", encoding="utf-8")
    done = subprocess.run(
        [str(SIEVE), "golden", "sample", "--from-log", "10", "--log", str(SAMPLE_LOG), "--golden-set"]
        + [str(GOLDEN_SET), "--out", str(out)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout
    entries = [json.loads(line) for line in SAMPLE_LOG.read_text(encoding="utf-8").splitlines()]
    assert f"read {len(entries)} log entries from 1 file(s)" in printed
    assert "punctuation or digits only: 3 " in printed  # ???, 123, 。。。
    assert "too short (length < 3, a CJK character counting 2): 1 " in printed  # a
    # 打印机怎么连接 x3 (one with ？) is in the out file: its 2 repeats are exact duplicates, itself known;
    # "how many sick days do i get per year" repeats the question-marked one
    assert "exact duplicate: 3 " in printed
    assert "already in the out file: 1 " in printed
    assert "'How can I request a new laptop?' ~ 'How do I request a new laptop?'" in printed
    assert f"wrote {out} (1 -> 11 draft cases)" in printed

    golden = load_golden_set(out)
    assert golden.cases[0].id == "mine-1"  # appended after, never overwritten
    drafts = golden.cases[1:]
    assert len(drafts) == 10
    assert all(c.origin == "log" and c.draft and c.id.startswith("log-") for c in drafts)
    golden_queries = {c.query for c in load_golden_set(GOLDEN_SET).cases}
    assert not {c.query for c in drafts} & golden_queries
    assert {c.knowledge_tag for c in drafts} >= {"hr", "it", None}
