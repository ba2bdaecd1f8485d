"""One evaluation run as the service and the CLI do it: resolve the baseline, run the golden set through
the chain, compare, check the gate, write the reports, log the summary and the vs-baseline line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.evaluation.compare.baselines import (
    Baseline,
    baseline_update,
    latest_report_path,
    passing_report_path,
    record_passing,
    resolve_baseline,
)
from app.evaluation.compare.comparison import BaselineError, baseline_line, compare_reports
from app.evaluation.compare.gate import GateResult, check_gate
from app.evaluation.golden.audit.checks import AuditResult
from app.evaluation.golden.audit.source import AuditSource, attach_audit, audit_section
from app.evaluation.golden.cases import GoldenSet, GoldenSetError, load_golden_set
from app.evaluation.render.files import report_stamp, write_reports
from app.evaluation.render.markdown import k_label, render_markdown
from app.evaluation.report.model import BaselineUpdate, Report, Sweep
from app.evaluation.run.build import build_report, invalid_report
from app.evaluation.run.fingerprint import run_fingerprint
from app.evaluation.run.runner import Evaluation, KnownIds, check_knowledge_tags, evaluate
from app.evaluation.scoring.measures import fmt
from app.evaluation.tune.grid import sweep_line, threshold_sweep
from app.evaluation.tune.replay import record
from app.files import utc_now
from app.settings import ChainSettings, EvaluateSettings

log = logging.getLogger("sieve.evaluation")

__all__ = ["Baseline", "latest_report_path", "resolve_baseline"]


@dataclass
class EvaluationOutcome:
    report: Report | None
    evaluation: Evaluation | None = None
    gate: GateResult = field(default_factory=GateResult)
    paths: list[Path] = field(default_factory=list)
    invalid_golden_set: str | None = None
    # whether the run became the last passing baseline, as the log says it ("baseline updated: ..." or
    # "baseline kept: ..., to accept this level on purpose: sieve baseline accept ...")
    promotion: str | None = None

    @property
    def json(self) -> dict[str, Any] | None:
        """The report's JSON (what the report file holds), None without a report."""
        return self.report.to_json() if self.report is not None else None

    @property
    def gate_failures(self) -> list[str]:
        return [f.message for f in self.gate.failures]


@dataclass(frozen=True)
class EvaluationTarget:
    """What an evaluation needs of the service, and nothing more: the chain to run the cases through, the
    ids the store holds (for stale-expectation checks and the corpus fingerprint), the header describing
    models, store and settings, and the chain settings the threshold sweep replays."""

    chain: Any
    known: KnownIds
    described: dict[str, Any]
    chain_settings: ChainSettings
    # what the golden-set audit reads (store, embedder, hard filter settings); None: the audit is not run
    audit: AuditSource | None = None


def run_startup_evaluation(
    target: EvaluationTarget,
    settings: EvaluateSettings,
    progress: Callable[[int, int], None] | None = None,
    golden: GoldenSet | None = None,
) -> EvaluationOutcome:
    """Evaluate `golden` (default: the file at settings.resource_location) on `target.chain`. A broken
    golden set is logged and reported (the report says why nothing ran); it never raises. A configured
    baseline file that cannot be used is logged and the run goes on without a comparison."""
    described = target.described
    try:
        if golden is None:
            golden = load_golden_set(settings.resource_location)
        check_knowledge_tags(golden, target.known)  # a case no chunk can match is a golden-set error
    except GoldenSetError as exc:
        log.error("[RetrievalEval] not run: %s", exc)
        report = invalid_report(
            settings.resource_location,
            str(exc),
            run_header(described),
            utc_now().isoformat(timespec="seconds"),
        )
        paths = write_reports(report, settings, render_markdown(report, settings.report.case_detail))
        _log_paths(paths)
        return EvaluationOutcome(report, paths=paths, invalid_golden_set=str(exc))
    try:
        baseline = resolve_baseline(settings)
    except BaselineError as exc:
        log.error("[RetrievalEval] baseline not used: %s", exc)
        baseline = Baseline(None, None, f"the configured baseline is not usable: {exc}")
    log.info(
        "[RetrievalEval] start cases=%d goldenSet=%s k=%d", len(golden.cases), golden.path, settings.top_k
    )
    evaluation = run_evaluation(target.chain, golden, target.known, settings, progress)
    sweep = run_sweep(evaluation, target.chain, target.chain_settings, settings)
    audit = audit_section(golden, target.audit, settings) if target.audit is not None else None
    return finish_evaluation(
        evaluation, settings, run_description(described, evaluation, target.known), baseline, sweep, audit
    )


def run_sweep(
    evaluation: Evaluation, chain: Any, chain_settings: ChainSettings, settings: EvaluateSettings
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
        log.error("[RetrievalEval] threshold sweep not run: %s: %s", type(exc).__name__, exc)
        return None


def run_evaluation(
    chain: Any,
    golden: GoldenSet,
    known: KnownIds,
    settings: EvaluateSettings,
    progress: Callable[[int, int], None] | None = None,
) -> Evaluation:
    """`evaluate` with the settings' K, cut-offs, as-of date, latency sample and nDCG gain."""
    return evaluate(
        chain,
        golden,
        settings.top_k,
        known,
        progress,
        today=settings.as_of,
        k_values=settings.k_values,
        latency_sample=settings.latency_sample,
        gain=settings.gain,
    )


def finish_evaluation(
    evaluation: Evaluation,
    settings: EvaluateSettings,
    run_info: dict[str, Any],
    baseline: Baseline | None = None,
    sweep: Sweep | None = None,
    audit: AuditResult | None = None,
) -> EvaluationOutcome:
    """Build the report once (segments with their deltas against the baseline), attach the sweep, the
    audit, the comparison and the gate, write the files and log the summary."""
    baseline = baseline or Baseline(None, None, "rag.evaluate.baseline is none")
    stamp = report_stamp()
    if settings.write_json:
        run_info = {**run_info, "reportFile": f"{settings.report_prefix}-{stamp}.json"}
    report = build_report(evaluation, run_info, baseline.report, settings.seed)
    report.sweep = sweep
    attach_audit(report, audit)  # `audit`: `audit_section`'s, made before the previous report is replaced
    if baseline.report is not None:
        comparison = compare_reports(
            baseline.report, report, baseline.path or "", seed=settings.seed, alpha=settings.alpha
        )
        comparison.baseline.kind, comparison.baseline.note = baseline.kind, baseline.note
        report.comparison = comparison
    else:
        report.baseline_note = baseline.note
    gate = check_gate(report, settings.thresholds, baseline.note)
    report.gate = gate.record()
    update = baseline_update(report, settings, gate.passed)
    report.baseline_update = update
    paths = write_reports(report, settings, render_markdown(report, settings.report.case_detail), stamp)
    passing = record_passing(report, settings, update)
    if passing is not None:
        paths.append(passing)
    log.info("[RetrievalEval] %s", summary_line(report))
    if report.comparison is not None:
        log.info("[RetrievalEval] baseline: %s", baseline.note)
        log.info("[RetrievalEval] %s", baseline_line(report.comparison.to_json(), k_label(report)))
    else:
        log.info("[RetrievalEval] no baseline: %s", baseline.note)
    line = sweep_line(sweep)
    if line:
        log.info("[RetrievalEval] %s", line)
    for check in gate.checks:
        level = logging.ERROR if check.failed else logging.WARNING if check.warned else logging.INFO
        log.log(level, "[RetrievalEval] gate %s %s", check.status, check.describe())
    for note in gate.notes:
        log.info("[RetrievalEval] gate note: %s", note)
    _log_paths(paths)
    if passing is not None:
        promotion = f"baseline updated: {passing} is this run's report ({update.reason})"
    else:
        promotion = baseline_kept_line(update, settings, report)
    log.info("[RetrievalEval] %s", promotion)
    return EvaluationOutcome(report, evaluation, gate, paths, promotion=promotion)


def baseline_kept_line(update: BaselineUpdate, settings: EvaluateSettings, report: Report) -> str:
    """The log line of a run that did not become the baseline: why, and how to make it one on purpose."""
    own = report.run.report_file
    target = str(Path(settings.output_dir) / own) if own else "FILE"
    return (
        f"baseline kept: this run did not replace {passing_report_path(settings)} ({update.reason}); "
        f"to accept this level on purpose: sieve baseline accept {target} (or sieve baseline pin {target})"
    )


def summary_line(report: Report | dict[str, Any]) -> str:
    """The log's summary line: `done cases=67 succeeded=67 failed=0 avgRecall=0.99 ...`."""
    s: dict[str, Any]
    if isinstance(report, Report):
        s = report.summary.to_json() if report.summary is not None else {}
    else:
        s = report["summary"]
    lat = s["latencyMs"] or s.get("batchLatencyMs") or {}

    def f(v: Any) -> str:
        return fmt(v, 2)

    na = s["noAnswer"]
    line = (
        f"done cases={s['cases']} succeeded={s['succeeded']} failed={s['failed']} "
        f"avgRecall={f(s['recall'])} avgMRR={f(s['mrr'])} avgNDCG={f(s['ndcg'])} hitRate={f(s['hitRate'])} "
        f"p50={lat.get('p50', 0):.0f}ms p95={lat.get('p95', 0):.0f}ms"
    )
    if na["cases"]:
        line += f" noAnswer={na['cases']} correctAbstention={f(na['correctAbstentionRate'])}"
    if s["forbidden"]["hits"]:
        line += f" forbiddenHits={s['forbidden']['hits']}"
    return line


def run_header(described: dict[str, Any]) -> dict[str, Any]:
    """The human part of the run description: models, store, chain (from `Sieve.describe()`)."""
    chain = described["chain"]
    enabled = [name for name, cfg in chain.items() if cfg.get("enabled")]
    return {
        "models": {"embedder": described["embedder"], "reranker": described["reranker"]},
        "store": described["store"],
        "collection": described["collection"],
        "chunks": described["chunks"],
        "retrieval": described["retrieval"],
        "chain": chain,
        "chainSummary": " → ".join(enabled),
        "chainSettings": _settings_line(described["retrieval"], chain),
    }


def run_description(described: dict[str, Any], evaluation: Evaluation, known: KnownIds) -> dict[str, Any]:
    """The report's `run`: the header plus the fingerprint (what exactly was run)."""
    from datetime import UTC, date, datetime

    evaluated_at = datetime.fromtimestamp(evaluation.started_at, UTC).isoformat(timespec="seconds")
    return {
        **run_header(described),
        **run_fingerprint(
            evaluation.golden,
            known.chunk,
            described["embedder"],
            described["settings"],
            evaluation.default_k,
            evaluation.as_of or date.today(),
            evaluated_at,
            evaluation.gain,
        ).to_json(),
    }


def _settings_line(retrieval: Any, chain: Any) -> str:
    """The chain's settings in one line for the report header (the JSON keeps them all)."""
    parts = [f"candidate_k={retrieval['candidate_k']}"]
    parts.append(
        f"hybrid bm25_candidate_k={retrieval['bm25_candidate_k']}" if retrieval["hybrid"] else "dense only"
    )
    for name, cfg in chain.items():
        if not cfg.get("enabled"):
            parts.append(f"{name}=off")
            continue
        shown = {k: v for k, v in cfg.items() if k != "enabled" and v not in (None, [], {})}
        parts.append(f"{name}(" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")")
    return "; ".join(parts)


def _log_paths(paths: list[Path]) -> None:
    for path in paths:
        if "-latest." in path.name:
            log.info("[RetrievalEval] report %s", path)
