"""`POST /api/evaluations/runs`: the request that may adjust one run's settings, and the outcome it answers
with (what `sieve eval` prints), built by `evaluation_run_view` for the route and for the CLI alike."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.settings import EvaluateSettings

# the request's threshold fields and the rag.evaluate.thresholds keys they set
THRESHOLD_FIELDS = {
    "minRecall": "min_recall",
    "minHitRate": "min_hit_rate",
    "minMrr": "min_mrr",
    "minNdcg": "min_ndcg",
    "maxDuplicateRate": "max_duplicate_rate",
    "maxP95Ms": "max_p95_ms",
}


class EvaluationRunRequest(BaseModel):
    """One run's changes to the server's `rag.evaluate`; a field left out keeps the server's setting."""

    model_config = ConfigDict(extra="forbid", strict=True)

    topK: int | None = Field(None, ge=1, le=100, description="K for the metrics; default rag.evaluate.top_k")
    baseline: Literal["previous-passing", "previous", "none"] | None = Field(
        None, description="the baseline to compare with; default rag.evaluate.baseline"
    )
    minRecall: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_recall")
    minHitRate: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_hit_rate")
    minMrr: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_mrr")
    minNdcg: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_ndcg")
    maxDuplicateRate: float | None = Field(
        None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.max_duplicate_rate"
    )
    maxP95Ms: float | None = Field(None, gt=0.0, description="rag.evaluate.thresholds.max_p95_ms")

    def apply(self, settings: EvaluateSettings) -> EvaluateSettings:
        """`settings` with this request's fields set (validated as the YAML would be)."""
        data = settings.model_dump()
        if self.topK is not None:
            data["top_k"] = self.topK
        if self.baseline is not None:
            data["baseline"] = self.baseline
        for name, key in THRESHOLD_FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                data["thresholds"][key] = value
        return EvaluateSettings.model_validate(data)


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


def evaluation_run_view(outcome: Any) -> EvaluationRunResponse:
    """What an `EvaluationOutcome` (app.evaluation.startup) tells a person: its lines, files and gate."""
    from app.evaluation.compare.comparison import baseline_line
    from app.evaluation.golden.audit.checks import summary_line as audit_summary
    from app.evaluation.render.markdown import k_label
    from app.evaluation.startup import summary_line
    from app.evaluation.tune.grid import sweep_line

    report = outcome.json
    lines = [summary_line(report)]
    comparison = report.get("comparison")
    if comparison is not None:
        lines.append(f"baseline: {comparison['baseline']['note']}")
        lines.append(baseline_line(comparison, k_label(outcome.report)))
        lines += [f"  changed: {difference}" for difference in comparison["differences"]]
    else:
        lines.append(f"no baseline: {report.get('baselineNote')}")
    sweep = sweep_line(outcome.report.sweep)
    if sweep:
        lines.append(sweep)
    if outcome.report.audit is not None:
        lines.append(f"golden-set audit: {audit_summary(outcome.report.audit)}")
    if outcome.promotion:
        lines.append(outcome.promotion)
    gate = outcome.gate
    return EvaluationRunResponse(
        lines=lines,
        reports=[str(path) for path in outcome.paths],
        gate=EvaluationGate(
            passed=gate.passed,
            failures=[f.message for f in gate.failures],
            warnings=[w.message for w in gate.warnings],
            notes=list(gate.notes),
        ),
        summary=report["summary"],
    )
