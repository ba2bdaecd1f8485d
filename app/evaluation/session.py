"""The evaluation session, the road every caller takes. Start-up, `sieve eval`, `POST /api/evaluations` and
`POST /api/evaluations/runs` are adapters over `evaluate`: the golden set, the baseline, the run through the
chain, the threshold sweep, the golden-set audit, the report (built once, with its comparison, gate and
baseline update), the files, and the log lines (`render.lines`), in that order. `sieve tune` is an adapter
over `tune`: the real evaluation of the current configuration, recorded, then the grid replayed over it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from app.evaluation.compare.baselines import (
    Baseline,
    baseline_update,
    latest_report_path,
    record_passing,
    resolve_baseline,
)
from app.evaluation.compare.comparison import BaselineError, compare_reports
from app.evaluation.compare.gate import GateResult, check_gate
from app.evaluation.golden.audit.checks import AuditResult
from app.evaluation.golden.audit.source import AuditSource, audit_section
from app.evaluation.golden.cases import GoldenSet, GoldenSetError, load_golden_set
from app.evaluation.golden.principals import case_principals, eval_principals
from app.evaluation.render import lines
from app.evaluation.render.files import report_stamp, write_reports
from app.evaluation.render.lines import EvaluationGate, EvaluationRunResponse
from app.evaluation.render.markdown import k_label, render_markdown
from app.evaluation.report.model import BaselineUpdate, Comparison, Report, ServiceDescription, Sweep
from app.evaluation.run import runner
from app.evaluation.run.build import Verdict, build_report, invalid_report, measure_report
from app.evaluation.run.fingerprint import access_matters, access_settings, run_fingerprint
from app.evaluation.run.probe import leak_probe
from app.evaluation.run.runner import Evaluation, KnownIds, check_golden_against_index
from app.evaluation.tune.grid import Grid, threshold_sweep
from app.evaluation.tune.model import Split, TuneReport
from app.evaluation.tune.replay import record
from app.evaluation.tune.run import Recorded, TuneOptions
from app.evaluation.tune.run import tune as replay_grid
from app.files import utc_now
from app.retrieval.chain import RetrievalChain
from app.settings import AccessSettings, ChainSettings, EvaluateSettings

log = logging.getLogger("sieve.evaluation")

NEVER_PROMOTED = "an experiment's run never becomes a baseline"

__all__ = [
    "Baseline",
    "EvaluationGate",
    "EvaluationRunResponse",
    "latest_report_path",
    "resolve_baseline",
]


@dataclass
class Outcome:
    """One run's result: its report (an invalid one when the golden set could not be used: then
    `invalid_golden_set` says why), the run, the gate, the files written, and whether the run became the last
    passing baseline, as the log says it."""

    report: Report
    evaluation: Evaluation | None = None
    gate: GateResult = field(default_factory=GateResult)
    paths: list[Path] = field(default_factory=list)
    invalid_golden_set: str | None = None
    promotion: str | None = None

    @property
    def json(self) -> dict[str, Any]:
        """The report's JSON (what the report file holds)."""
        return self.report.to_json()

    @property
    def gate_failures(self) -> list[str]:
        return [f.message for f in self.gate.failures]

    def view(self) -> EvaluationRunResponse:
        """What the outcome tells a person: its lines, files and gate."""
        report = self.report
        gate = self.gate
        return EvaluationRunResponse(
            lines=lines.outcome_lines(report, k_label(report), self.promotion),
            reports=[str(path) for path in self.paths],
            gate=EvaluationGate(
                passed=gate.passed,
                failures=[f.message for f in gate.failures],
                warnings=[w.message for w in gate.warnings],
                notes=list(gate.notes),
            ),
            summary=report.summary.to_json() if report.summary is not None else {},
        )


@dataclass(frozen=True)
class EvaluationTarget:
    """What an evaluation needs of the service, and nothing more: the chain to run the cases through, the
    ids the store holds (for stale-expectation checks and the corpus fingerprint), the description of
    models, store and settings, and the chain settings the threshold sweep replays."""

    chain: RetrievalChain
    known: KnownIds
    described: ServiceDescription
    chain_settings: ChainSettings
    # what the golden-set audit reads (store, embedder, hard filter settings); None: the audit is not run
    audit: AuditSource | None = None
    # rag.access: the evaluation principals the cases run as (`golden.principals`) and the leak probe's
    access: AccessSettings = field(default_factory=AccessSettings)


def evaluate(
    target: EvaluationTarget,
    settings: EvaluateSettings,
    golden: GoldenSet | None = None,
    progress: Callable[[int, int], None] | None = None,
    baseline: Baseline | None = None,
    promote: bool = True,
) -> Outcome:
    """Evaluate `golden` (default: the file at settings.resource_location) on `target.chain` against
    `baseline` (default: the configured one). A broken golden set is logged and reported (the report says
    why nothing ran); it never raises. A configured baseline file that cannot be used is logged and the run
    goes on without a comparison. `promote=False` (an experiment's variant): the run never becomes the last
    passing baseline, whatever its gate says."""
    try:
        if golden is None:
            golden = load_golden_set(settings.resource_location)
        # a principal not configured, a case without one while access is enabled
        case_principals(golden, target.access)
        # a tag no chunk carries, a quote found nowhere
        check_golden_against_index(golden, target.known, settings.evidence_coverage)
    except GoldenSetError as exc:
        return _not_run(str(exc), target.described, settings)
    if baseline is None:
        baseline = _configured_baseline(settings)
    log.info("[RetrievalEval] %s", lines.start_line(len(golden.cases), golden.path, settings.top_k))
    evaluation = run_evaluation(target.chain, golden, target.known, settings, progress, target.access)
    sweep = run_sweep(evaluation, target.chain, target.chain_settings, settings)
    audit = audit_section(golden, target.audit, settings) if target.audit is not None else None
    run_info = run_description(target.described, evaluation, target.known, target.access)
    return finish_evaluation(
        evaluation, settings, run_info, baseline, sweep, audit, promote, access=target.access
    )


def tune(
    target: EvaluationTarget,
    golden: GoldenSet,
    grid: Grid,
    split: Split | None,
    settings: EvaluateSettings,
    options: TuneOptions,
) -> TuneReport:
    """Tune on `target`: run `golden` through its chain once for real, record the candidates, and replay
    `grid` (on the parts of `split` when given) against `target.chain_settings`, the current configuration."""
    started = utc_now().isoformat(timespec="seconds")
    evaluation = run_evaluation(
        target.chain, golden, target.known, settings, access=target.access, probe=False
    )
    recorded = Recorded(evaluation, record(evaluation, target.chain), started, target.described)
    return replay_grid(recorded, grid, split, target.chain_settings, settings, options)


def _not_run(error: str, described: ServiceDescription, settings: EvaluateSettings) -> Outcome:
    """The outcome of a golden set that cannot be used: an invalid report that says why, written."""
    log.error("[RetrievalEval] %s", lines.not_run_line(error))
    started = utc_now().isoformat(timespec="seconds")
    report = invalid_report(settings.resource_location, error, run_header(described), started)
    paths = write_reports(report, settings, render_markdown(report, settings.report.case_detail))
    _log_paths(paths)
    return Outcome(report, paths=paths, invalid_golden_set=error)


def _configured_baseline(settings: EvaluateSettings) -> Baseline:
    """The configured baseline; one that cannot be used is logged and stands as a baseline that cannot be
    used (`Baseline.error`): the run then fails as not checked."""
    try:
        return resolve_baseline(settings)
    except BaselineError as exc:
        log.error("[RetrievalEval] %s", lines.baseline_unusable_line(exc))
        return Baseline(None, None, f"the configured baseline is not usable: {exc}", error=str(exc))


def run_sweep(
    evaluation: Evaluation, chain: RetrievalChain, chain_settings: ChainSettings, settings: EvaluateSettings
) -> Sweep | None:
    """The report's `sweep` (None when `rag.evaluate.sweep.enabled` is false): the similarity threshold
    replayed over the candidates `evaluation` recorded. A sweep that fails is logged and left out; it never
    costs the report."""
    if not settings.sweep.enabled:
        return None
    try:
        recording = record(evaluation, chain)
        return threshold_sweep(recording, chain_settings, settings.thresholds, settings.sweep.tolerance)
    except Exception as exc:  # the sweep is an extra; the evaluation's report must still be written
        log.error("[RetrievalEval] %s", lines.sweep_failed_line(exc))
        return None


def run_evaluation(
    chain: RetrievalChain,
    golden: GoldenSet,
    known: KnownIds,
    settings: EvaluateSettings,
    progress: Callable[[int, int], None] | None = None,
    access: AccessSettings | None = None,
    probe: bool = True,
) -> Evaluation:
    """`runner.evaluate` with the settings' K, cut-offs, as-of date, latency sample and nDCG gain, each case
    as its principal under `access` (`golden.principals.case_principals`; None: every case unscoped), then,
    unless not `probe`, the leak probe over the evaluation principals (`probe.leak_probe`)."""
    access = access or AccessSettings()
    evaluation = runner.evaluate(
        chain,
        golden,
        settings.top_k,
        known,
        progress,
        today=settings.as_of,
        k_values=settings.k_values,
        latency_sample=settings.latency_sample,
        coverage=settings.evidence_coverage,
        gain=settings.gain,
        principals=case_principals(golden, access),
    )
    if probe and settings.leak_probe:
        evaluation.probe = leak_probe(chain, evaluation, eval_principals(access), known, settings.as_of)
    return evaluation


def finish_evaluation(
    evaluation: Evaluation,
    settings: EvaluateSettings,
    run_info: dict[str, object],
    baseline: Baseline | None = None,
    sweep: Sweep | None = None,
    audit: AuditResult | None = None,
    promote: bool = True,
    access: AccessSettings | None = None,
) -> Outcome:
    """Measure the run (segments, the sweep and the audit), judge
    it (comparison, gate, baseline update unless not `promote`), build the report once, write the files
    and log the lines."""
    baseline = baseline or Baseline(None, None, "rag.evaluate.baseline is none")
    stamp = report_stamp()
    if settings.write_json:
        run_info = {**run_info, "reportFile": f"{settings.report_prefix}-{stamp}.json"}
    measured = measure_report(evaluation, run_info, sweep, audit, access)
    comparison = _comparison(measured, baseline, settings)
    own = (
        Path(settings.output_dir) / f"{settings.report_prefix}-{stamp}.json" if settings.write_json else None
    )
    gate = check_gate(
        measured,
        settings.thresholds,
        baseline.note,
        comparison,
        not_checked=baseline.error,
        report_path=str(own) if own else None,
    )
    update = (
        baseline_update(measured, settings, gate.passed, baseline)
        if promote
        else BaselineUpdate(promoted=False, reason=NEVER_PROMOTED)
    )
    note = None if comparison is not None else baseline.note
    report = build_report(measured, Verdict(comparison, note, gate.record(), update))
    paths = write_reports(report, settings, render_markdown(report, settings.report.case_detail), stamp)
    passing = record_passing(report, settings, update)
    if passing is not None:
        paths.append(passing)
        promotion = lines.baseline_updated_line(passing, update)
    elif not promote:
        promotion = f"baseline untouched: {NEVER_PROMOTED}"
    else:
        promotion = lines.baseline_kept_line(update, settings, report)
    _log_run(report, gate, paths, promotion)
    return Outcome(report, evaluation, gate, paths, promotion=promotion)


def _comparison(measured: Report, baseline: Baseline, settings: EvaluateSettings) -> Comparison | None:
    """`measured` against the baseline's report (None without one), the baseline's kind and note kept."""
    if baseline.report is None:
        return None
    comparison = compare_reports(
        baseline.report, measured, baseline.path or "", seed=settings.seed, alpha=settings.alpha
    )
    comparison.baseline.kind, comparison.baseline.note = baseline.kind, baseline.note
    return comparison


def _log_run(report: Report, gate: GateResult, paths: list[Path], promotion: str) -> None:
    """The log of a finished run: the summary, the baseline, the sweep, each gate check (at its level),
    the gate's notes, the report files and whether the run became the baseline."""
    log.info("[RetrievalEval] %s", lines.summary_line(report))
    for line in lines.baseline_lines(report, k_label(report)):
        log.info("[RetrievalEval] %s", line)
    sweep = lines.sweep_line(report.sweep)
    if sweep:
        log.info("[RetrievalEval] %s", sweep)
    for check in gate.checks:
        level = logging.ERROR if check.failed else logging.WARNING if check.warned else logging.INFO
        log.log(level, "[RetrievalEval] %s", lines.gate_line(check))
    for note in gate.notes:
        log.info("[RetrievalEval] %s", lines.gate_note_line(note))
    _log_paths(paths)
    log.info("[RetrievalEval] %s", promotion)


def _log_paths(paths: list[Path]) -> None:
    for line in lines.path_lines(paths):
        log.info("[RetrievalEval] %s", line)


def run_header(described: ServiceDescription) -> dict[str, object]:
    """The human part of the run description: models, store, chain."""
    chain = described.chain
    enabled = [name for name, cfg in chain.items() if cfg.get("enabled")]
    return {
        "models": {"embedder": described.embedder, "reranker": described.reranker},
        "store": described.store,
        "collection": described.collection,
        "chunks": described.chunks,
        "retrieval": described.retrieval,
        "chain": chain,
        "chainSummary": " → ".join(enabled),
        "chainSettings": lines.settings_line(described.retrieval, chain),
    }


def run_description(
    described: ServiceDescription,
    evaluation: Evaluation,
    known: KnownIds,
    access: AccessSettings | None = None,
) -> dict[str, object]:
    """The report's `run`: the header plus the fingerprint (what exactly was run); with `access`, its
    evaluation principals are fingerprinted as `run.settings.access` (`fingerprint.access_settings`)."""
    evaluated_at = datetime.fromtimestamp(evaluation.started_at, UTC).isoformat(timespec="seconds")
    settings = dict(described.settings)
    if access is not None and access_matters(access):
        settings["access"] = access_settings(access)
    return {
        **run_header(described),
        **run_fingerprint(
            evaluation.golden,
            known.chunk,
            described.embedder,
            settings,
            evaluation.default_k,
            evaluation.as_of or date.today(),
            evaluated_at,
            evaluation.gain,
            known.scopes,
        ).to_json(),
    }
