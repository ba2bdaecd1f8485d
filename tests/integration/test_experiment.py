"""`sieve experiment` in-process (`app.cli.main`) on an embedded Chroma with the packaged e5, over a tiny
knowledge base: two variants (a chunk size, which gets its own collection built from the document record, and
BM25 off, which runs on the base collection); the experiment JSON carries the names the issue promises; the
base collection and the passing baseline are byte-for-byte what they were; a second run reuses every
evaluation, a `--rerun` the variant collection; a run past `rag.experiment.max_store_bytes` is refused before
it builds; `--clean` drops the variant collection. A build stopped midway leaves its collection marked
incomplete, and the next run resumes it, keeping what was committed."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.settings import load_settings
from app.store import ChromaStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KB = REPO / "golden_set" / "knowledge-base" / "hr"
DOCS = ["hr-annual-leave-en", "hr-payroll-en", "hr-parental-leave-en", "hr-remote-work-en"]
CASES = [
    ("leave", "how many days of annual leave do I get", "hr-annual-leave-en"),
    ("pay", "when is salary paid each month", "hr-payroll-en"),
    ("parental", "parental leave after a birth", "hr-parental-leave-en"),
    ("remote", "can I work from home", "hr-remote-work-en"),
]
EXPERIMENT = """
name: tiny
variants:
  small-chunks: {rag.ingest.chunk_size: 200, rag.ingest.chunk_overlap: 20}
  bm25-off: {rag.chain.bm25.enabled: false}
"""
COST_KEYS = {"ingestSeconds", "chunks", "storeBytes", "p50Ms", "p95Ms", "contextChars"}


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> Path:
    """A user's shell on a fresh embedded store holding the tiny base; the session's embedder stands in for
    `load_embedder` (the same model, loaded once)."""
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    for name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    kb = tmp_path / "kb"
    kb.mkdir()
    for doc in DOCS:
        shutil.copy(KB / f"{doc}.md", kb / f"{doc}.md")
    golden = tmp_path / "golden.json"
    cases = [{"id": i, "query": q, "expectedDocIds": [d]} for i, q, d in CASES]
    golden.write_text(json.dumps({"cases": cases}), encoding="utf-8")
    env = {
        "RAG__MODELS__CACHE_DIR": str(REPO / "target" / "models"),
        "RAG__STORE__PATH": str(tmp_path / "store"),
        "RAG__LEXICAL__PATH": str(tmp_path / "lexical"),
        "RAG__INGEST__PATHS": json.dumps([str(kb)]),
        "RAG__EVALUATE__RESOURCE_LOCATION": str(golden),
        "RAG__EVALUATE__OUTPUT_DIR": str(tmp_path / "eval"),
        "RAG__EVALUATE__LATENCY_SAMPLE": "2",
        "RAG__EVALUATE__AUDIT__ENABLED": "false",
        "RAG__EXPERIMENT__CACHE_DIR": str(tmp_path / "cache"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for where in (
        "app.service.load_embedder",
        "app.models.load_embedder",
        "app.experiment.run.load_embedder",
    ):
        monkeypatch.setattr(where, lambda settings: real_embedder)
    assert main(["ingest", str(kb)]) == 0
    assert main(["eval"]) == 0  # the first passing run: the baseline an experiment must never move
    (tmp_path / "exp.yml").write_text(EXPERIMENT, encoding="utf-8")
    return tmp_path


def collections(real_embedder) -> dict[str, Any]:
    """Every collection of the store: its metadata and every chunk's text, metadata and vector bytes."""
    settings = load_settings({})
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    try:
        out = {}
        for name, metadata in store.collections().items():
            side = store if name == store.name else store.side(name, settings.rag.store, {})
            chunks = sorted(
                (
                    c.chunk_id,
                    c.text,
                    json.dumps(c.metadata, sort_keys=True),
                    c.embedding.tobytes() if c.embedding is not None else b"",
                )
                for c in side.iter_all(include_text=True, include_vectors=True)
            )
            out[name] = {"metadata": metadata, "chunks": chunks, "id": side.collection_id}
        return out
    finally:
        store.close()


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def experiment(tmp: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, Any], str]:
    code = main(["experiment", str(tmp / "exp.yml"), "--output-dir", str(tmp / "out"), *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads((tmp / "out" / "experiment.json").read_text(encoding="utf-8")), out


def test_an_experiment_leaves_the_base_alone_and_reuses_its_variant_collection(
    shell: Path, capsys, caplog, real_embedder, monkeypatch
) -> None:
    before, baseline = collections(real_embedder), files(shell / "eval")
    name = load_settings({}).rag.store.collection
    assert before[name]["chunks"] and all(vector for *_, vector in before[name]["chunks"])
    assert any(name.endswith("-passing.json") for name in baseline)
    capsys.readouterr()

    with caplog.at_level(logging.INFO):
        data, printed = experiment(shell, capsys)
    assert [v["name"] for v in data["variants"]] == ["base", "small-chunks", "bm25-off"]
    base_summary = json.loads((shell / "out" / "base" / "retrieval-eval-latest.json").read_text())["summary"]
    for variant in data["variants"]:
        assert {"name", "overlay", "summary", "cost"} <= set(variant)
        assert set(variant["summary"]) == set(base_summary)  # the same fields as a report's summary
        assert set(variant["cost"]) == COST_KEYS
        assert (shell / "out" / variant["name"] / "retrieval-eval-latest.json").is_file()
    base, small, bm25_off = data["variants"]
    assert (base["index"], small["index"], bm25_off["index"]) == ("base", "build", "base")
    assert small["overlay"] == {"rag.ingest.chunk_size": 200, "rag.ingest.chunk_overlap": 20}
    assert small["cost"]["chunks"] > base["cost"]["chunks"]
    assert small["comparison"]["pairedCases"] == len(CASES)
    assert "detectableDifference" in data and data["detectableDifference"]["pairedCases"] == len(CASES)
    assert "Winner:" in printed
    assert (shell / "out" / "winner.yml").is_file() and (shell / "out" / "experiment.html").is_file()

    after = collections(real_embedder)
    assert after[name] == before[name]  # the serving collection: not one byte moved
    assert files(shell / "eval") == baseline  # the baseline and every report of rag.evaluate.output_dir
    said = caplog.text  # each variant's run says the baseline is untouched, and offers no way to move it
    assert said.count("baseline untouched: an experiment's run never becomes a baseline") == 3
    assert "sieve baseline accept" not in said
    variant_collection = small["collection"]
    assert variant_collection != name and after[variant_collection]["metadata"]["sieve_experiment_complete"]

    assert [v["evaluation"] for v in data["variants"]] == ["ran", "ran", "ran"]

    again, _ = experiment(shell, capsys)  # nothing changed: every evaluation reused, no model loaded
    assert [v["evaluation"] for v in again["variants"]] == ["reused", "reused", "reused"]
    assert again["variants"][1]["index"] == "reuse"
    assert again["variants"][1]["summary"] == small["summary"]

    rerun, _ = experiment(shell, capsys, "--rerun")  # evaluated again, on the same variant collection
    assert [v["evaluation"] for v in rerun["variants"]] == ["ran", "ran", "ran"]
    assert rerun["variants"][1]["index"] == "reuse"
    assert rerun["variants"][1]["cost"]["chunks"] == small["cost"]["chunks"]
    assert rerun["variants"][1]["cost"]["ingestSeconds"] == small["cost"]["ingestSeconds"]  # its build's
    assert collections(real_embedder)[variant_collection]["id"] == after[variant_collection]["id"]
    assert collections(real_embedder)[name] == before[name]
    assert files(shell / "eval") == baseline

    monkeypatch.setenv("RAG__EXPERIMENT__MAX_STORE_BYTES", str(small["cost"]["storeBytes"]))
    (shell / "more.yml").write_text(
        "variants:\n  tiny: {rag.ingest.chunk_size: 120, rag.ingest.chunk_overlap: 10}\n"
    )
    assert main(["experiment", str(shell / "more.yml"), "--output-dir", str(shell / "more")]) == 2
    assert "over rag.experiment.max_store_bytes" in capsys.readouterr().err
    assert set(collections(real_embedder)) == set(after)  # refused before anything was built
    monkeypatch.delenv("RAG__EXPERIMENT__MAX_STORE_BYTES")

    assert main(["experiment", "--clean"]) == 0
    assert f"dropped 1 experiment collection(s): {variant_collection}" in capsys.readouterr().out
    assert set(collections(real_embedder)) == set(before)


def test_a_build_killed_midway_is_never_used_and_the_next_run_finishes_it(
    shell: Path, capsys, real_embedder, monkeypatch
) -> None:
    import app.experiment.build as build_module
    from app.ingest.pipeline import Ingestor

    real_build = build_module.build_staging

    def killed(staging, record, embedder, settings, progress, report):
        first = next(iter(record.iter_documents()))
        Ingestor(staging, embedder, settings).ingest_documents([first])
        raise KeyboardInterrupt  # Ctrl-C after one document's chunks were committed

    monkeypatch.setattr(build_module, "build_staging", killed)
    assert main(["experiment", str(shell / "exp.yml"), "--output-dir", str(shell / "out")]) == 130
    stopped = {n: c for n, c in collections(real_embedder).items() if "-exp-" in n}
    ((name, half),) = stopped.items()
    assert half["metadata"]["sieve_experiment_complete"] is False and half["chunks"]

    monkeypatch.setattr(build_module, "build_staging", real_build)
    capsys.readouterr()
    data, _ = experiment(shell, capsys)
    small = data["variants"][1]
    assert (small["collection"], small["index"]) == (name, "resume")
    finished = collections(real_embedder)[name]
    assert finished["metadata"]["sieve_experiment_complete"] is True
    assert len(finished["chunks"]) == small["cost"]["chunks"] > len(half["chunks"])
    assert {c[0] for c in half["chunks"]} < {c[0] for c in finished["chunks"]}  # what was committed is kept


def test_post_api_experiments_runs_it_as_a_job_on_the_server(shell: Path, real_embedder) -> None:
    """`POST /api/experiments` on the real app over the real Sieve holding the store: a misspelt key is a 422
    naming it; a good file is a 202 job whose report, once done, is the experiment JSON, written in the
    server's output folder; the serving collection and the baseline stay as they were."""
    import time

    from app.service import Sieve
    from app.settings import merge, nested
    from tests.fixtures.api_app import serving
    from tests.fixtures.api_server import installs

    token = "experiment-admin-token-0123"
    settings = load_settings(
        merge(nested("rag.server.admin_token", token), nested("rag.server.jobs_dir", str(shell / "jobs")))
    )
    baseline = files(shell / "eval")
    sieve = Sieve.open(settings)
    try:
        base_before = sorted((c.chunk_id, c.text) for c in sieve.store.iter_all())
        with serving(settings, installs(sieve)) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            bad = client.post(
                "/api/experiments", json={"experiment": "variants: {a: {rag.chian.bm25.enabled: false}}"}
            )
            assert bad.status_code == 422
            assert "did you mean rag.chain.bm25.enabled" in bad.json()["error"]
            accepted = client.post("/api/experiments", json={"experiment": EXPERIMENT})
            assert accepted.status_code == 202, accepted.text
            job_id = accepted.json()["job"]
            deadline = time.monotonic() + 300
            while (job := client.get(f"/api/jobs/{job_id}").json())["state"] not in ("done", "failed"):
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
        assert job["state"] == "done", job["error"]
        data = job["report"]["experiment"]
        assert [v["name"] for v in data["variants"]] == ["base", "small-chunks", "bm25-off"]
        assert str(shell / "eval" / "experiments" / "tiny" / "experiment.json") in job["report"]["files"]
        assert sorted((c.chunk_id, c.text) for c in sieve.store.iter_all()) == base_before
    finally:
        sieve.close()
    after = files(shell / "eval")
    assert {k: v for k, v in after.items() if not k.startswith("experiments/")} == baseline
