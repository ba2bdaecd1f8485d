"""A passing run replaces the last passing baseline only when it is not worse than it: small drops, each
too small to fail the gate, never walk the baseline down; `sieve baseline accept` takes a run on purpose."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from app.cli import main
from app.evaluation.compare.baselines import (
    baseline_update,
    passing_report_path,
    record_passing,
    worse_than,
)
from app.evaluation.report.model import Report
from app.settings import EvaluateSettings

PREFIX = "retrieval-eval"


def report(stamp: str, ndcgs: dict[str, float], k: int = 5) -> Report:
    """A passing report whose cases score nDCG as given (recall, hit rate and MRR 1)."""
    cases = [
        {
            "id": case_id,
            "query": f"q {case_id}",
            "topK": k,
            "metrics": {
                "recall": 1.0,
                "hitRate": 1.0,
                "mrr": 1.0,
                "ndcg": ndcg,
                "precision": 0.2,
                "top1Accuracy": 1.0,
            },
        }
        for case_id, ndcg in ndcgs.items()
    ]
    return Report.model_validate(
        {
            "run": {"evaluatedAt": stamp, "reportFile": f"{PREFIX}-{stamp}.json", "k": k},
            "summary": {"ndcg": sum(ndcgs.values()) / len(ndcgs)},
            "cases": cases,
        }
    )


def settings(tmp_path: Path, **more: object) -> EvaluateSettings:
    return EvaluateSettings(output_dir=str(tmp_path), **more)


def on_disk(ev: EvaluateSettings) -> Report:
    return Report.model_validate_json(passing_report_path(ev).read_text(encoding="utf-8"))


def test_three_successive_small_drops_do_not_walk_the_baseline_down(tmp_path) -> None:
    ev = settings(tmp_path)
    first = report("t0", {"a": 1.0, "b": 1.0, "c": 0.9})
    assert record_passing(first, ev, baseline_update(first, ev, gate_passed=True)) is not None
    for step, ndcg in enumerate((0.89, 0.88, 0.87), start=1):
        run = report(f"t{step}", {"a": 1.0, "b": 1.0, "c": ndcg})
        update = baseline_update(run, ev, gate_passed=True)  # each drop too small to fail its gate
        assert update.promoted is False
        # measured against the same first baseline every time: the drops add up
        mean_before, mean_now = (1.0 + 1.0 + 0.9) / 3, (1.0 + 1.0 + ndcg) / 3
        assert f"ndcg {mean_before:.3f} -> {mean_now:.3f}" in update.reason
        assert record_passing(run, ev, update) is None
    assert on_disk(ev) == first


def test_a_run_as_good_or_better_replaces_the_baseline(tmp_path) -> None:
    ev = settings(tmp_path)
    first = report("t0", {"a": 1.0, "b": 0.5})
    record_passing(first, ev, baseline_update(first, ev, True))
    same = report("t1", {"a": 1.0, "b": 0.5})
    assert baseline_update(same, ev, True).promoted
    better = report("t2", {"a": 1.0, "b": 0.9, "new": 0.1})  # a new case does not count against it
    update = baseline_update(better, ev, True)
    assert update.promoted and update.reason.startswith("not worse than the last passing baseline")
    record_passing(better, ev, update)
    assert on_disk(ev) == better


@pytest.mark.parametrize(("tolerance", "promoted"), [(0.0, False), (0.01, False), (0.02, True)])
def test_the_tolerance_is_the_largest_drop_of_a_mean_allowed(tmp_path, tolerance, promoted) -> None:
    ev = settings(tmp_path, baseline_tolerance=tolerance)
    first = report("t0", {"a": 1.0, "b": 1.0})
    record_passing(first, ev, baseline_update(first, ev, True))
    lower = report("t1", {"a": 1.0, "b": 0.97})  # mean nDCG drop (1.0 - 0.97) / 2 = 0.015
    assert baseline_update(lower, ev, True).promoted is promoted


def ranked(stamp: str, k: int, docs: list[str]) -> Report:
    """A report of one case `a` expecting d1, its ranking `docs`, scored at `k` (figures recorded as the
    run scored them: d1 at rank r gives MRR 1/r and nDCG 1/log2(r + 1))."""
    rank = docs.index("d1") + 1 if "d1" in docs[:k] else None
    ndcg = 1 / math.log2(rank + 1) if rank else 0.0
    metrics = {"recall": float(bool(rank)), "hitRate": float(bool(rank)), "mrr": 1 / rank if rank else 0.0}
    metrics |= {"ndcg": ndcg, "precision": float(bool(rank)) / k, "top1Accuracy": float(rank == 1)}
    case = {
        "id": "a",
        "query": "q",
        "topK": k,
        "matchOn": "doc",
        "expected": {"d1": 1.0},
        "metrics": metrics,
        "rankedDocuments": [{"rank": i + 1, "docId": d} for i, d in enumerate(docs[:k])],
    }
    return Report.model_validate({"run": {"evaluatedAt": stamp, "k": k}, "cases": [case]})


def test_a_deeper_run_is_judged_at_the_baselines_k(tmp_path) -> None:
    # K 5 -> 10: the K=10 lists are cut to 5 before the means are compared. d1 at rank 7 of 10 is a hit at
    # K=10 but none at K=5: worse on every gated measure; at rank 1 of 10 it is as good as the baseline.
    base = ranked("t0", 5, ["d1", "x1", "x2", "x3", "x4"])
    deeper_miss = ranked("t1", 10, ["x1", "x2", "x3", "x4", "x5", "x6", "d1", "x7", "x8", "x9"])
    assert worse_than(base, deeper_miss, 0.0) == [
        f"{m} 1.000 -> 0.000 (-1.000 over 1 paired cases)" for m in ("recall", "hitRate", "mrr", "ndcg")
    ]
    deeper_hit = ranked("t1", 10, ["d1", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9"])
    assert worse_than(base, deeper_hit, 0.0) == []


def test_a_run_that_cannot_be_set_beside_the_baseline_is_not_promoted(tmp_path) -> None:
    base = report("t0", {"a": 1.0})
    assert worse_than(base, report("t1", {"other": 1.0}), 0.0) == ["no case is paired with the baseline"]


def test_failed_gate_invalid_set_and_first_run(tmp_path) -> None:
    ev = settings(tmp_path)
    run = report("t0", {"a": 1.0})
    assert baseline_update(run, ev, False).reason == "the gate failed"
    assert baseline_update(run.model_copy(update={"status": "invalid"}), ev, True).promoted is False
    assert baseline_update(run, ev, True).reason == "the first passing run"


def test_baseline_accept_takes_the_latest_report_or_a_file(tmp_path, capsys) -> None:
    ev = settings(tmp_path)
    first = report("t0", {"a": 1.0})
    record_passing(first, ev, baseline_update(first, ev, True))
    worse = report("t1", {"a": 0.5})
    (tmp_path / f"{PREFIX}-latest.json").write_text(json.dumps(worse.to_json()), encoding="utf-8")
    assert main(["baseline", "accept", "--output-dir", str(tmp_path)]) == 0
    assert on_disk(ev) == worse
    assert (
        f"accepted {tmp_path / f'{PREFIX}-latest.json'} as the last passing baseline"
        in capsys.readouterr().out
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps(first.to_json()), encoding="utf-8")
    assert main(["baseline", "accept", str(other), "--output-dir", str(tmp_path)]) == 0
    assert on_disk(ev) == first
    assert main(["baseline", "accept", str(tmp_path / "missing.json"), "--output-dir", str(tmp_path)]) == 2
    assert "missing.json: baseline report not found" in capsys.readouterr().err
