"""One evaluation run as the service and the CLI do it: load the golden set, run it through the chain, check
the gate, write the reports, log the summary."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.evaluation.gate import GateCheck, check_gate
from app.evaluation.golden_set import GoldenSet, GoldenSetError, load_golden_set
from app.evaluation.report import build_report, invalid_report, render_markdown, write_reports
from app.evaluation.runner import Evaluation, KnownIds, evaluate
from app.settings import EvaluateSettings

if TYPE_CHECKING:
    from app.service import Sieve

log = logging.getLogger("sieve.evaluation")


@dataclass
class EvaluationOutcome:
    report: dict[str, Any] | None
    evaluation: Evaluation | None = None
    gate: list[GateCheck] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    invalid_golden_set: str | None = None

    @property
    def gate_failures(self) -> list[str]:
        return [c.describe() for c in self.gate if not c.passed]


def latest_report_path(settings: EvaluateSettings) -> Path:
    return Path(settings.output_dir) / f"{settings.report_prefix}-latest.json"


def run_startup_evaluation(
    sieve: Sieve,
    settings: EvaluateSettings,
    progress: Callable[[int, int], None] | None = None,
    golden: GoldenSet | None = None,
) -> EvaluationOutcome:
    """Evaluate `golden` (default: the file at settings.resource_location). A broken golden set is logged
    and reported (the report says why nothing ran); it never raises."""
    run_info = run_description(sieve)
    if golden is None:
        try:
            golden = load_golden_set(settings.resource_location)
        except GoldenSetError as exc:
            log.error("[RetrievalEval] not run: %s", exc)
            report = invalid_report(settings.resource_location, str(exc), run_info)
            paths = write_reports(report, settings, render_markdown(report))
            _log_paths(paths)
            return EvaluationOutcome(report, paths=paths, invalid_golden_set=str(exc))

    log.info(
        "[RetrievalEval] start cases=%d goldenSet=%s k=%d", len(golden.cases), golden.path, settings.top_k
    )
    known = KnownIds.from_store(sieve.store)
    evaluation = evaluate(sieve.chain, golden, settings.top_k, known, progress)
    return finish_evaluation(evaluation, settings, run_info)


def finish_evaluation(
    evaluation: Evaluation, settings: EvaluateSettings, run_info: dict[str, Any]
) -> EvaluationOutcome:
    from app.evaluation.report import summarize

    gate = check_gate(summarize(evaluation), settings.thresholds)
    report = build_report(evaluation, run_info, gate)
    paths = write_reports(report, settings, render_markdown(report))
    log.info("[RetrievalEval] %s", summary_line(report))
    for check in gate:
        (log.info if check.passed else log.error)(
            "[RetrievalEval] gate %s %s", "ok" if check.passed else "FAILED", check.describe()
        )
    _log_paths(paths)
    return EvaluationOutcome(report, evaluation, gate, paths)


def summary_line(report: dict[str, Any]) -> str:
    s = report["summary"]
    lat = s["latencyMs"] or {}

    def f(v: Any) -> str:
        return "n/a" if v is None else f"{v:.2f}"

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


def run_description(sieve: Sieve) -> dict[str, Any]:
    described = sieve.describe()
    chain = described["chain"]
    enabled = [name for name, cfg in chain.items() if cfg.get("enabled")]  # type: ignore[union-attr]
    return {
        "models": {"embedder": described["embedder"], "reranker": described["reranker"]},
        "store": described["store"],
        "collection": described["collection"],
        "chunks": described["chunks"],
        "retrieval": described["retrieval"],
        "chain": chain,
        "chainSummary": " → ".join(enabled),
        "chainSettings": _settings_line(described["retrieval"], chain),
        "codeVersion": code_version(),
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


def code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("sieve")
    except PackageNotFoundError:
        pkg = "unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    return f"{pkg}+{sha}{'-dirty' if dirty else ''}" if sha else pkg


def _log_paths(paths: list[Path]) -> None:
    for path in paths:
        if "-latest." in path.name:
            log.info("[RetrievalEval] report %s", path)
