"""The quality gate: thresholds on the summary, regressions against the baseline, and safety.

* Levels (`min_recall`, ..., `max_p95_ms`): a threshold left unset is not checked. A figure that could not
  be computed (no case had relevant documents, so there is no recall) fails its check: a gate never passes
  on missing evidence.
* Regressions (`max_drop.{recall,hit_rate,mrr,ndcg}`, `max_broken_cases`): need a comparable baseline.
  A drop (baseline - current, over the paired cases) beyond `max_drop` fails when the difference is
  significant (pHolm < alpha), or always with `regression_requires_significance: false`. Without a
  baseline (or with one that is not comparable) these checks pass and `notes` says why.
* Safety: `max_forbidden_hits` (default 0: one forbidden document in any top K fails), and for the
  no-answer cases `min_correct_abstention` and `max_false_answer_rate`.
* Policies (`no_answer_policy`: warn | fail | off): a check whose severity the setting chooses. With
  "warn" a check that does not hold is a warning (`GateResult.warnings`, "gate WARN" in the log): the
  gate still passes. `no_answer_policy` holds when the golden set has no no-answer cases, or when at
  least one of them abstained (returned nothing): 0 of n is what it catches.

* `unjudged_policy` (warn | fail): a regression the comparison cannot verify because unjudged documents
  entered the top K. A `max_drop` beyond its limit whose condensed-list drop (unjudged documents removed) is
  within it, and a broken case the comparison marks unverified (`compare.unverified_reason`), warn with
  "warn" (the broken case is left out of `max_broken_cases` and named in `unverified_broken_cases`) and fail
  as ordinary regressions with "fail".

A check's `passed` says whether it held; its `severity` ("fail" or "warn") whether not holding fails the
gate or warns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from app.evaluation.report.model import Comparison, Gate, GateCheckRecord, GateFailure, Report, Summary
from app.evaluation.scoring.measures import fmt
from app.settings import EvaluateThresholds

# threshold field -> (the figure's name in the report JSON's summary, comparison, the figure)
_LEVELS: dict[str, tuple[str, str, Callable[[Summary], Any]]] = {
    "min_recall": ("recall", ">=", lambda s: s.recall),
    "min_hit_rate": ("hitRate", ">=", lambda s: s.hit_rate),
    "min_mrr": ("mrr", ">=", lambda s: s.mrr),
    "min_ndcg": ("ndcg", ">=", lambda s: s.ndcg),
    "max_duplicate_rate": ("duplicateRate", "<=", lambda s: s.duplicate_rate),
    "max_p95_ms": ("latencyMs.p95", "<=", lambda s: (s.latency_ms or {}).get("p95")),
    "min_correct_abstention": (
        "noAnswer.correctAbstentionRate",
        ">=",
        lambda s: s.no_answer.get("correctAbstentionRate"),
    ),
    "max_false_answer_rate": ("noAnswer.falseAnswerRate", "<=", lambda s: s.no_answer.get("falseAnswerRate")),
}
# max_drop field -> comparison metric
_DROPS = {"recall": "recall", "hit_rate": "hitRate", "mrr": "mrr", "ndcg": "ndcg"}

Severity = Literal["fail", "warn"]


def policy_severity(policy: str) -> Severity | None:
    """A warn | fail | off setting as a check's severity (None: not checked)."""
    if policy == "off":
        return None
    return "fail" if policy == "fail" else "warn"


@dataclass(frozen=True)
class GateCheck:
    name: str
    metric: str
    op: str
    threshold: float
    value: float | None
    passed: bool
    message: str = ""
    severity: Severity = "fail"

    @property
    def failed(self) -> bool:
        """Did not hold, and fails the gate."""
        return not self.passed and self.severity == "fail"

    @property
    def warned(self) -> bool:
        """Did not hold, and only warns."""
        return not self.passed and self.severity == "warn"

    @property
    def status(self) -> str:
        """The log's word for it: ok, WARN or FAILED."""
        return "FAILED" if self.failed else "WARN" if self.warned else "ok"

    def describe(self) -> str:
        if self.message:
            return f"{self.name}: {self.message}"
        shown = fmt(self.value, 4)
        return f"{self.name}: {self.metric}={shown}, needs {self.op} {self.threshold}"

    def failure(self) -> GateFailure:
        return GateFailure(check=self.name, actual=self.value, limit=self.threshold, message=self.describe())


@dataclass
class GateResult:
    checks: list[GateCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No check of severity "fail" failed (warnings do not count)."""
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> list[GateFailure]:
        return [c.failure() for c in self.checks if c.failed]

    @property
    def warnings(self) -> list[GateFailure]:
        """The checks that did not hold but only warn, in the shape of a failure."""
        return [c.failure() for c in self.checks if c.warned]

    def record(self) -> Gate:
        """The gate as the report keeps it (`Report.gate`)."""
        return Gate(
            passed=self.passed,
            checks=[
                GateCheckRecord(
                    name=c.name,
                    metric=c.metric,
                    op=c.op,
                    threshold=c.threshold,
                    value=c.value,
                    passed=c.passed,
                    severity=c.severity,
                    message=c.describe(),
                )
                for c in self.checks
            ],
            failures=self.failures,
            warnings=self.warnings,
            notes=list(self.notes),
        )

    def to_json(self) -> dict[str, Any]:
        """The report JSON's `gate`."""
        return self.record().to_json()


def check_gate(
    report: Report, thresholds: EvaluateThresholds, no_baseline_reason: str | None = None
) -> GateResult:
    """All configured checks on `report`: its summary's figures (a report without a summary has none,
    so every level fails), its comparison (None: no baseline, for the reason given) and its case records
    (to name the cases with forbidden documents)."""
    summary = report.summary if report.summary is not None else Summary()
    result = GateResult()
    for name, (metric, op, figure) in _LEVELS.items():
        threshold = getattr(thresholds, name)
        if threshold is None:
            continue
        raw = figure(summary)
        value = float(raw) if raw is not None else None
        passed = value is not None and (value >= threshold if op == ">=" else value <= threshold)
        result.checks.append(GateCheck(name, metric, op, float(threshold), value, passed))
    _forbidden(result, summary, report, thresholds)
    _no_answer_policy(result, summary, thresholds)
    _regressions(result, thresholds, report.comparison, no_baseline_reason)
    return result


def _no_answer_policy(result: GateResult, summary: Summary, thresholds: EvaluateThresholds) -> None:
    """`no_answer_policy`: abstained = round(correctAbstentionRate x n) of the n no-answer cases; the
    check holds when abstained >= 1. Not checked without no-answer cases."""
    severity = policy_severity(thresholds.no_answer_policy)
    no_answer = summary.no_answer
    n = int(no_answer.get("cases") or 0)
    if severity is None or n == 0:
        return
    rate = no_answer.get("correctAbstentionRate")
    abstained = round(float(rate) * n) if rate is not None else 0
    message = f"{abstained} of {n} no-answer cases abstained"
    if abstained == 0:
        message += (
            " (every one returned documents: the chain never says 'no answer'; a level is "
            "rag.evaluate.thresholds.min_correct_abstention)"
        )
    result.checks.append(
        GateCheck(
            "no_answer_policy",
            "noAnswer.correctAbstentions",
            ">=",
            1.0,
            float(abstained),
            abstained >= 1,
            message,
            severity,
        )
    )


def _forbidden(result: GateResult, summary: Summary, report: Report, thresholds: EvaluateThresholds) -> None:
    limit = thresholds.max_forbidden_hits
    if limit is None:
        return
    hits = int(summary.forbidden.get("hits", 0))
    passed = hits <= limit
    message = f"forbidden documents in top K: {hits}, allowed {limit}"
    if hits:
        where = [f"{', '.join(c.forbidden_found)} in case {c.id}" for c in report.cases if c.forbidden_found]
        message += " (" + "; ".join(where) + ")"
    result.checks.append(
        GateCheck("max_forbidden_hits", "forbidden.hits", "<=", float(limit), float(hits), passed, message)
    )


def _regressions(
    result: GateResult,
    thresholds: EvaluateThresholds,
    comparison: Comparison | None,
    no_baseline_reason: str | None,
) -> None:
    drops = {name: getattr(thresholds.max_drop, name) for name in _DROPS}
    wanted = any(v is not None for v in drops.values()) or thresholds.max_broken_cases is not None
    if not wanted:
        return
    if comparison is None:
        reason = no_baseline_reason or "none configured"
        result.notes.append(f"regression gate passed without checking: no baseline ({reason})")
        return
    if not comparison.comparable:
        result.notes.append(
            "regression gate passed without checking: the baseline is not comparable (K differs)"
        )
        return
    for name, limit in drops.items():
        if limit is None:
            continue
        metric = _DROPS[name]
        row = comparison.metrics.get(metric)
        if row is None:
            result.notes.append(f"max_drop.{name}: no paired scored cases, not checked")
            continue
        drop = row.baseline - row.current
        beyond = drop > limit + 1e-12
        failed = beyond and (row.significant or not thresholds.regression_requires_significance)
        if beyond and not failed:
            why = f"not significant (pHolm={row.p_holm:.2g})"
        elif failed:
            why = f"pHolm={row.p_holm:.2g}"
        else:
            why = "within the allowed drop"
        message = (
            f"{metric} {row.baseline:.3f} -> {row.current:.3f}: drop {drop:+.3f}, allowed {limit} ({why})"
        )
        severity: Severity = "fail"
        unverified = _unverified_drop(comparison, metric, limit) if failed else None
        if unverified is not None:
            message += f"; {unverified}"
            severity = "warn" if thresholds.unjudged_policy == "warn" else "fail"
        result.checks.append(
            GateCheck(f"max_drop.{name}", metric, "<=", float(limit), drop, not failed, message, severity)
        )
    if thresholds.max_broken_cases is not None:
        _broken_cases(result, thresholds, comparison, thresholds.max_broken_cases)


def _unverified_drop(comparison: Comparison, metric: str, limit: float) -> str | None:
    """Why a drop beyond `max_drop` is unverified, or None: the change brought unjudged documents into
    some top K, and on the condensed lists (unjudged documents removed) the drop is within the limit."""
    account = comparison.unjudged
    row = comparison.condensed_metrics.get(metric)
    if account is None or not account.new_unjudged or row is None:
        return None
    drop = row.baseline - row.current
    if drop > limit + 1e-12:
        return None
    return (
        f"unverified: {account.headline}, and with unjudged documents removed {metric} "
        f"{row.baseline:.3f} -> {row.current:.3f} (drop {drop:+.3f})"
    )


def _broken_cases(
    result: GateResult, thresholds: EvaluateThresholds, comparison: Comparison, limit: int
) -> None:
    """`max_broken_cases` counts the broken cases; with `unjudged_policy: warn` an unverified one (its drop
    may come from unjudged documents, compare.unverified_reason) is left out of the count and warned about
    in an `unverified_broken_cases` check instead."""
    broken = comparison.cases.broken
    unverified = set(comparison.cases.unverified) & set(broken)
    counted = broken if thresholds.unjudged_policy == "fail" else [i for i in broken if i not in unverified]
    message = f"broken cases (hit 1 -> 0): {len(counted)}, allowed {limit}"
    if counted:
        message += " (" + ", ".join(counted) + ")"
    if unverified and thresholds.unjudged_policy == "warn":
        message += f"; {len(unverified)} unverified left out (unjudged_policy: warn)"
    result.checks.append(
        GateCheck(
            "max_broken_cases",
            "cases.broken",
            "<=",
            float(limit),
            float(len(counted)),
            len(counted) <= limit,
            message,
        )
    )
    if unverified and thresholds.unjudged_policy == "warn":
        details = comparison.case_details
        why = "; ".join(
            f"{i}: {details[i].why if i in details else 'unverified'}" for i in sorted(unverified)
        )
        result.checks.append(
            GateCheck(
                "unverified_broken_cases",
                "cases.unverified",
                "<=",
                0.0,
                float(len(unverified)),
                False,
                f"{len(unverified)} broken case(s) may be broken only by unjudged documents ({why})",
                "warn",
            )
        )
