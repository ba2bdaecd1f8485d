"""Comparing two reports: pairing by id, statistics equal to their definitions, differences in words."""

from __future__ import annotations

import json
import os
from statistics import fmean

import pytest

from app.evaluation.compare.comparison import (
    BaselineError,
    compare_reports,
    describe_differences,
    fingerprint_of,
    load_report,
)
from app.evaluation.compare.gate import check_gate
from app.evaluation.render.lines import baseline_line
from app.evaluation.report.model import Comparison, Report, RunInfo
from app.evaluation.scoring.measures import GATED
from app.evaluation.scoring.stats import bootstrap_ci, max_t, sign_flip_p_value
from app.settings import EvaluateThresholds


def compare(baseline: dict, current: dict, path: str, **kwargs) -> Comparison:
    """`compare_reports` on two report JSONs, each validated as a `Report` first."""
    return compare_reports(Report.model_validate(baseline), Report.model_validate(current), path, **kwargs)


def metrics(ndcg: float, hit: float = 1.0) -> dict:
    return {
        "recall": hit,
        "hitRate": hit,
        "mrr": ndcg,
        "ndcg": ndcg,
        "precision": hit / 5,
        "top1Accuracy": hit,
    }


def report(ndcgs: dict, settings: dict | None = None, k: int = 5, hits: dict | None = None, **run) -> dict:
    hits = hits or {}
    return {
        "status": "ok",
        "run": {
            "settings": settings
            or {"retrieval": {"top_k": 5}, "chain": {"bm25": {"enabled": True, "dense_weight": 0.6}}},
            "k": k,
            "evaluatedAt": "2026-12-01T00:00:00+00:00",
            "goldenSetSha256": "g",
            "asOf": "2026-12-01",
            **run,
        },
        "stages": [{"name": "bm25", "removedRelevant": 0, "afterStage": {"recall": 0.9}}],
        "cases": [
            {
                "id": cid,
                "query": f"query {cid}",
                "topK": k,
                "caseSha256": f"sha-{cid}",
                "metrics": None if v is None else metrics(v, hits.get(cid, 1.0)),
                "rankedDocuments": [{"docId": f"doc-{cid}"}],
            }
            for cid, v in ndcgs.items()
        ],
    }


def comp_in(report_json: dict, case_id: str) -> dict:
    """The metrics of case `case_id` in a report JSON."""
    return next(c["metrics"] for c in report_json["cases"] if c["id"] == case_id)


def test_pairs_by_id_and_computes_the_defined_statistics() -> None:
    base = report({"a": 0.5, "b": 1.0, "c": 0.0, "d": 1.0, "gone": 1.0, "na": None}, hits={"c": 0.0})
    cur = report({"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "new": 1.0, "na": None}, hits={"d": 0.0})
    comp = compare(base, cur, "base.json", seed=42, alpha=0.05)

    def pairs(m: str) -> list[tuple[float, float]]:
        return [(comp_in(base, i)[m], comp_in(cur, i)[m]) for i in ("a", "b", "c", "d")]

    assert comp.comparable and comp.paired_cases == 4  # a, b, c, d (na has no metrics on either side)
    assert comp.cases.only_in_baseline == ["gone"] and comp.cases.only_in_current == ["new"]
    assert (comp.cases.fixed, comp.cases.broken) == (["c"], ["d"])
    diffs = [1.0 - 0.5, 1.0 - 1.0, 1.0 - 0.0, 0.0 - 1.0]  # sorted ids a, b, c, d
    row = comp.metrics["ndcg"]
    assert row.baseline == pytest.approx(fmean([0.5, 1.0, 0.0, 1.0]))
    assert row.delta == pytest.approx(fmean(diffs))
    # exact sign-flip on d = [0.5, 0, 1, -1]: see test_exact_p_of_the_pairing_example
    assert row.p_value == sign_flip_p_value(diffs) == 16 / 16
    assert row.ci95 == bootstrap_ci(diffs, seed=42)
    # the gated measures are tested together (max-T over their sign flips); the others are shown, not tested
    family = max_t({m: [after - before for before, after in pairs(m)] for m in GATED}, seed=42)
    assert {m: comp.metrics[m].p_adjusted for m in GATED} == {m: family[m].p_adjusted for m in GATED}
    assert {m: comp.metrics[m].p_value for m in GATED} == {m: family[m].p_value for m in GATED}
    assert comp.metrics["precision"].p_adjusted is None and not comp.metrics["precision"].significant
    assert [x.id for x in comp.cases.improved] == ["c", "a"] and [x.id for x in comp.cases.worsened] == ["d"]
    assert comp.case_details["c"].to_json() == {
        "query": "query c",
        "before": ["doc-c"],
        "now": ["doc-c"],
        "beforeFused": [None],
        "nowFused": [None],
        "newInTopK": [],
        "newUnjudged": [],
        "verified": True,
        "why": "",
    }
    out = comp.to_json()
    assert set(out) == {
        "baseline",
        "comparable",
        "differences",
        "pairedCases",
        "metrics",
        "cases",
        "stages",
        "caseDetails",
        "unjudged",
        "condensedMetrics",
        "judgedOfRegressions",
        "bySet",
        "removedCases",
        "addedCases",
        "composition",
        "budget",
        "segments",
        "pairedNoAnswer",
        "k",
        "notes",
        "baselineScored",
    }
    (gone,) = comp.removed_cases
    assert (gone.id, gone.metrics["ndcg"], gone.failed, gone.retired_reason) == ("gone", 1.0, False, None)
    assert [c.id for c in comp.added_cases] == ["new"]
    assert set(out["metrics"]["ndcg"]) == {
        "baseline",
        "current",
        "delta",
        "ci95",
        "pValue",
        "pAdjusted",
        "adjustment",
        "exact",
        "pError",
        "nearAlpha",
        "significant",
    }
    assert set(out["cases"]) == {
        "fixed",
        "broken",
        "improved",
        "worsened",
        "onlyInBaseline",
        "onlyInCurrent",
        "unverified",
        "brokenByRelabelling",
        "thinlyJudged",
        "renamed",
        "changed",
        "abstentionBroken",
        "abstentionFixed",
    }
    assert out["stages"] == [
        {
            "name": "bm25",
            "removedRelevant": {"baseline": 0, "current": 0},
            "recallAfter": {"baseline": 0.9, "current": 0.9},
        }
    ]


def test_exact_p_of_the_pairing_example() -> None:
    # d = [0.5, 0, 1, -1]: T = |0.5| / 4. Over the signs of (0.5, 1, 1) the sums are 2.5, 0.5, 0.5, -1.5 and
    # their negatives: every |sum| >= 0.5, so all 8 count, doubled by the 0's sign: 16 of 16.
    assert sign_flip_p_value([0.5, 0.0, 1.0, -1.0]) == 16 / 16


def test_a_different_k_is_compared_at_the_smaller_k() -> None:
    # K 5 -> 10: the current lists are cut to the baseline's K and scored again from their documents.
    base = report({"a": 1.0})
    cur = report({"a": 1.0}, k=10)
    for case in (base["cases"][0], cur["cases"][0]):
        case["expected"], case["matchOn"] = {"doc-a": 1.0}, "doc"
    cur["cases"][0]["rankedDocuments"] = [{"docId": f"x{i}"} for i in range(5)] + [{"docId": "doc-a"}]
    comp = compare(base, cur, "b.json")
    assert comp.comparable and comp.k == 5 and comp.paired_cases == 1
    assert comp.notes == ["compared at K=5: the current run's lists (K=10) cut to K=5 for 1 paired case(s)"]
    assert "K: 5 -> 10" in comp.differences
    # doc-a at rank 6 is outside the top 5: a miss at the compared K (it would be a hit at K=10)
    assert comp.metrics["hitRate"].current == 0.0 and comp.cases.broken == ["a"]


def test_a_case_whose_own_top_k_changed_is_left_out_and_listed() -> None:
    base = report({"a": 1.0, "b": 1.0})
    cur = report({"a": 1.0, "b": 1.0})
    cur["cases"][1]["topK"] = 3  # b's own topK: 5 -> 3 (the run's K stays 5)
    comp = compare(base, cur, "b.json")
    assert comp.comparable and comp.paired_cases == 1
    assert [(c.id, c.reason) for c in comp.cases.changed] == [("b", "its own topK changed: 5 -> 3")]


def test_a_renamed_case_is_paired_by_content() -> None:
    base = report({"a": 1.0, "b": 0.5})
    cur = report({"a2": 1.0, "b2": 0.5})
    cur["cases"][0]["caseSha256"], cur["cases"][1]["caseSha256"] = "sha-a", "sha-b"
    comp = compare(base, cur, "b.json")
    assert comp.paired_cases == 2 and comp.removed_cases == [] and comp.added_cases == []
    assert [(r.baseline_id, r.id) for r in comp.cases.renamed] == [("a", "a2"), ("b", "b2")]
    assert "golden set: 2 case(s) renamed, paired by content (a -> a2, b -> b2)" in comp.differences


def test_a_case_that_leaves_the_scoring_is_a_removal_with_its_reason() -> None:
    base = report({"a": 1.0, "b": 0.63})
    cur = report({"a": 1.0, "b": None})
    cur["cases"][1]["unscorable"] = "every expected chunk id is stale"
    comp = compare(base, cur, "b.json")
    assert comp.paired_cases == 1
    (left,) = comp.removed_cases
    assert (left.id, left.hard, left.left_scoring) == ("b", True, "every expected chunk id is stale")
    assert left.way_back is not None and "sieve golden check" in left.way_back


def test_nothing_paired_is_not_comparable() -> None:
    comp = compare(report({"a": 1.0}), report({"z": 1.0}), "b.json")
    assert not comp.comparable and comp.metrics == {} and comp.paired_cases == 0


def test_differences_name_each_changed_setting_with_old_and_new_value() -> None:
    before = report({})["run"]
    after = report(
        {},
        settings={"retrieval": {"top_k": 5}, "chain": {"bm25": {"enabled": False, "dense_weight": 0.7}}},
        asOf="2027-01-01",
        embedder={"name": "other", "dimension": 8, "checksum": "x"},
        corpusFingerprint={"chunks": 12, "sha256": "b"},
    )["run"]
    before = {
        **before,
        "embedder": {"name": "e5", "dimension": 384, "checksum": "c"},
        "corpusFingerprint": {"chunks": 10, "sha256": "a"},
    }
    assert describe_differences(
        fingerprint_of(RunInfo.model_validate(before)), fingerprint_of(RunInfo.model_validate(after))
    ) == [
        "rag.chain.bm25.dense_weight: 0.6 -> 0.7",
        "rag.chain.bm25.enabled: true -> false",
        "embedder: e5 (dim 384, checksum c) -> other (dim 8, checksum x)",
        "corpus: 10 -> 12 chunks (+2 net; the chunk ids differ, so chunks were added, removed or re-chunked)",
        "asOf: 2026-12-01 -> 2027-01-01",
    ]


def test_golden_set_changes_are_listed() -> None:
    base = report({"a": 1.0, "b": 1.0})
    cur = report({"a": 1.0, "c": 1.0}, goldenSetSha256="h")
    cur["cases"][0]["caseSha256"] = "edited"
    comp = compare(base, cur, "b.json")
    assert "golden set: 1 case(s) added (c); 1 case(s) removed (b); 1 case(s) changed (a)" in comp.differences


def test_log_line_format() -> None:
    base = report({"a": 0.5, "b": 1.0})
    cur = report({"a": 1.0, "b": 1.0})
    comp = compare(base, cur, "b.json").to_json()
    ci = comp["metrics"]["ndcg"]["ci95"]
    assert baseline_line(Comparison.model_validate(comp), "@5") == (
        f"vs baseline 2026-12-01T00:00:00+00:00 (2 paired): nDCG@5 0.750 -> 1.000 (+0.250, "
        f"95% CI [{ci[0]:.3f}, {ci[1]:.3f}], p=1, adjusted 1) fixed=0 broken=0"
    )


def test_load_report_names_the_file_for_each_problem(tmp_path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(BaselineError, match="none.json: baseline report not found"):
        load_report(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(BaselineError, match="bad.json: not a JSON report"):
        load_report(bad)
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"status": "invalid", "run": {}, "cases": []}), encoding="utf-8")
    with pytest.raises(BaselineError, match="did not evaluate anything"):
        load_report(invalid)
    other = tmp_path / "other.json"
    other.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(BaselineError, match="not a Sieve evaluation report"):
        load_report(other)
    assert os.path.exists(bad)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r["cases"][0]["metrics"].update(ndcg="high"),
            "case 'a' (cases[0]): metrics.ndcg: Input should be a valid number, unable to parse string as a "
            "number",
        ),
        (
            lambda r: r["cases"][0]["metrics"].pop("ndcg"),
            "case 'a' (cases[0]): metrics.ndcg must be a number, got None",
        ),
        (lambda r: r["cases"].append(dict(r["cases"][0])), "case 'a' (cases[1]): duplicate case id"),
        (
            lambda r: r["cases"][0].update(metrics=[1]),
            "case 'a' (cases[0]): metrics: Input should be an object",
        ),
        (
            lambda r: r["cases"][0].update(rankedDocuments="x"),
            "case 'a' (cases[0]): rankedDocuments: Input should be a valid array",
        ),
        (
            lambda r: r["cases"][0]["rankedDocuments"][0].pop("docId"),
            "case 'a' (cases[0]): rankedDocuments[0].docId: Field required",
        ),
        (lambda r: r.update(stages=[1]), "stages[0]: Input should be an object"),
        (lambda r: r.update(run=[]), "run: Input should be an object"),
        (
            lambda r: r["run"].update(corpusFingerprint={"chunks": "many", "sha256": "a"}),
            "run.corpusFingerprint.chunks: Input should be a valid integer, unable to parse string as an "
            "integer",
        ),
    ],
)
def test_load_report_rejects_a_hand_edited_report_naming_file_case_and_field(
    tmp_path, mutate, message
) -> None:
    data = report({"a": 1.0})
    mutate(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BaselineError) as caught:
        load_report(path)
    assert str(caught.value) == f"{path}: {message}"


def _case(cid: str, top: list[str], hit: float, condensed_hit: float, unjudged: list[str]) -> dict:
    return {
        "id": cid,
        "query": f"query {cid}",
        "topK": 2,
        "matchOn": "doc",
        "caseSha256": f"sha-{cid}",
        "expected": {"rel": 1.0, "bad": 0.0},
        "forbiddenDocIds": [],
        "metrics": metrics(hit, hit),
        "condensed": {m: condensed_hit for m in ("recall", "hitRate", "mrr", "ndcg", "precision")},
        "unjudged": unjudged,
        "rankedDocuments": [{"docId": d} for d in top],
    }


def _two_case_report(cases: list[dict]) -> dict:
    base = report({})
    base["run"]["k"] = 2
    base["cases"] = cases
    return base


def test_a_drop_that_comes_from_unjudged_documents_is_unverified_and_counted() -> None:
    baseline = _two_case_report(
        [_case("pushed", ["rel", "x"], 1.0, 1.0, ["x"]), _case("real", ["rel", "y"], 1.0, 1.0, ["y"])]
    )
    current = _two_case_report(
        [
            # two unjudged documents pushed the relevant one out; with them removed it is back at rank 1
            _case("pushed", ["new1", "new2"], 0.0, 1.0, ["new1", "new2"]),
            # a judged-not-relevant document and one unjudged pushed it out; the condensed list drops too
            _case("real", ["bad", "new3"], 0.0, 0.0, ["new3"]),
        ]
    )
    comp = compare(baseline, current, "base.json")
    assert comp.cases.broken == ["pushed", "real"]
    assert comp.cases.unverified == ["pushed"]
    assert comp.unjudged is not None
    # new in the top K: pushed {new1, new2}, real {bad, new3} -> 4; unjudged of them: new1, new2, new3 -> 3
    assert (comp.unjudged.new_in_top_k, comp.unjudged.new_unjudged) == (2 + 2, 2 + 1)
    assert comp.unjudged.headline == "3 of the 4 new top-K documents are unjudged"
    pushed, real = comp.case_details["pushed"].to_json(), comp.case_details["real"].to_json()
    assert (pushed["newUnjudged"], pushed["verified"]) == (["new1", "new2"], False)
    assert pushed["why"] == (
        "unverified: 2 unjudged new document(s) in the top K (new1, new2); with them removed "
        "hitRate 1.000 -> 1.000"
    )
    assert (real["newUnjudged"], real["verified"], real["why"]) == (["new3"], True, "")
    line = baseline_line(comp, "@2")
    assert line.endswith(
        "fixed=0 broken=2; 3 of the 4 new top-K documents are unjudged (1 unverified: pushed)"
    )


def test_a_baseline_without_condensed_figures_calls_any_drop_with_new_unjudged_documents_unverified() -> None:
    before = _case("a", ["rel", "x"], 1.0, 1.0, [])
    del before["condensed"]
    baseline = _two_case_report([before])
    current = _two_case_report([_case("a", ["bad", "n"], 0.0, 0.0, ["n"])])
    comp = compare(baseline, current, "base.json")
    assert comp.cases.unverified == ["a"]
    assert comp.case_details["a"].why == "unverified: 1 unjudged new document(s) in the top K (n)"


def test_a_report_without_newer_fields_loads_as_a_baseline_and_names_no_unknown_change(tmp_path) -> None:
    # a schemaVersion 2 report: no codeVersion, no fused scores, no expectedContent, no beforeFused
    old = report({"a": 1.0, "b": 0.5})
    old["schemaVersion"] = 2
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    loaded = load_report(path)
    assert loaded.schema_version == 2 and loaded.run.code_version is None
    comp = compare_reports(
        loaded, Report.model_validate(report({"a": 1.0, "b": 0.5}, codeVersion="abc")), "old.json"
    )
    assert comp.differences == []
    assert "codeVersion" not in comp.baseline.run


def test_a_current_report_without_unjudged_lists_counts_ids_outside_expected_and_forbidden() -> None:
    baseline = _two_case_report([_case("a", ["rel", "x"], 1.0, 1.0, [])])
    now = _case("a", ["bad", "n"], 0.0, 0.0, [])
    del now["unjudged"]  # a report written before Judged@K
    comp = compare(baseline, _two_case_report([now]), "base.json")
    # new in the top 2: bad (judged not relevant: it is in `expected` with grade 0) and n (unjudged)
    assert comp.case_details["a"].new_in_top_k == ["bad", "n"]
    assert comp.case_details["a"].new_unjudged == ["n"]


def test_abstention_is_paired_and_a_lost_abstention_is_broken() -> None:
    # Four no-answer cases abstained in the baseline; now all four answer: broken, like hit 1 -> 0, and
    # CorrectAbstention 1 -> 0 with the exact sign-flip p of four same-sign pairs, 2/2^4.
    base = report({"a": 1.0, "na1": None, "na2": None, "na3": None, "na4": None})
    cur = report({"a": 1.0, "na1": None, "na2": None, "na3": None, "na4": None})
    for side, abstained in ((base, True), (cur, False)):
        for case in side["cases"][1:]:
            case["expectNoAnswer"], case["abstained"] = True, abstained
    comp = compare(base, cur, "b.json")
    assert comp.paired_no_answer == 4 and comp.baseline_scored == 5
    assert comp.cases.abstention_broken == ["na1", "na2", "na3", "na4"]
    row = comp.metrics["correctAbstention"]
    assert (row.baseline, row.current, row.p_value) == (1.0, 0.0, 2 / 2**4)
    result = check_gate(
        Report.model_validate({**cur, "summary": {"scoredCases": 1, "noAnswer": {"cases": 4}}}),
        EvaluateThresholds(),
        comparison=comp,
    )
    (failure,) = [f for f in result.failures if f.check == "abstention_broken"]
    assert failure.actual == 4.0 and "na1, na2, na3, na4" in failure.message
