"""The `sieve` command in-process (`app.cli.main([...])`): the real e5 embedder, one embedded store with the
sample base shared by the module (each command opens and closes it, as separate runs would), reports in each
test's own folder."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

from app.cli import main
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
GOLDEN_SET = REPO / "golden_set" / "golden-set.json"
STAGE_NAMES = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]
EXIT_OK, EXIT_GATE, EXIT_INPUT = 0, 1, 2


# -- the seeded store (same helper in tests/integration/test_api.py and tests/e2e/test_serve_e2e.py) -------


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_store(tmp_path_factory.mktemp("cli") / "store")


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    return tmp_path / "retrieval-eval"


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, store_path: Path, output_dir: Path, real_embedder) -> None:
    """What a user's shell would have: the repo as working directory, the test's store and report folder.
    The session's loaded embedder stands in for `load_embedder` (the same model, loaded once)."""
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    for name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(store_path))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(output_dir))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))

    def loaded_embedder(settings):
        if settings.embedder != "multilingual-e5-small":
            raise AssertionError(f"these tests expect the default embedder, got {settings.embedder}")
        return real_embedder

    monkeypatch.setattr("app.service.load_embedder", loaded_embedder)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def golden_case_count() -> int:
    return len(json.loads(GOLDEN_SET.read_text(encoding="utf-8"))["cases"])


# -- query -------------------------------------------------------------------------------------------------


def test_query_prints_a_table_led_by_the_payroll_policy_and_the_stages(capsys) -> None:
    code, out, err = run(capsys, "query", "工资什么时候发")
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert lines[0] == "query: 工资什么时候发"
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  docId"))
    first_row = lines[header + 1].split()
    assert first_row[:2] == ["1", "hr-payroll-zh"]
    stages_at = lines.index("stages:")
    stage_lines = lines[stages_at + 1 : stages_at + 1 + len(STAGE_NAMES)]
    assert [line.split()[0] for line in stage_lines] == STAGE_NAMES
    assert "skipped: no reranker model" in stage_lines[STAGE_NAMES.index("rerank")]


def test_query_json_is_the_api_response(capsys) -> None:
    code, out, err = run(capsys, "query", "工资什么时候发", "--json", "--top-k", "3")
    assert code == EXIT_OK, err
    body = json.loads(out)
    assert set(body) == {
        "query",
        "documents",
        "originalCount",
        "finalCount",
        "fallbackUsed",
        "candidateOrigins",
        "stages",
        "latencyMs",
    }
    assert set(body["documents"][0]) == {
        "rank",
        "docId",
        "chunkId",
        "source",
        "title",
        "text",
        "knowledgeTag",
        "headingPath",
        "origin",
        "scores",
        "attached",
    }
    assert set(body["documents"][0]["scores"]) == {"dense", "bm25", "fused", "rerank"}
    # the payroll document keeps one rank; the pay-date section rides along with its FAQ section
    attached = body["documents"][0]["attached"]
    assert "c_bd40b192f1607e6098269d1b" in [a["chunkId"] for a in attached]
    assert set(attached[0]) == {"chunkId", "headingPath", "text", "scores"}
    assert set(body["stages"][0]) == {
        "name",
        "enabled",
        "inputCount",
        "outputCount",
        "removed",
        "added",
        "latencyMs",
        "scoreKey",
        "skipped",
        "removedItems",
        "withheld",
    }
    assert not any(stage["withheld"] for stage in body["stages"]), "a local query withholds nothing"
    assert body["documents"][0]["docId"] == "hr-payroll-zh"
    assert body["finalCount"] == len(body["documents"]) == 3
    assert [s["name"] for s in body["stages"]] == STAGE_NAMES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["query", "   "], "error: query must not be blank"),
        (["query", "工资", "--top-k", "0"], "error: --top-k must be between 1 and 100, got 0"),
        (["query", "工资", "--top-k", "101"], "error: --top-k must be between 1 and 100, got 101"),
    ],
    ids=["blank", "top-k-0", "top-k-101"],
)
def test_bad_query_input_exits_2_with_the_reason(capsys, argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == EXIT_INPUT
    assert err.strip() == message
    assert out == ""


# -- eval --------------------------------------------------------------------------------------------------


def test_eval_prints_the_summary_and_writes_the_reports(capsys, output_dir: Path) -> None:
    code, out, err = run(capsys, "eval")
    assert code == EXIT_OK, err
    lines = out.splitlines()
    cases = golden_case_count()
    assert lines[0].startswith(f"done cases={cases} succeeded={cases} failed=0 avgRecall=")
    for figure in ("avgMRR=", "avgNDCG=", "hitRate=", "p50=", "p95="):
        assert figure in lines[0]
    reports = [line.removeprefix("report: ") for line in lines[1:] if line.startswith("report: ")]
    # json, md and html, each timestamped and -latest, and -passing.json (the gate passed: the next baseline)
    assert len(reports) == 3 * 2 + 1
    assert str(output_dir / "retrieval-eval-passing.json") in reports
    assert {Path(p).parent for p in reports} == {output_dir}
    assert str(output_dir / "retrieval-eval-latest.json") in reports
    assert str(output_dir / "retrieval-eval-latest.md") in reports
    assert str(output_dir / "retrieval-eval-latest.html") in reports
    assert all(Path(p).is_file() for p in reports)
    report = json.loads((output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["summary"]["cases"] == cases
    assert f"avgNDCG={report['summary']['ndcg']:.2f} " in lines[0]


def test_eval_logs_each_case_s_trace_id_and_reports_its_ranks_in_the_candidate_lists(
    capsys, caplog, output_dir: Path
) -> None:
    with caplog.at_level(logging.INFO, logger="sieve.evaluation"):
        code, out, err = run(capsys, "eval", "--top-k", "1", "--baseline", "none")
    assert code == EXIT_OK, err
    report = json.loads((output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    logged = dict(re.findall(r"caseId=(\S+), traceId=([0-9a-f]{16}),", caplog.text))
    assert logged == {c["id"]: c["traceId"] for c in report["cases"]}
    assert len(set(logged.values())) == len(logged)

    for case in report["cases"]:
        docs = case["rankedDocuments"]
        for d in docs:
            ranks = d["ranks"]
            # the searches that found a document are its origin; no reranker model: no rerank list
            assert (ranks["dense"] is not None, ranks["bm25"] is not None) == (
                "dense" in d["origin"],
                "bm25" in d["origin"],
            )
            assert ranks["fused"] is not None and ranks["rerank"] is None
        # each list is in the order of its own score
        for name in ("dense", "bm25", "fused"):
            listed = sorted(
                (d["ranks"][name], d["scores"][name]) for d in docs if d["ranks"][name] is not None
            )
            assert [score for _, score in listed] == sorted((score for _, score in listed), reverse=True)
    ranked_out = [x for c in report["cases"] for x in c["lost"] if x["where"] == "RANKED_OUT"]
    assert ranked_out  # at K=1 some expected documents come second
    for loss in ranked_out:
        # it survived every stage, below the document at the top of the fused list
        assert loss["ranks"]["fused"] > 1
        assert loss["ranks"]["dense"] is not None or loss["ranks"]["bm25"] is not None


def test_eval_with_an_unmet_threshold_exits_1_naming_it(capsys) -> None:
    code, out, err = run(capsys, "eval", "--min-ndcg", "0.999")
    assert code == EXIT_GATE
    assert out.startswith("done cases=")
    assert "gate failed: min_ndcg: ndcg=" in err
    assert "needs >= 0.999" in err


def test_eval_with_a_broken_golden_set_exits_2_naming_file_and_case(capsys, tmp_path: Path) -> None:
    data = json.loads(GOLDEN_SET.read_text(encoding="utf-8"))
    duplicated = dict(data["cases"][1])
    data["cases"].append(duplicated)
    bad = tmp_path / "bad-golden.json"
    bad.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    code, out, err = run(capsys, "eval", "--golden-set", str(bad))
    assert code == EXIT_INPUT
    assert out == ""
    assert err.startswith(f"error: invalid golden set {bad}")
    assert f"duplicate id '{duplicated['id']}'" in err


def test_a_case_with_its_own_as_of_sees_the_documents_in_force_that_day(capsys, tmp_path: Path) -> None:
    # security-password-policy-v3-zh is in force from 2099-01-01: filtered today, returned as of 2099
    case = {
        "query": "电脑登录密码多久必须改一次",
        "expectedDocIds": ["security-password-policy-zh"],
        "forbiddenDocIds": ["security-password-policy-v3-zh"],
    }
    golden = tmp_path / "dated.json"
    golden.write_text(
        json.dumps(
            [{"id": "today", **case}, {"id": "in-2099", **case, "asOf": "2099-06-01"}], ensure_ascii=False
        ),
        encoding="utf-8",
    )
    code, out, err = run(capsys, "eval", "--golden-set", str(golden), "--baseline", "none")
    assert code == EXIT_GATE  # max_forbidden_hits 0: the 2099 case's forbidden hit fails the gate
    assert "gate failed: max_forbidden_hits" in err and "in-2099" in err
    report = json.loads(
        (tmp_path / "retrieval-eval" / "retrieval-eval-latest.json").read_text(encoding="utf-8")
    )
    by_id = {c["id"]: c for c in report["cases"]}
    assert by_id["today"]["forbiddenFound"] == []
    assert by_id["in-2099"]["forbiddenFound"] == ["security-password-policy-v3-zh"]
    assert by_id["in-2099"]["asOf"] == "2099-06-01"
    assert by_id["today"]["asOf"] == report["run"]["asOf"]


def test_exported_trec_files_rescore_to_the_evaluation_figures(
    capsys, tmp_path: Path, output_dir: Path
) -> None:
    """trec-eval over the exported run and qrels against the evaluation's own per-case figures.

    The export keeps each id's first occurrence in the case's top K (trec_eval files cannot hold an id twice),
    while Sieve's metrics let a duplicate keep its position. So per case, at the case's own K:
    recall is equal (the same distinct ids); nDCG is equal when no duplicate stands above a relevant hit, and
    higher after the export otherwise (dropping the duplicate moves that hit up).
    """
    trec_dir = tmp_path / "trec"
    code, out, err = run(capsys, "eval", "--export-trec", str(trec_dir))
    assert code == EXIT_OK, err
    assert f"trec run: {trec_dir / 'run.trec'}" in out
    assert f"trec qrels: {trec_dir / 'qrels.trec'}" in out
    report = json.loads((output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    scored = [c for c in report["cases"] if c["metrics"] is not None]
    ks = sorted({c["topK"] for c in scored})

    code, out, err = run(
        capsys,
        "trec-eval",
        str(trec_dir / "qrels.trec"),
        str(trec_dir / "run.trec"),
        "--k",
        ",".join(map(str, ks)),
        "--json",
    )
    assert code == EXIT_OK, err
    rescored = json.loads(out)
    assert rescored["queries"] == report["summary"]["scoredCases"] == len(scored)

    at_own_k: dict[str, dict[str, float]] = {}
    for case in scored:
        k, figures = case["topK"], rescored["perQuery"][case["id"]]
        at_own_k[case["id"]] = {"recall": figures[f"recall@{k}"], "ndcg": figures[f"ndcg@{k}"]}
        assert at_own_k[case["id"]]["recall"] == pytest.approx(case["metrics"]["recall"], abs=1e-12), case[
            "id"
        ]
        if duplicate_above_a_hit(case):
            assert at_own_k[case["id"]]["ndcg"] > case["metrics"]["ndcg"], case["id"]
        else:
            assert at_own_k[case["id"]]["ndcg"] == pytest.approx(case["metrics"]["ndcg"], abs=1e-12), case[
                "id"
            ]
    assert fmean(v["recall"] for v in at_own_k.values()) == pytest.approx(
        report["summary"]["recall"], abs=1e-12
    )
    if not any(duplicate_above_a_hit(c) for c in scored):  # then the summary's nDCG is trec_eval's too
        assert fmean(v["ndcg"] for v in at_own_k.values()) == pytest.approx(
            report["summary"]["ndcg"], abs=1e-12
        )


def duplicate_above_a_hit(case: dict[str, Any]) -> bool:
    key = {"doc": "docId", "chunk": "chunkId", "source": "source"}[case["matchOn"]]
    seen: set[str] = set()
    duplicates_so_far = 0
    for doc in case["rankedDocuments"][: case["topK"]]:
        if doc["matched"] and duplicates_so_far:
            return True
        if doc[key] in seen:
            duplicates_so_far += 1
        seen.add(doc[key])
    return False


# -- trec-eval on hand-written files -----------------------------------------------------------------------


def test_trec_eval_scores_a_hand_written_run(capsys, tmp_path: Path) -> None:
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("q1 0 d1 2\nq1 0 d2 1\nq1 0 d3 0\nq2 0 d9 1\n", encoding="utf-8")
    run_file = tmp_path / "run.trec"
    # the rank column is ignored: order is by score, so q1 ranks d3, d1, d4
    run_file.write_text(
        "q1 Q0 d1 1 2.0 t\nq1 Q0 d3 2 3.0 t\nq1 Q0 d4 3 1.0 t\nq2 Q0 d8 1 5.0 t\nq2 Q0 d9 2 4.0 t\n",
        encoding="utf-8",
    )
    code, out, err = run(capsys, "trec-eval", str(qrels), str(run_file), "--k", "3", "--json")
    assert code == EXIT_OK, err
    result = json.loads(out)
    q1_ndcg = (2 / math.log2(3)) / (2 / math.log2(2) + 1 / math.log2(3))  # d1 (grade 2) at rank 2
    q2_ndcg = (1 / math.log2(3)) / (1 / math.log2(2))  # d9 (grade 1) at rank 2
    expected = {
        "q1": {"recall@3": 1 / 2, "ndcg@3": q1_ndcg, "mrr@3": 1 / 2, "precision@3": 1 / 3, "hitRate@3": 1.0},
        "q2": {"recall@3": 1 / 1, "ndcg@3": q2_ndcg, "mrr@3": 1 / 2, "precision@3": 1 / 3, "hitRate@3": 1.0},
    }
    assert result["queries"] == 2
    assert set(result["perQuery"]) == {"q1", "q2"}
    for qid, figures in expected.items():
        assert result["perQuery"][qid] == pytest.approx(figures), qid
    assert result["aggregate"] == pytest.approx(
        {key: (expected["q1"][key] + expected["q2"][key]) / 2 for key in expected["q1"]}
    )


def test_trec_eval_with_a_malformed_run_exits_2_naming_the_line(capsys, tmp_path: Path) -> None:
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("q1 0 d1 1\n", encoding="utf-8")
    run_file = tmp_path / "run.trec"
    run_file.write_text("q1 Q0 d1 1 1.0 t\nq1 Q0 d2 2\n", encoding="utf-8")
    code, _, err = run(capsys, "trec-eval", str(qrels), str(run_file))
    assert code == EXIT_INPUT
    assert err.startswith(f"error: {run_file}:2:")


# -- configuration and entry points ------------------------------------------------------------------------


def test_unknown_config_key_exits_2_naming_key_and_file(capsys, tmp_path: Path) -> None:
    config = tmp_path / "typo.yml"
    config.write_text("rag:\n  retrieval:\n    top_kk: 3\n", encoding="utf-8")
    code, out, err = run(capsys, "--config", str(config), "query", "工资什么时候发")
    assert code == EXIT_INPUT
    assert out == ""
    assert f"{config}: unknown key 'rag.retrieval.top_kk'" in err
    assert "SIEVE_CONFIG" not in os.environ  # --config is passed to the loader, not through the environment


def test_python_dash_m_app_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sieve")
    for command in ("serve", "ingest", "query", "eval", "trec-eval"):
        assert command in done.stdout


def _write_beir(root: Path) -> Path:
    """A three-document BEIR directory with two test queries whose answers are unambiguous."""
    corpus = [
        {
            "_id": "d1",
            "title": "Photosynthesis",
            "text": "Plants turn sunlight, water and carbon dioxide into sugar.",
        },
        {"_id": "d2", "title": "Volcanoes", "text": "Magma rises through the crust and erupts as lava."},
        {"_id": "d3", "title": "Tides", "text": "The moon's gravity pulls the oceans and causes the tides."},
    ]
    queries = [
        {"_id": "q1", "text": "how do plants make sugar from sunlight"},
        {"_id": "q2", "text": "what causes ocean tides"},
        {"_id": "q9", "text": "a query of another split"},
    ]
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\n", encoding="utf-8"
    )
    return root


def test_eval_beir_ingests_the_corpus_into_its_own_collection_and_scores_the_split(
    capsys, tmp_path: Path, output_dir: Path
) -> None:
    beir = _write_beir(tmp_path / "tiny-beir")
    code, out, err = run(capsys, "eval", "--beir", str(beir), "--split", "test", "--top-k", "3")
    assert code == EXIT_OK, err
    report = json.loads((output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    assert report["run"]["collection"] == "beir-tiny-beir"
    assert report["run"]["chunks"] == 3  # only the BEIR corpus: the sample knowledge base is not mixed in
    assert report["run"]["datasetVersion"] == "beir:tiny-beir:test"
    assert [c["id"] for c in report["cases"]] == ["q1", "q2"]  # the split's queries, not q9
    assert [c["rankedDocuments"][0]["docId"] for c in report["cases"]] == ["d1", "d3"]
    assert report["summary"]["mrr"] == 1.0
    assert out.startswith("done cases=2 succeeded=2 failed=0 avgRecall=1.00 avgMRR=1.00")


def test_eval_beir_without_qrels_for_the_split_exits_2_naming_the_file(capsys, tmp_path: Path) -> None:
    beir = _write_beir(tmp_path / "tiny-beir")
    code, _, err = run(capsys, "eval", "--beir", str(beir), "--split", "train")
    assert code == EXIT_INPUT
    assert str(beir / "qrels" / "train.tsv") in err
