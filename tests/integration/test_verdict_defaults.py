"""The verdict under the shipped configuration, on the real e5 model and the sample base: a random-weight
reranker fails `sieve eval` and never becomes the baseline; BM25 alone warns on its non-significant nDCG
drop and does not become the baseline; the golden set minus its hardest cases fails naming them until
they are retired with a reason."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from app.cli import main
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
GOLDEN = REPO / "golden_set" / "golden-set.json"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_store(tmp_path_factory.mktemp("verdict") / "store")


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    return tmp_path / "retrieval-eval"


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, store_path: Path, output_dir: Path, real_embedder) -> None:
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(store_path))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(output_dir))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setattr("app.service.load_embedder", lambda settings: real_embedder)


def run(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str) -> tuple[int, str]:
    """`sieve *argv` in-process: its exit code, and its stdout, stderr and evaluation log together."""
    caplog.clear()
    caplog.set_level(logging.INFO, logger="sieve.evaluation")
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err + "\n".join(r.getMessage() for r in caplog.records)


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["gate"]["checks"]}


def test_a_random_reranker_fails_eval_and_the_baseline_stays_on_the_previous_run(
    capsys, caplog, monkeypatch, output_dir: Path, tiny_cross_encoder_dir: Path
) -> None:
    code, text = run(capsys, caplog, "eval")
    assert code == 0, text
    first = read(output_dir / "retrieval-eval-latest.json")
    passing = output_dir / "retrieval-eval-passing.json"
    assert read(passing) == first and first["baselineUpdate"]["promoted"] is True

    monkeypatch.setenv("RAG__CHAIN__RERANK__MODEL", str(tiny_cross_encoder_dir))
    code, text = run(capsys, caplog, "eval")
    assert code == 1, text
    second = read(output_dir / "retrieval-eval-latest.json")
    ndcg = second["comparison"]["metrics"]["ndcg"]
    assert ndcg["significant"] and ndcg["current"] < ndcg["baseline"]
    drop = checks(second)["significant_drop.ndcg"]
    assert (drop["passed"], drop["severity"]) == (False, "fail")
    assert f"ndcg {ndcg['baseline']:.3f} -> {ndcg['current']:.3f}" in drop["message"]
    assert "gate failed: significant_drop.ndcg:" in text
    assert second["baselineUpdate"] == {"promoted": False, "reason": "the gate failed"}
    assert read(passing) == first, "the failed run never becomes the baseline"
    assert "baseline kept: this run did not replace" in text and "sieve baseline accept" in text

    code, text = run(capsys, caplog, "baseline", "show", "--output-dir", str(output_dir))
    assert code == 0
    own = output_dir / first["run"]["reportFile"]
    assert f"next run compares with: last passing report {own}" in text

    code, text = run(capsys, caplog, "baseline", "accept", "--output-dir", str(output_dir))
    assert code == 0, text
    assert read(passing) == second, "accept makes the latest run the baseline on purpose"
    assert "note: that report's gate FAILED" in text


def test_bm25_alone_warns_on_its_drop_and_does_not_become_the_baseline(
    capsys, caplog, monkeypatch, output_dir: Path
) -> None:
    """The README's example: BM25 alone, `max_drop.ndcg: 0.01`. The drop is beyond the limit but not
    significant: a warning, not "ok"; whatever else the gate says, the worse run is not the baseline."""
    code, text = run(capsys, caplog, "eval")
    assert code == 0, text
    passing = output_dir / "retrieval-eval-passing.json"
    first = read(passing)
    monkeypatch.setenv("RAG__CHAIN__BM25__DENSE_WEIGHT", "0")
    monkeypatch.setenv("RAG__CHAIN__BM25__BM25_WEIGHT", "1")
    monkeypatch.setenv("RAG__EVALUATE__THRESHOLDS__MAX_DROP__NDCG", "0.01")
    code, text = run(capsys, caplog, "eval")
    report = read(output_dir / "retrieval-eval-latest.json")
    row = report["comparison"]["metrics"]["ndcg"]
    check = checks(report)["max_drop.ndcg"]
    assert row["baseline"] - row["current"] > 0.01
    if row["significant"]:
        assert check["severity"] == "fail" and not check["passed"]
    else:
        assert (check["passed"], check["severity"]) == (False, "warn")
        assert "not significant" in check["message"] and "gate WARN max_drop.ndcg" in text
    assert code == (0 if report["gate"]["passed"] else 1)
    assert report["baselineUpdate"]["promoted"] is False
    assert read(passing) == first


def test_the_golden_set_minus_its_hardest_cases_fails_until_they_are_retired(
    capsys, caplog, monkeypatch, output_dir: Path, tmp_path: Path
) -> None:
    code, text = run(capsys, caplog, "eval")
    assert code == 0, text
    first = read(output_dir / "retrieval-eval-latest.json")
    hard = sorted(c["id"] for c in first["cases"] if c["metrics"] and c["metrics"]["ndcg"] < 1.0)[:4]
    assert hard, "the sample set has cases the default chain does not rank ideally"
    document = read(GOLDEN)
    document["cases"] = [c for c in document["cases"] if c["id"] not in hard]
    smaller = tmp_path / "smaller.json"
    smaller.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")

    code, text = run(capsys, caplog, "eval", "--golden-set", str(smaller))
    assert code == 1, text
    report = read(output_dir / "retrieval-eval-latest.json")
    removed = checks(report)["removed_cases"]
    assert not removed["passed"] and removed["severity"] == "fail"
    assert (
        f"{len(hard)} hard in the baseline (failed or nDCG < 1), no retired reason: {', '.join(hard)}"
        in (removed["message"])
    )
    listed = {c["id"]: c for c in report["comparison"]["removedCases"]}
    assert sorted(listed) == hard and all(listed[i]["hard"] for i in hard)
    composition = report["comparison"]["composition"]["ndcg"]
    assert composition["composition"] == pytest.approx(
        (composition["currentAll"] - composition["baselineAll"])
        - (composition["currentCommon"] - composition["baselineCommon"])
    )
    assert composition["composition"] > 0, "dropping the hardest cases lifts the all-case figure"

    document["retired"] = [{"id": i, "reason": "superseded by a sharper case"} for i in hard]
    smaller.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    code, text = run(capsys, caplog, "eval", "--golden-set", str(smaller))
    assert code == 0, text
    report = read(output_dir / "retrieval-eval-latest.json")
    assert checks(report)["removed_cases"]["passed"]
    assert {c["id"]: c["retiredReason"] for c in report["comparison"]["removedCases"]} == dict.fromkeys(
        hard, "superseded by a sharper case"
    )


def golden_variant(tmp_path: Path, name: str, change) -> Path:
    """The sample golden set with `change(document)` applied, written to `tmp_path / name`."""
    document = read(GOLDEN)
    change(document)
    path = tmp_path / name
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return path


def test_a_run_with_a_baseline_is_compared_or_fails_as_not_checked(
    capsys, caplog, output_dir: Path, tmp_path: Path
) -> None:
    """Issue 40's roads through `sieve eval`: a deeper K is compared at the baseline's K; renamed ids are
    paired by content; a golden set nothing of which can be scored fails; an unreadable baseline fails as
    not checked. None of the failing runs moves the baseline."""
    code, text = run(capsys, caplog, "eval")
    assert code == 0, text
    passing = output_dir / "retrieval-eval-passing.json"
    first = read(passing)

    code, text = run(capsys, caplog, "eval", "--top-k", "10")
    deeper = read(output_dir / "retrieval-eval-latest.json")
    comp = deeper["comparison"]
    assert comp["comparable"] and comp["k"] == 5
    assert any(
        note.startswith("compared at K=5: the current run's lists (K=10) cut to K=5")
        for note in comp["notes"]
    )
    assert checks(deeper)["not_checked"]["passed"], "a deeper run is compared, never passed unchecked"
    assert comp["pairedCases"] == first["summary"]["scoredCases"]
    assert code == (0 if deeper["gate"]["passed"] else 1)

    def rename(document: dict) -> None:
        for case in document["cases"]:
            case["id"] = f"renamed-{case['id']}"

    code, text = run(
        capsys, caplog, "eval", "--golden-set", str(golden_variant(tmp_path, "renamed.json", rename))
    )
    renamed = read(output_dir / "retrieval-eval-latest.json")
    comp = renamed["comparison"]
    assert len(comp["cases"]["renamed"]) == len(first["cases"])
    assert comp["pairedCases"] == first["summary"]["scoredCases"] and comp["removedCases"] == []
    assert checks(renamed)["not_checked"]["passed"]
    assert code == 0, text

    def unscorable(document: dict) -> None:
        for case in document["cases"]:
            case.pop("expectNoAnswer", None)
            for key in [k for k in case if k.startswith(("expected", "evidence")) or k == "relevance"]:
                case.pop(key)
            case["expectedChunkIds"] = [f"c_stale_{case['id']}"]

    before = passing.read_bytes()
    code, text = run(
        capsys, caplog, "eval", "--golden-set", str(golden_variant(tmp_path, "stale.json", unscorable))
    )
    assert code in (1, 2), text
    if code == 1:
        nothing = read(output_dir / "retrieval-eval-latest.json")
        assert not checks(nothing)["scored_cases"]["passed"]
    assert passing.read_bytes() == before, "a run that scored nothing never becomes the baseline"

    damaged = read(passing)
    damaged["cases"][0]["metrics"]["ndcg"] = "high"
    passing.write_text(json.dumps(damaged), encoding="utf-8")
    code, text = run(capsys, caplog, "eval")
    assert code == 1, text
    unchecked = read(output_dir / "retrieval-eval-latest.json")
    check = checks(unchecked)["not_checked"]
    assert not check["passed"] and "metrics.ndcg" in check["message"] and str(passing) in check["message"]
    assert "sieve baseline accept" in check["message"] and "--baseline none" in check["message"]
    assert read(passing) == damaged, "the baseline stays as it was"


def test_a_no_answer_case_that_stops_abstaining_fails_and_the_baseline_stays(
    capsys, caplog, monkeypatch, output_dir: Path
) -> None:
    """Issue 40's road 6: a baseline at the sweep's abstention threshold with the fallback off, where the
    no-answer cases abstain; turning the fallback back on makes them answer: abstention broken, exit 1,
    the baseline unchanged."""
    code, text = run(capsys, caplog, "eval")
    assert code == 0, text
    sweep = read(output_dir / "retrieval-eval-latest.json")["sweep"]
    threshold = sweep["recommendation"]["abstention"]["point"]["chain.similarity_threshold.min_dense"]
    monkeypatch.setenv("RAG__CHAIN__SIMILARITY_THRESHOLD__MIN_DENSE", str(threshold))
    monkeypatch.setenv("RAG__CHAIN__FALLBACK__ENABLED", "false")
    monkeypatch.setenv("RAG__EVALUATE__BASELINE", "none")
    code, text = run(capsys, caplog, "eval")
    abstaining = read(output_dir / "retrieval-eval-latest.json")
    abstained = [c["id"] for c in abstaining["cases"] if c.get("abstained")]
    assert abstained, "at the sweep's abstention threshold some no-answer case abstains"
    code, text = run(capsys, caplog, "baseline", "accept", "--output-dir", str(output_dir))
    assert code == 0, text
    passing = output_dir / "retrieval-eval-passing.json"
    before = passing.read_bytes()

    monkeypatch.setenv("RAG__CHAIN__FALLBACK__ENABLED", "true")
    monkeypatch.setenv("RAG__EVALUATE__BASELINE", "previous-passing")
    code, text = run(capsys, caplog, "eval")
    assert code == 1, text
    answering = read(output_dir / "retrieval-eval-latest.json")
    check = checks(answering)["abstention_broken"]
    assert not check["passed"] and check["value"] == len(abstained)
    assert answering["comparison"]["cases"]["abstentionBroken"] == sorted(abstained)
    assert "gate failed: abstention_broken:" in text
    assert passing.read_bytes() == before, "the run that lost its abstentions is not the baseline"
