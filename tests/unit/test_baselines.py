"""Which report a run is compared with: pinned, else last passing, else none (previous-passing); the -latest
report or the newest usable timestamped one (previous); the pointer only a passing run on a valid golden
set writes; `sieve baseline pin | unpin | show`. Files in tmp_path, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.evaluation.compare import baselines
from app.evaluation.compare.baselines import (
    baseline_update,
    latest_report_path,
    passing_report_path,
    pinned_report_path,
    record_passing,
    resolve_baseline,
)
from app.evaluation.compare.comparison import BaselineError
from app.evaluation.render.files import write_reports
from app.evaluation.report.model import Report, ServiceDescription
from app.evaluation.run.build import invalid_report
from app.evaluation.session import EvaluationTarget, evaluate
from app.settings import ChainSettings, EvaluateSettings

PREFIX = "retrieval-eval"


def report(stamp: str, passed: bool = True, status: str = "ok", ndcg: float = 0.9) -> dict:
    figures = {"recall": 1.0, "hitRate": 1.0, "mrr": 1.0, "ndcg": ndcg, "precision": 0.2, "top1Accuracy": 1.0}
    return {
        "status": status,
        "run": {"evaluatedAt": f"{stamp}-at", "reportFile": f"{PREFIX}-{stamp}.json", "k": 5},
        "summary": {"ndcg": ndcg},
        "gate": {"passed": passed, "checks": [], "failures": [], "notes": []},
        "cases": [{"id": "a", "query": "q a", "topK": 5, "metrics": figures}],
    }


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def settings(tmp_path: Path, baseline: str = "previous-passing", **more: object) -> EvaluateSettings:
    return EvaluateSettings(output_dir=str(tmp_path), baseline=baseline, **more)


def test_previous_passing_is_the_default() -> None:
    assert EvaluateSettings().baseline == "previous-passing"


def test_previous_passing_without_a_passing_report_has_no_baseline_and_says_why(tmp_path) -> None:
    write(latest_report_path(settings(tmp_path)), report("20260101T000000Z", passed=False))
    chosen = resolve_baseline(settings(tmp_path))
    assert chosen.report is None and chosen.kind is None
    assert chosen.note.startswith(f"no passing report yet: no run in {tmp_path} has passed its gate")
    assert "sieve baseline pin FILE" in chosen.note


def test_previous_passing_uses_the_pinned_report_before_the_passing_one(tmp_path) -> None:
    ev = settings(tmp_path)
    write(passing_report_path(ev), report("20260102T000000Z"))
    chosen = resolve_baseline(ev)
    assert (chosen.kind, chosen.path) == ("last passing", str(passing_report_path(ev)))
    assert chosen.report.run.evaluated_at == "20260102T000000Z-at"
    assert chosen.note == f"last passing report {passing_report_path(ev)}"

    write(pinned_report_path(ev), report("20260101T000000Z", passed=False))
    chosen = resolve_baseline(ev)
    assert (chosen.kind, chosen.path) == ("pinned", str(pinned_report_path(ev)))
    assert chosen.report.run.evaluated_at == "20260101T000000Z-at"
    assert chosen.note == f"pinned report {pinned_report_path(ev)}"


def test_the_passing_report_is_named_by_its_own_timestamped_copy_while_that_exists(tmp_path) -> None:
    ev = settings(tmp_path)
    own = write(tmp_path / f"{PREFIX}-20260102T000000Z.json", report("20260102T000000Z"))
    write(passing_report_path(ev), report("20260102T000000Z"))
    assert resolve_baseline(ev).path == str(own)
    own.unlink()  # pruned: the pointer is a whole copy and still serves
    assert resolve_baseline(ev).path == str(passing_report_path(ev))


def test_an_unusable_pinned_report_is_an_error_naming_it(tmp_path) -> None:
    ev = settings(tmp_path)
    write(passing_report_path(ev), report("20260102T000000Z"))
    pinned_report_path(ev).write_text("{", encoding="utf-8")
    with pytest.raises(BaselineError, match=r"retrieval-eval-pinned\.json: not a JSON report.*unpin"):
        resolve_baseline(ev)


def test_previous_uses_the_latest_report_even_when_its_gate_failed(tmp_path) -> None:
    ev = settings(tmp_path, "previous")
    write(passing_report_path(ev), report("20260101T000000Z"))
    write(latest_report_path(ev), report("20260102T000000Z", passed=False))
    chosen = resolve_baseline(ev)
    assert chosen.kind == "previous"
    assert chosen.report.run.evaluated_at == "20260102T000000Z-at"


def test_previous_skips_an_invalid_latest_for_the_newest_usable_timestamped_report(tmp_path) -> None:
    ev = settings(tmp_path, "previous")
    write(tmp_path / f"{PREFIX}-20260101T000000Z.json", report("20260101T000000Z"))
    good = write(tmp_path / f"{PREFIX}-20260102T000000Z.json", report("20260102T000000Z", passed=False))
    broken = report("20260103T000000Z", status="invalid")
    write(tmp_path / f"{PREFIX}-20260103T000000Z.json", broken)
    write(latest_report_path(ev), broken)
    chosen = resolve_baseline(ev)
    assert (chosen.kind, chosen.path) == ("previous", str(good))
    assert chosen.report.run.evaluated_at == "20260102T000000Z-at"
    assert chosen.note.startswith(
        f"previous report {good}: the newest usable one (retrieval-eval-latest.json"
    )
    assert "did not evaluate anything" in chosen.note


def test_previous_with_nothing_usable_has_no_baseline(tmp_path) -> None:
    ev = settings(tmp_path, "previous")
    broken = report("20260103T000000Z", status="invalid")
    write(tmp_path / f"{PREFIX}-20260103T000000Z.json", broken)
    write(latest_report_path(ev), broken)
    chosen = resolve_baseline(ev)
    assert chosen.report is None
    assert "no older timestamped report" in chosen.note
    assert resolve_baseline(settings(tmp_path / "empty", "previous")).note.endswith("(first run)")


def test_none_and_a_configured_file(tmp_path) -> None:
    assert resolve_baseline(settings(tmp_path, "none")).report is None
    path = write(tmp_path / "mine.json", report("20260101T000000Z"))
    chosen = resolve_baseline(settings(tmp_path, str(path)))
    assert (chosen.kind, chosen.path, chosen.note) == (
        "configured file",
        str(path),
        f"configured report {path}",
    )
    with pytest.raises(BaselineError, match="nope.json: baseline report not found"):
        resolve_baseline(settings(tmp_path, str(tmp_path / "nope.json")))


@pytest.mark.parametrize(
    ("passed", "status", "write_json", "written"),
    [
        (True, "ok", True, True),
        (False, "ok", True, False),  # the gate failed
        (True, "invalid", True, False),  # a broken golden set
        (True, "ok", False, False),  # no JSON reports at all
    ],
)
def test_only_a_passing_run_on_a_valid_golden_set_writes_the_pointer(
    tmp_path, passed, status, write_json, written
) -> None:
    ev = settings(tmp_path, write_json=write_json)
    before = report("20260101T000000Z")
    write(passing_report_path(ev), before)
    new = report("20260102T000000Z", passed=passed, status=status)
    update = baseline_update(Report.model_validate(new), ev, passed)
    path = record_passing(Report.model_validate(new), ev, update)
    assert (path is not None) is written
    on_disk = json.loads(passing_report_path(ev).read_text(encoding="utf-8"))
    if written:
        assert on_disk == Report.model_validate(new).to_json()
    else:
        assert on_disk == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_broken_golden_set_at_startup_leaves_the_passing_pointer_and_the_next_run_its_baseline(
    tmp_path,
) -> None:
    ev = settings(tmp_path, resource_location=str(tmp_path / "missing-golden.json"))
    kept = write(passing_report_path(ev), report("20260101T000000Z"))
    described = {
        "embedder": {"name": "e5"},
        "reranker": None,
        "store": "s",
        "collection": "c",
        "chunks": 0,
        "retrieval": {"candidate_k": 50, "hybrid": False},
        "chain": {},
        "settings": {},
    }
    target = EvaluationTarget(
        chain=None,  # type: ignore[arg-type]
        known=None,  # type: ignore[arg-type]
        described=ServiceDescription.model_validate(described),
        chain_settings=ChainSettings(),
    )
    outcome = evaluate(target, ev)
    assert outcome.invalid_golden_set is not None
    assert json.loads(latest_report_path(ev).read_text(encoding="utf-8"))["status"] == "invalid"
    assert json.loads(kept.read_text(encoding="utf-8")) == report("20260101T000000Z")
    assert resolve_baseline(ev).kind == "last passing"


def test_pruning_the_timestamped_reports_never_touches_the_pointer_files(tmp_path) -> None:
    ev = settings(tmp_path, keep_reports=1, write_markdown=False, write_html=False)
    first = Report.model_validate(report("20260101T000000Z"))
    write_reports(first, ev, None, "20260101T000000Z")
    record_passing(first, ev, baseline_update(first, ev, True))
    write(pinned_report_path(ev), first.to_json())
    for stamp in ("20260102T000000Z", "20260103T000000Z"):
        write_reports(Report.model_validate(report(stamp, passed=False)), ev, None, stamp)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        f"{PREFIX}-20260103T000000Z.json",
        f"{PREFIX}-latest.json",
        f"{PREFIX}-passing.json",
        f"{PREFIX}-pinned.json",
    ]
    assert resolve_baseline(settings(tmp_path, keep_reports=1)).report == first
    pinned_report_path(ev).unlink()
    chosen = resolve_baseline(ev)
    assert (chosen.kind, chosen.path, chosen.report) == ("last passing", str(passing_report_path(ev)), first)


def test_invalid_report_is_refused_as_a_pin(tmp_path) -> None:
    bad = write(
        tmp_path / "bad.json", invalid_report("g.json", "broken", {}, "2026-12-01T00:00:00+00:00").to_json()
    )
    with pytest.raises(BaselineError, match="bad.json: the baseline run did not evaluate anything"):
        baselines.pin(bad, settings(tmp_path / "out"))
    assert not pinned_report_path(settings(tmp_path / "out")).exists()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sieve_baseline_pin_show_unpin(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("RAG__EVALUATE__BASELINE", raising=False)
    out_dir = tmp_path / "reports"
    ev = settings(out_dir)
    source = tmp_path / "chosen.json"
    source.write_text(json.dumps(report("20260101T000000Z", ndcg=0.972), indent=3), encoding="utf-8")

    code, out, _ = run_cli(capsys, "baseline", "show", "--output-dir", str(out_dir))
    assert code == 0
    assert out.splitlines() == [
        "rag.evaluate.baseline: previous-passing",
        "pinned: none",
        "last passing: none",
        "latest: none",
        f"next run: no baseline: {resolve_baseline(ev).note}",
    ]

    code, out, _ = run_cli(capsys, "baseline", "pin", str(source), "--output-dir", str(out_dir))
    assert code == 0
    pinned = pinned_report_path(ev)
    assert out.splitlines()[0] == (
        f"pinned {source} as {pinned} (evaluated 20260101T000000Z-at, gate passed, nDCG 0.972)"
    )
    assert pinned.read_bytes() == source.read_bytes()  # a byte copy

    write(passing_report_path(ev), report("20260102T000000Z", ndcg=0.978))
    code, out, _ = run_cli(capsys, "baseline", "show", "--output-dir", str(out_dir))
    assert out.splitlines()[1:] == [
        f"pinned: {pinned} (evaluated 20260101T000000Z-at, gate passed, nDCG 0.972)",
        f"last passing: {passing_report_path(ev)} (evaluated 20260102T000000Z-at, gate passed, nDCG 0.978)",
        "latest: none",
        f"next run compares with: pinned report {pinned}",
    ]

    code, out, _ = run_cli(capsys, "baseline", "unpin", "--output-dir", str(out_dir))
    assert (code, out) == (0, f"unpinned: removed {pinned}\n")
    code, out, _ = run_cli(capsys, "baseline", "unpin", "--output-dir", str(out_dir))
    assert (code, out) == (0, "nothing was pinned\n")
    code, out, _ = run_cli(capsys, "baseline", "show", "--output-dir", str(out_dir))
    assert out.splitlines()[-1] == f"next run compares with: last passing report {passing_report_path(ev)}"


def test_sieve_baseline_pin_of_a_bad_file_is_exit_2_naming_it(tmp_path, capsys) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}', encoding="utf-8")
    code, _, err = run_cli(capsys, "baseline", "pin", str(bad), "--output-dir", str(tmp_path / "out"))
    assert code == 2
    assert err.strip() == f"error: {bad}: not a Sieve evaluation report (no 'run' and 'cases')"
    code, _, err = run_cli(capsys, "baseline", "pin", str(tmp_path / "gone.json"))
    assert code == 2 and "gone.json: baseline report not found" in err


def test_sieve_baseline_pin_says_when_the_pinned_report_failed_its_gate_or_is_not_used(
    tmp_path, capsys
) -> None:
    source = write(tmp_path / "failed.json", report("20260101T000000Z", passed=False))
    code, out, _ = run_cli(capsys, "baseline", "pin", str(source), "--output-dir", str(tmp_path / "out"))
    assert code == 0
    assert "note: that report's gate FAILED; it is the baseline all the same, as pinned" in out
    config = tmp_path / "previous.yml"
    config.write_text(f"rag:\n  evaluate:\n    baseline: previous\n    output_dir: {tmp_path / 'o2'}\n")
    code, out, _ = run_cli(capsys, "--config", str(config), "baseline", "pin", str(source))
    assert code == 0
    assert "note: rag.evaluate.baseline is previous: the pin is used only with previous-passing" in out
    code, out, _ = run_cli(capsys, "--config", str(config), "baseline", "show")
    assert out.splitlines()[-1] == (
        "note: the pinned report is used only with rag.evaluate.baseline: previous-passing"
    )
