"""`sieve eval` against a baseline, `sieve compare`, and the safety gate, in-process on the real e5 model and
the sample base (each test has its own report folder; the module shares one seeded store)."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from app.cli import main
from app.evaluation.scoring.measures import GATED
from app.evaluation.scoring.stats import bootstrap_ci, max_t, sign_flip_p_value
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
METRICS = ("recall", "hitRate", "mrr", "ndcg", "precision", "top1Accuracy")
BASELINE_LINE = re.compile(
    r"vs baseline (?P<when>\S+) \((?P<paired>\d+) paired[^)]*\): nDCG@(?:K|\d+) (?P<before>\d\.\d{3}) -> "
    r"(?P<after>\d\.\d{3}) \((?P<delta>[+-]\d\.\d{3}), 95% CI \[(?P<lo>-?\d\.\d{3}), (?P<hi>-?\d\.\d{3})\], "
    r"p=(?P<p>[\d.e-]+), adjusted (?P<p_adjusted>[\d.e-]+)\) fixed=(?P<fixed>\d+) broken=(?P<broken>\d+)"
    r"(?:; (?P<unjudged>\d+) of the (?P<new>\d+) new top-K documents are unjudged"
    r"(?: \(\d+ unverified: [^)]+\))?(?: \(\d+ too thinly judged to tell: [^)]+\))?)?$"
)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_store(tmp_path_factory.mktemp("eval-baseline") / "store")


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


def run(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str
) -> tuple[int, str, str]:
    caplog.clear()
    caplog.set_level(logging.INFO, logger="sieve.evaluation")
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err + "\n".join(r.getMessage() for r in caplog.records)


def latest(output_dir: Path) -> dict:
    return json.loads((output_dir / "retrieval-eval-latest.json").read_text(encoding="utf-8"))


def test_eval_twice_compares_with_the_previous_run(capsys, caplog, monkeypatch, output_dir: Path) -> None:
    code, out, _ = run(capsys, caplog, "eval")
    assert code == 0, out
    assert "no baseline: no passing report yet" in out
    first = latest(output_dir)
    assert first["comparison"] is None
    (output_dir / "first.json").write_text(json.dumps(first), encoding="utf-8")

    monkeypatch.setenv("RAG__CHAIN__BM25__ENABLED", "false")
    code, out, logs = run(capsys, caplog, "eval", "--baseline", "previous")
    assert code == 0, out
    second = latest(output_dir)
    comp = second["comparison"]
    assert comp is not None and comp["comparable"]
    # the previous run named by its own timestamped copy, which stays
    assert comp["baseline"]["path"] == str(output_dir / first["run"]["reportFile"])
    assert json.loads(Path(comp["baseline"]["path"]).read_text(encoding="utf-8")) == first
    assert comp["baseline"]["evaluatedAt"] == first["run"]["evaluatedAt"]
    assert comp["differences"] == ["rag.chain.bm25.enabled: true -> false"]

    # every figure is the definition applied to the two reports' per-case metrics
    before = {c["id"]: c["metrics"] for c in first["cases"] if c["metrics"]}
    after = {c["id"]: c["metrics"] for c in second["cases"] if c["metrics"]}
    paired = sorted(set(before) & set(after))
    assert comp["pairedCases"] == len(paired)
    p_values = []
    for name in METRICS:
        diffs = [after[i][name] - before[i][name] for i in paired]
        row = comp["metrics"][name]
        assert row["pValue"] == sign_flip_p_value(diffs, seed=42)
        assert row["ci95"] == list(bootstrap_ci(diffs, seed=42))
        assert row["delta"] == pytest.approx(sum(diffs) / len(diffs))
        p_values.append(row["pValue"])
    # the gated measures tested together: Westfall-Young max-T over their sign flips
    family = max_t({m: [after[i][m] - before[i][m] for i in paired] for m in GATED}, seed=42)
    assert {m: comp["metrics"][m]["pAdjusted"] for m in GATED} == {m: family[m].p_adjusted for m in GATED}
    assert all(comp["metrics"][m]["significant"] == (family[m].p_adjusted < 0.05) for m in GATED)
    assert comp["cases"]["fixed"] == [
        i for i in paired if before[i]["hitRate"] == 0 and after[i]["hitRate"] == 1
    ]
    assert comp["cases"]["broken"] == [
        i for i in paired if before[i]["hitRate"] == 1 and after[i]["hitRate"] == 0
    ]
    assert {x["id"] for x in comp["cases"]["improved"]} == {
        i for i in paired if after[i]["ndcg"] > before[i]["ndcg"] + 1e-12
    }

    # the log line after the summary, the same on stdout
    (line,) = [x for x in out.splitlines() if x.startswith("vs baseline")]
    match = BASELINE_LINE.fullmatch(line)
    assert match, line
    row = comp["metrics"]["ndcg"]
    assert match["when"] == first["run"]["evaluatedAt"]
    assert int(match["paired"]) == len(paired)
    assert (match["before"], match["after"]) == (f"{row['baseline']:.3f}", f"{row['current']:.3f}")
    assert (int(match["fixed"]), int(match["broken"])) == (
        len(comp["cases"]["fixed"]),
        len(comp["cases"]["broken"]),
    )
    # turning BM25 off brings documents into some top K: the line counts them and their unjudged share
    account = comp["unjudged"]
    assert account["newInTopK"] > 0
    assert (int(match["unjudged"]), int(match["new"])) == (account["newUnjudged"], account["newInTopK"])
    recount = sum(
        len(
            {d["docId"] for d in c["rankedDocuments"][: c["topK"]]}
            - set(b["rankedDocuments"][i]["docId"] for i in range(min(b["topK"], len(b["rankedDocuments"]))))
        )
        for c, b in ((c, {x["id"]: x for x in first["cases"]}[c["id"]]) for c in second["cases"])
        if c["metrics"] and b["metrics"]
    )
    assert account["newInTopK"] == recount
    assert f"[RetrievalEval] {line}" in logs
    assert "changed: rag.chain.bm25.enabled: true -> false" in out

    # the Markdown opens with the verdict, then the gate, then the comparison
    markdown = (output_dir / "retrieval-eval-latest.md").read_text(encoding="utf-8")
    sections = markdown.split("\n## ")
    assert sections[0].splitlines()[2].startswith("**Gate PASSED") and "against the baseline" in sections[0]
    assert sections[1].startswith("Gate: PASSED") and sections[2].startswith("Compared with baseline")
    assert "`rag.chain.bm25.enabled: true -> false`" in markdown
    assert "| nDCG@K |" in markdown

    # sieve compare on the two files gives the same comparison, without running anything
    code, out, _ = run(
        capsys,
        caplog,
        "compare",
        str(output_dir / "first.json"),
        str(output_dir / "retrieval-eval-latest.json"),
        "--json",
    )
    assert code == 0
    again = json.loads(out)
    assert again["metrics"] == comp["metrics"] and again["cases"] == comp["cases"]
    assert again["differences"] == comp["differences"]
    code, out, _ = run(
        capsys,
        caplog,
        "compare",
        str(output_dir / "first.json"),
        str(output_dir / "retrieval-eval-latest.json"),
    )
    assert code == 0 and BASELINE_LINE.fullmatch(out.splitlines()[0]) and "## Compared with baseline" in out


def test_a_forbidden_document_in_the_top_k_fails_eval_with_exit_1_naming_it(
    capsys, caplog, tmp_path: Path
) -> None:
    code, out, _ = run(capsys, caplog, "query", "工资什么时候发", "--json")
    assert code == 0
    second = json.loads(out)["documents"][1]["docId"]  # whatever ranks second is made forbidden
    golden = tmp_path / "golden.json"
    golden.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "id": "pay-forbidden",
                        "query": "工资什么时候发",
                        "expectedDocIds": ["hr-payroll-zh"],
                        "forbiddenDocIds": [second],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    code, out, err = run(capsys, caplog, "eval", "--golden-set", str(golden), "--baseline", "none")
    assert code == 1, out
    message = (
        f"max_forbidden_hits: forbidden documents in top K: 1, allowed 0 ({second} in case pay-forbidden)"
    )
    assert f"gate failed: {message}" in err
    report = json.loads(
        (tmp_path / "retrieval-eval" / "retrieval-eval-latest.json").read_text(encoding="utf-8")
    )
    assert report["gate"]["failures"] == [
        {
            "check": "max_forbidden_hits",
            "actual": 1.0,
            "limit": 0.0,
            "message": message,
        }
    ]


def test_a_baseline_file_that_cannot_be_used_is_exit_2_before_anything_runs(
    capsys, caplog, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.json"
    code, out, err = run(capsys, caplog, "eval", "--baseline", str(missing))
    assert code == 2
    assert f"{missing}: baseline report not found" in err
    assert not (tmp_path / "retrieval-eval").exists()
    code, _, err = run(capsys, caplog, "compare", str(missing), str(missing))
    assert code == 2 and "baseline report not found" in err


def test_a_run_that_fails_its_gate_never_becomes_the_baseline(
    capsys, caplog, monkeypatch, output_dir: Path
) -> None:
    code, out, _ = run(capsys, caplog, "eval")
    assert code == 0, out
    first = latest(output_dir)
    passing = output_dir / "retrieval-eval-passing.json"
    assert json.loads(passing.read_text(encoding="utf-8")) == first
    assert f"report: {passing}" in out

    code, out, err = run(capsys, caplog, "eval", "--min-ndcg", "0.999")
    assert code == 1, out
    second = latest(output_dir)
    assert second["gate"]["passed"] is False and "gate failed: min_ndcg" in err
    assert second["comparison"]["baseline"]["kind"] == "last passing"
    assert json.loads(passing.read_text(encoding="utf-8")) == first  # not replaced by the failed run

    monkeypatch.setenv("RAG__MODELS__QUERY_PROMPT", "query: ")
    code, out, logs = run(capsys, caplog, "eval")
    assert code == 0, out
    third = latest(output_dir)
    comp = third["comparison"]
    own = output_dir / first["run"]["reportFile"]
    assert (comp["baseline"]["kind"], comp["baseline"]["path"]) == ("last passing", str(own))
    assert comp["baseline"]["evaluatedAt"] == first["run"]["evaluatedAt"] != second["run"]["evaluatedAt"]
    assert comp["baseline"]["note"] == f"last passing report {own}"
    assert f"baseline: last passing report {own}" in out
    assert f"[RetrievalEval] baseline: last passing report {own}" in logs
    # a changed prompt is named among the differences, not reported as "What changed: nothing"
    assert comp["differences"] == ['rag.models.query_prompt: null -> "query: "']
    assert third["run"]["settingsSha256"] != first["run"]["settingsSha256"]
    assert third["run"]["chainSha256"] == first["run"]["chainSha256"]
    markdown = (output_dir / "retrieval-eval-latest.md").read_text(encoding="utf-8")
    assert f"Baseline (last passing) `{own}`" in markdown
    assert '`rag.models.query_prompt: null -> "query: "`' in markdown
    assert json.loads(passing.read_text(encoding="utf-8")) == third  # this one passed: the new pointer


def test_no_answer_cases_that_never_abstain_warn_and_eval_still_exits_0(
    capsys, caplog, monkeypatch, tmp_path: Path
) -> None:
    golden = tmp_path / "golden.json"
    cases = [
        {"id": "pay", "query": "工资什么时候发", "expectedDocIds": ["hr-payroll-zh"]},
        {"id": "na-1", "query": "公司食堂今天的菜单是什么", "expectNoAnswer": True},
        {"id": "na-2", "query": "What is the CEO's favourite colour?", "expectNoAnswer": True},
    ]
    golden.write_text(json.dumps({"cases": cases}, ensure_ascii=False), encoding="utf-8")
    args = ("eval", "--golden-set", str(golden), "--baseline", "none")
    code, out, err = run(capsys, caplog, *args)
    report = latest(tmp_path / "retrieval-eval")
    na = report["summary"]["noAnswer"]
    assert na["cases"] == 2
    abstained = round(na["correctAbstentionRate"] * 2)
    assert abstained == 0, "the default chain (fallback on) answers every query"
    message = "no_answer_policy: 0 of 2 no-answer cases abstained ("
    assert code == 0, err
    assert report["gate"]["passed"] is True and report["gate"]["failures"] == []
    (warning,) = report["gate"]["warnings"]
    assert warning["check"] == "no_answer_policy" and warning["message"].startswith(message)
    assert f"gate WARN: {message}" in err
    assert f"[RetrievalEval] gate WARN {message}" in err  # the log
    markdown = (tmp_path / "retrieval-eval" / "retrieval-eval-latest.md").read_text(encoding="utf-8")
    means = "no-answer cases that abstained (a count, not a rate), at least"
    assert "## Gate: PASSED (1 warning)" in markdown
    assert f"| no_answer_policy | {means} | 0.000 | >= 1 | WARN |" in markdown

    monkeypatch.setenv("RAG__EVALUATE__THRESHOLDS__NO_ANSWER_POLICY", "fail")
    code, _, err = run(capsys, caplog, *args)
    assert code == 1
    assert f"gate failed: {message}" in err and "gate WARN" not in err


def test_a_change_that_surfaces_unjudged_documents_fails_and_names_what_to_judge(
    capsys, caplog, monkeypatch, output_dir: Path
) -> None:
    """The sample set judges only its expected documents, so ranking by BM25 alone pushes expected
    documents down below documents nobody judged. Unjudged documents count as not relevant: the broken
    cases fail the gate by default, the message names how many new documents are unjudged, and since the
    sample set's Judged@K is far under the floor, the affected cases are "too thinly judged to tell", not
    "unverified": even `unjudged_policy: warn` does not leave them out."""
    code, out, _ = run(capsys, caplog, "eval", "--baseline", "none")
    assert code == 0, out
    baseline = str(output_dir / latest(output_dir)["run"]["reportFile"])
    monkeypatch.setenv("RAG__CHAIN__BM25__DENSE_WEIGHT", "0.0")
    monkeypatch.setenv("RAG__CHAIN__BM25__BM25_WEIGHT", "1.0")
    code, out, err = run(capsys, caplog, "eval", "--baseline", baseline)
    report = latest(output_dir)
    comp = report["comparison"]
    broken, thin = comp["cases"]["broken"], comp["cases"]["thinlyJudged"]
    assert broken, "BM25 alone breaks some case of the sample set"
    account = comp["unjudged"]
    headline = f"{account['newUnjudged']} of the {account['newInTopK']} new top-K documents are unjudged"
    assert f"; {headline}" in out
    for case_id in broken:
        detail = comp["caseDetails"][case_id]
        assert detail["verified"] is False and detail["why"].startswith("cannot tell: Judged@K ")
        assert case_id in thin and case_id not in comp["cases"]["unverified"]
    assert code == 1, err
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["max_broken_cases"]["value"] == len(broken)
    assert headline in checks["max_broken_cases"]["message"]
    assert "too few judgments for the condensed figures to tell" in checks["max_broken_cases"]["message"]
    assert f"gate failed: max_broken_cases: broken core cases (hit 1 -> 0): {len(broken)}, allowed 0" in err

    monkeypatch.setenv("RAG__EVALUATE__THRESHOLDS__UNJUDGED_POLICY", "warn")
    code, _, err = run(capsys, caplog, "eval", "--baseline", baseline)
    assert code == 1, "thinly judged regressions count even with unjudged_policy warn"
    assert "unverified_broken_cases" not in err
