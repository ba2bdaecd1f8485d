"""scripts/compare_eval_reports.py: two reports are equal apart from clocks, trace ids, paths and the commit;
any other changed figure is named by its JSON path; a ranked document's scores have their own, wider
tolerance."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from compare_eval_reports import differences, main  # noqa: E402


def report() -> dict[str, Any]:
    """A small report of the shape `sieve eval` writes: its run, a summary and one case."""
    return {
        "run": {
            "startedAt": "2026-01-01T00:00:00Z",
            "reportFile": "/a/report.json",
            "store": "/a/chroma",
            "codeVersion": "0afd009",
        },
        "summary": {"recall": 0.75, "mrr": 0.5, "budget": {"p95LatencyMs": 12.0, "topK": 5}},
        "audit": {"previousReport": "/a/previous.json", "findings": 2},
        "comparison": {"budget": {"p95Ms": {"current": 21.1}}, "differences": ["code: 0afd009 -> 0afd009"]},
        "cases": [
            {
                "id": "q1",
                "latencyMs": 3.2,
                "traceId": "trace-1",
                "metrics": {"recall": 1.0},
                "rankedDocuments": [{"docId": "A", "scores": {"dense": 0.81, "fused": 0.0312}}],
            }
        ],
    }


def changed(**at: Any) -> dict[str, Any]:
    """`report()` with the value at each path replaced; a path is its keys and indices joined by `__`."""
    out = report()
    for dotted, value in at.items():
        *parents, last = dotted.split("__")
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return out


def test_equal_documents_have_no_difference() -> None:
    assert list(differences(report(), copy.deepcopy(report()))) == []


@pytest.mark.parametrize(
    "path",
    [
        "run__startedAt",
        "run__reportFile",
        "run__store",
        "run__codeVersion",
        "audit__previousReport",
        "summary__budget__p95LatencyMs",
        "cases__0__latencyMs",
        "cases__0__traceId",
        "comparison__budget__p95Ms__current",
    ],
)
def test_clocks_trace_ids_and_paths_are_ignored(path: str) -> None:
    assert list(differences(report(), changed(**{path: "elsewhere"}))) == []


def test_the_code_line_of_the_comparison_is_ignored_and_any_other_line_is_not() -> None:
    moved = changed(comparison__differences=["code: 0afd009 -> c9bdb9f"])
    assert list(differences(report(), moved)) == []
    more = changed(comparison__differences=["code: 0afd009 -> c9bdb9f", "K: 5 -> 10"])
    assert list(differences(report(), more)) == ["comparison.differences: 0 items, then 1"]


def test_a_changed_figure_is_found_with_its_path() -> None:
    assert list(differences(report(), changed(cases__0__metrics__recall=0.5))) == [
        "cases[0].metrics.recall: 1.0 -> 0.5"
    ]
    assert list(differences(report(), changed(summary__budget__topK=10))) == ["summary.budget.topK: 5 -> 10"]


def test_a_key_or_an_item_on_one_side_only_is_a_difference() -> None:
    fewer = report()
    del fewer["audit"]["findings"]
    assert list(differences(report(), fewer)) == ["audit.findings: only in the first"]
    assert list(differences(fewer, report())) == ["audit.findings: only in the second"]
    more = report()
    more["cases"].append(copy.deepcopy(more["cases"][0]))
    assert list(differences(report(), more)) == ["cases: 1 items, then 2"]


def test_figures_are_equal_within_the_tolerance_and_scores_within_the_score_tolerance() -> None:
    assert list(differences(report(), changed(summary__mrr=0.5 + 1e-10))) == []
    assert list(differences(report(), changed(summary__mrr=0.5 + 1e-6))) == ["summary.mrr: 0.5 -> 0.500001"]
    scores = "cases__0__rankedDocuments__0__scores__fused"
    assert list(differences(report(), changed(**{scores: 0.0312 + 3e-6}))) == []
    assert list(differences(report(), changed(**{scores: 0.0312 + 2e-5}))) == [
        f"cases[0].rankedDocuments[0].scores.fused: 0.0312 -> {0.0312 + 2e-5!r}"
    ]


def test_the_command_exits_0_when_equal_and_1_with_one_line_per_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(report()), encoding="utf-8")
    after.write_text(json.dumps(changed(run__startedAt="later")), encoding="utf-8")
    assert main([str(before), str(after)]) == 0
    assert "0 difference(s)" in capsys.readouterr().err
    after.write_text(json.dumps(changed(summary__recall=0.7, summary__mrr=0.4)), encoding="utf-8")
    assert main([str(before), str(after)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == ["summary.mrr: 0.5 -> 0.4", "summary.recall: 0.75 -> 0.7"]
    assert "2 difference(s)" in out.err
