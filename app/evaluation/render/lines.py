"""Every text line an evaluation run says: the log's `[RetrievalEval]` lines, what `POST
/api/evaluations/runs` answers (`EvaluationRunResponse`, its lines from `outcome_lines`) and what `sieve eval`
prints of that answer (`printed_lines`). Each line is read from the typed report and
its parts (Report, Comparison, Sweep, GateCheck), never from their JSON."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from app.evaluation.compare.baselines import passing_report_path
from app.evaluation.compare.comparison import BaselineError
from app.evaluation.compare.gate import GateCheck
from app.evaluation.golden.audit.checks import summary_line as audit_summary
from app.evaluation.report.model import BaselineUpdate, Comparison, Origins, Report, Summary, Sweep
from app.evaluation.scoring.measures import fmt, fmt_p
from app.evaluation.scoring.measures import label as measure_label
from app.evaluation.tune.grid import MIN_DENSE, fmt_value
from app.settings import EvaluateSettings


class EvaluationGate(BaseModel):
    passed: bool = Field(description="no check of severity fail failed")
    failures: list[str] = Field(description="the failed checks, each named with its figure and limit")
    warnings: list[str] = Field(description="the checks that warned (the gate still passes)")
    notes: list[str] = Field(description="what the gate could not check, and why")


class EvaluationRunResponse(BaseModel):
    lines: list[str] = Field(
        description="the run in a few lines, as `sieve eval` prints them: the summary, the baseline and the "
        "comparison with it, the threshold sweep, the golden-set audit"
    )
    reports: list[str] = Field(description="the report files this run wrote (on the server)")
    gate: EvaluationGate
    summary: dict[str, Any] = Field(description="the report's summary (its `summary` object)")


def start_line(cases: int, golden_path: str, k: int) -> str:
    """The first line of a run: `start cases=67 goldenSet=golden_set/golden.jsonl k=5`."""
    return f"start cases={cases} goldenSet={golden_path} k={k}"


def not_run_line(error: str) -> str:
    """The log line of a run whose golden set cannot be used."""
    return f"not run: {error}"


def baseline_unusable_line(error: BaselineError) -> str:
    """The log line of a configured baseline that cannot be used (the run goes on without one)."""
    return f"baseline not used: {error}"


def sweep_failed_line(error: Exception) -> str:
    """The log line of a threshold sweep that failed (the report is written without it)."""
    return f"threshold sweep not run: {type(error).__name__}: {error}"


def summary_line(report: Report) -> str:
    """The log's summary line: `done cases=67 succeeded=67 failed=0 avgRecall=0.99 ...`."""
    s = report.summary if report.summary is not None else Summary()
    lat = s.latency_ms or s.batch_latency_ms or {}

    def f(v: float | None) -> str:
        return fmt(v, 2)

    na = s.no_answer
    line = (
        f"done cases={s.cases} succeeded={s.succeeded} failed={s.failed} "
        f"avgRecall={f(s.recall)} avgMRR={f(s.mrr)} avgNDCG={f(s.ndcg)} hitRate={f(s.hit_rate)} "
        f"p50={lat.get('p50', 0):.0f}ms p95={lat.get('p95', 0):.0f}ms"
    )
    if na.cases:
        line += f" noAnswer={na.cases} correctAbstention={f(na.correct_abstention_rate)}"
    if s.forbidden["hits"]:
        line += f" forbiddenHits={s.forbidden['hits']}"
    return line


def baseline_line(comparison: Comparison, k_label: str) -> str:
    """The log line after the summary:
    `vs baseline <evaluatedAt> (45 paired): nDCG@5 0.958 -> 0.967 (+0.009, 95% CI [-0.004, 0.022], p=0.19,
    adjusted 0.19) fixed=1 broken=0`. p is the sign-flip p-value, adjusted the Westfall-Young max-T one over
    the gated measures (what the gate decides by); a cut to the common K, renamed and changed cases and
    no-answer cases that stopped abstaining are named."""
    when = comparison.baseline.evaluated_at or "?"
    if not comparison.comparable:
        return f"vs baseline {when}: not checked, no case could be paired with the baseline"
    row = comparison.metrics.get("ndcg")
    cases = comparison.cases
    paired = f"{comparison.paired_cases} paired"
    if comparison.paired_no_answer:
        paired += f", {comparison.paired_no_answer} no-answer"
    extras = [*comparison.notes]
    if cases.renamed:
        extras.append(f"{len(cases.renamed)} renamed case(s) paired by content")
    if cases.changed:
        extras.append(
            f"{len(cases.changed)} changed case(s) left out ({_shown([c.id for c in cases.changed])})"
        )
    if cases.abstention_broken:
        extras.append(
            f"{len(cases.abstention_broken)} no-answer case(s) abstained before and answer now "
            f"({_shown(cases.abstention_broken)})"
        )
    head = f"vs baseline {when} ({paired}{'; ' + '; '.join(extras) if extras else ''}): "
    if row is None:
        return head + "no paired scored cases"
    low, high = row.ci95 or (None, None)
    line = (
        head + f"nDCG{k_label} {row.baseline:.3f} -> {row.current:.3f} ({row.delta:+.3f}, "
        f"95% CI [{fmt(low)}, {fmt(high)}], p={fmt_p(row.p_value)}, adjusted {fmt_p(row.p_adjusted)}) "
        f"fixed={len(cases.fixed)} broken={len(cases.broken)}"
    )
    account = comparison.unjudged
    if account and account.new_in_top_k:
        line += f"; {account.headline}"
        named = ((cases.unverified, "unverified"), (cases.thinly_judged, "too thinly judged to tell"))
        for ids, label in named:
            if ids:
                line += f" ({len(ids)} {label}: {_shown(ids)})"
    return line


def _shown(ids: list[str]) -> str:
    """The first five ids, and how many more."""
    return ", ".join(ids[:5]) + (f", … {len(ids) - 5} more" if len(ids) > 5 else "")


def sweep_line(sweep: Sweep | None) -> str | None:
    """The log line: `sweep min_dense: 0.84 abstains on 2/4 no-answer cases, recall 1.000 -> 1.000
    (fallback off)`."""
    if not sweep:
        return None
    current = sweep.current.metrics
    rec = sweep.recommendation.abstention
    if current.no_answer_cases == 0:
        return "sweep min_dense: no no-answer cases in the golden set, no abstention threshold to recommend"
    if rec is None:
        return (
            "sweep min_dense: no threshold abstains without losing more than the tolerance of recall or "
            "nDCG (fallback off)"
        )
    m = rec.metrics
    return (
        f"sweep min_dense: {fmt_value(rec.point[MIN_DENSE])} abstains on "
        f"{m.correct_abstentions}/{m.no_answer_cases} no-answer cases, "
        f"recall {fmt(current.recall)} -> {fmt(m.recall)} (fallback off)"
    )


def origin_line(origins: Origins | None) -> str | None:
    """ "generated vs manual: nDCG +0.070 (0.980 vs 0.910, n=30 vs 62 scored cases)", or None when the
    comparison is not there."""
    versus = origins.generated_vs_manual if origins is not None else None
    if versus is None:
        return None
    label = measure_label(versus.metric)
    return (
        f"generated vs manual: {label} {versus.delta:+.3f} ({versus.generated:.3f} vs "
        f"{versus.manual:.3f}, n={versus.generated_cases} vs {versus.manual_cases} scored cases)"
    )


def settings_line(retrieval: Mapping[str, object], chain: Mapping[str, Mapping[str, object]]) -> str:
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


def gate_line(check: GateCheck) -> str:
    """One gate check as the log says it: `gate ok recall@5 >= 0.9 (0.95)`."""
    return f"gate {check.status} {check.describe()}"


def gate_note_line(note: str) -> str:
    """What the gate could not check, as the log says it."""
    return f"gate note: {note}"


def path_lines(paths: list[Path]) -> list[str]:
    """The log's lines of the -latest report files: `report target/eval/retrieval-eval-latest.json`."""
    return [f"report {path}" for path in paths if "-latest." in path.name]


def baseline_updated_line(passing: Path, update: BaselineUpdate) -> str:
    """The log line of a run that became the last passing baseline."""
    return f"baseline updated: {passing} is this run's report ({update.reason})"


def baseline_kept_line(update: BaselineUpdate, settings: EvaluateSettings, report: Report) -> str:
    """The log line of a run that did not become the baseline: why, and how to make it one on purpose."""
    own = report.run.report_file
    target = str(Path(settings.output_dir) / own) if own else "FILE"
    return (
        f"baseline kept: this run did not replace {passing_report_path(settings)} ({update.reason}); "
        f"to accept this level on purpose: sieve baseline accept {target} (or sieve baseline pin {target})"
    )


def baseline_lines(report: Report, k_label: str) -> list[str]:
    """The baseline a run was compared with and the comparison's line, or why there was none."""
    if report.comparison is None:
        return [f"no baseline: {report.baseline_note}"]
    return [f"baseline: {report.comparison.baseline.note}", baseline_line(report.comparison, k_label)]


def outcome_lines(report: Report, k_label: str, promotion: str | None) -> list[str]:
    """The run in a few lines, as `sieve eval` prints them: the summary, the baseline and the comparison
    with it (each difference of the run description named), the threshold sweep, the golden-set audit and
    whether the run became the baseline."""
    lines = [summary_line(report), *baseline_lines(report, k_label)]
    if report.comparison is not None:
        lines += [f"  changed: {difference}" for difference in report.comparison.differences]
    sweep = sweep_line(report.sweep)
    if sweep:
        lines.append(sweep)
    if report.audit is not None:
        lines.append(f"golden-set audit: {audit_summary(report.audit)}")
    if promotion:
        lines.append(promotion)
    return lines


def printed_lines(view: EvaluationRunResponse, extra: list[str]) -> tuple[list[str], list[str]]:
    """What `sieve eval` prints of a run's answer: on stdout its lines, its report files, `extra` and the
    gate's notes; on stderr the gate's warnings and failures."""
    out = [*view.lines, *(f"report: {path}" for path in view.reports), *extra]
    out += [gate_note_line(note) for note in view.gate.notes]
    err = [f"gate WARN: {warning}" for warning in view.gate.warnings]
    err += [f"gate failed: {failure}" for failure in view.gate.failures]
    return out, err
