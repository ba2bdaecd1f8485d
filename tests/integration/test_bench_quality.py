"""`scripts/bench_quality.py` (what `make bench-quality` runs) end to end, as a subprocess, on two tiny
BEIR directories named like the real ones: the real e5 model, a real embedded store, a copy of
docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MODELS_CACHE, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_beir(root: Path, corpus: list[dict], queries: list[dict], qrels: dict[str, str]) -> None:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus), encoding="utf-8")
    (root / "queries.jsonl").write_text(
        "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries), encoding="utf-8"
    )
    lines = "".join(f"{q}\t{d}\t1\n" for q, d in qrels.items())
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines, encoding="utf-8")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    write_beir(
        root / "scifact",
        [
            {"_id": "d1", "title": "Photosynthesis", "text": "Plants turn sunlight and water into sugar."},
            {"_id": "d2", "title": "Volcanoes", "text": "Magma rises through the crust and erupts as lava."},
            {"_id": "d3", "title": "Tides", "text": "The moon's gravity pulls the oceans and causes tides."},
        ],
        [{"_id": "q1", "text": "how do plants make sugar"}, {"_id": "q2", "text": "what causes tides"}],
        {"q1": "d1", "q2": "d3"},
    )
    write_beir(
        root / "xquad-zh",
        [
            {"_id": "z1", "title": "", "text": "员工工资每月十日发放，遇节假日提前。"},
            {"_id": "z2", "title": "", "text": "火山喷发时岩浆冲出地壳形成熔岩。"},
        ],
        [{"_id": "zq1", "text": "工资什么时候发"}, {"_id": "zq2", "text": "火山为什么喷发"}],
        {"zq1": "z1", "zq2": "z2"},
    )
    return root


def run_script(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
    env |= {"RAG__MODELS__CACHE_DIR": str(MODELS_CACHE), **env_extra}
    return subprocess.run(
        [sys.executable, "scripts/bench_quality.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_quality_fills_the_results_block_and_leaves_the_rest_of_the_file(datasets, tmp_path):
    doc = tmp_path / "benchmarks.md"
    original = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    doc.write_text(original, encoding="utf-8")

    done = run_script(
        "--datasets",
        str(datasets),
        "--doc",
        str(doc),
        env_extra={"RAG__STORE__PATH": str(tmp_path / "store")},
    )

    assert done.returncode == 0, done.stderr
    text = doc.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- bench-quality-results:begin -->\n(.*)\n<!-- bench-quality-results:end -->", text, re.S
    )
    assert block is not None
    # everything outside the results block is the original text
    outside = re.sub(
        r"<!-- bench-quality-results:begin -->.*<!-- bench-quality-results:end -->", "", text, flags=re.S
    )
    expected = re.sub(
        r"<!-- bench-quality-results:begin -->.*<!-- bench-quality-results:end -->", "", original, flags=re.S
    )
    assert outside == expected
    body = block.group(1)
    assert "### scifact (test split, 2 queries, 3 chunks)" in body
    assert "### xquad-zh (test split, 2 queries, 2 chunks)" in body
    rows = {
        line.split(" | ")[0].lstrip("| ").split(" (")[0]: line for line in body.splitlines() if "|" in line
    }
    for name in (
        "BM25 alone",
        "dense alone",
        "hybrid",
        "**default chain**",
        "default - bm25",
        "default - rerank",
    ):
        assert name in rows, name
    # two unambiguous queries each: every system ranks the answer first (nDCG@10, Recall@10, R@100, MRR@10)
    assert "| 1.000 | 1.000 | 1.000 | 1.000 |" in rows["**default chain**"]
    assert "published: dense multilingual-e5-small [MTEB results repository] | 0.676 |" in body
    assert "ingest embedded 3 chunks" in body


def test_a_file_without_the_markers_fails_before_any_work(datasets, tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# no markers here\n", encoding="utf-8")
    done = run_script("--datasets", str(datasets), "--doc", str(doc), env_extra={})
    assert done.returncode == 2
    assert f"error: {doc}: markers <!-- bench-quality-results:begin -->" in done.stderr
    assert doc.read_text(encoding="utf-8") == "# no markers here\n"


def test_a_missing_dataset_folder_is_named(tmp_path):
    done = run_script("--datasets", str(tmp_path), "--no-write", env_extra={})
    assert done.returncode == 2
    assert f"BEIR dataset(s) not found: {tmp_path / 'scifact'}" in done.stderr
