"""Quote evidence on the packaged e5 and embedded Chroma: a case whose evidence is a quote stays scorable and
is hit at chunk sizes 600 and 300 (where its chunk-id evidence goes stale), and a store whose chunks lost
their spans is named at start-up and gets them back from `sieve store rebuild`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.cli import main
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.run.runner import evaluate
from app.ingest.check import spanless_chunks
from app.ingest.loaders import load_paths
from app.service import Sieve
from app.settings import load_settings

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
HR = REPO / "golden_set" / "knowledge-base" / "hr"
MODELS_CACHE = REPO / "target" / "models"
DOCS = ("hr-payroll-en.md", "hr-payroll-zh.md", "hr-annual-leave-en.md", "hr-parental-leave-en.md")
PAY_EN = (
    "Salary is paid monthly, on the 10th of each month. On that day, your salary for the previous calendar "
    "month is transferred to the bank account registered in the HR Portal."
)
PAY_ZH = "每月10日，公司通过银行代发的方式，将员工上一个自然月的工资发放到本人工资卡。"


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> Path:
    """A user's shell on a fresh embedded store, no start-up ingest; the session's e5 stands in for
    `load_embedder` (the same model, loaded once)."""
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setenv("RAG__INGEST__ON_STARTUP", "false")
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))
    monkeypatch.setenv("RAG__LEXICAL__PATH", str(tmp_path / "lexical"))
    for where in ("app.service.load_embedder", "app.models.load_embedder"):
        monkeypatch.setattr(where, lambda settings: real_embedder)
    return tmp_path


def golden() -> GoldenSet:
    cases = [
        {
            "id": "pay-en",
            "query": "When is salary paid?",
            "evidence": [{"docId": "hr-payroll-en", "quote": PAY_EN}],
        },
        {
            "id": "pay-zh",
            "query": "工资什么时候发",
            "evidence": [{"docId": "hr-payroll-zh", "quote": PAY_ZH}],
        },
    ]
    return GoldenSet("t", [GoldenCase.model_validate(c) for c in cases], "quotes.json")


def evaluated(chunk_size: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, float] | None]:
    """Ingest DOCS at `chunk_size` into a store of its own and evaluate `golden()` on it: each case's
    evidence figures."""
    monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", str(chunk_size))
    monkeypatch.setenv("RAG__STORE__COLLECTION", f"quotes-{chunk_size}")
    sieve = Sieve.open(load_settings({}))
    try:
        sieve.ingest_documents(load_paths([str(HR / name) for name in DOCS]).documents)
        target = sieve.evaluation_target()
        run = evaluate(target.chain, golden(), 5, target.known)
    finally:
        sieve.close()
    assert all(c.status == "ok" for c in run.cases)
    return {c.case.id: c.evidence for c in run.cases}


def test_a_quote_stays_scorable_and_hit_at_chunk_sizes_600_and_300(shell, monkeypatch) -> None:
    for size in (600, 300):
        for case_id, evidence in evaluated(size, monkeypatch).items():
            assert evidence is not None, (size, case_id)
            assert (evidence["evidenceHit"], evidence["evidenceCharRecall"]) == (1.0, 1.0), (size, case_id)
            assert 0.0 < evidence["charPrecision"] < 1.0


def test_chunks_without_spans_are_named_and_a_rebuild_gives_them_back(
    shell, monkeypatch, capsys, caplog
) -> None:
    from app.main import _say_missing_spans

    sieve = Sieve.open(load_settings({}))
    try:
        sieve.ingest_documents(load_paths([str(HR / DOCS[0])]).documents)
        ids = [c.chunk_id for c in sieve.store.iter_all(include_text=False)]
        # as a store written before chunker md-v2 holds them: no char_start / char_end
        sieve.store.update_metadata(ids, [{"char_start": None, "char_end": None}] * len(ids))
        assert spanless_chunks(sieve.store.iter_all(include_text=False)) == len(ids)
        _say_missing_spans(sieve)
    finally:
        sieve.close()
    assert f"{len(ids)} of {len(ids)} chunks looked at carry no character span" in caplog.text
    assert "run `sieve store rebuild`" in caplog.text

    assert main(["store", "rebuild"]) == 0, capsys.readouterr().err
    sieve = Sieve.open(load_settings({}))
    try:
        assert spanless_chunks(sieve.store.iter_all(include_text=False)) == 0
    finally:
        sieve.close()
