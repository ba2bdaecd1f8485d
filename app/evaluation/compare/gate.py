"""The quality gate: thresholds on the summary, regressions against the baseline, and safety.

* Levels (`min_recall`, ..., `max_p95_ms`, and per segment `segments.<kind>:<name>.min_*`): a threshold left
  unset is not checked. A figure that could not be computed (no case had relevant documents, no case is in
  the segment) fails its check: a gate never passes on missing evidence.
* `scored_cases`: a run that scored no case (none with a relevant document in the index, no no-answer
  case) fails: nothing was measured.
* A run with a baseline is compared with it or fails as not checked (`not_checked`): an unusable baseline
  report, nothing paired (`compare.pairing`), or fewer paired cases than `min_paired_cases` (default half
  the baseline's scored and no-answer cases, at least 1). Only a run with no baseline at all (the first,
  or `baseline: none`) passes these checks without checking, and a note says so.
* Regressions, against the baseline, on the core set's paired cases (the whole set when it has no
  incremental part; the incremental set is reported apart and gated through `segments: {set:incremental}`):
  - by default (`regression_policy: fail`), for each of recall, hit rate, MRR and nDCG without a `max_drop`:
    a significant drop (adjusted p < alpha: Westfall-Young step-down max-T over the gated measures' sign
    flips, exact up to 20 non-zero pairs) fails; a drop that is not significant warns
    (`significant_drop.<measure>`);
  - `max_drop.<measure>`: a drop beyond the limit fails when significant (or always, with
    `regression_requires_significance: false`) and warns when it is not;
  - `max_broken_cases` (unset: 0, with `broken_case_policy`'s severity): broken core cases (hit 1 -> 0)
    whose baseline hit rested on documents the golden set still judges relevant; a break caused by a
    relabelling is named, not counted;
  - `high_risk_broken` (`high_risk_policy`): any broken case marked `risk: high`, in any set;
  - `abstention_broken` (as `max_broken_cases`): a core no-answer case that abstained in the baseline and
    answers now;
  - `removed_cases` (`removed_case_policy`): a hard case of the baseline (failed, or nDCG@K < 1) that left
    the golden set without a `retired` reason, or left the scoring (stale ids); other such cases warn;
  - `segment_drop` (`segment_drop_policy`, warn): a significant drop in a segment of 10+ paired cases (Holm
    over the segments); `segments.<key>.max_drop.<measure>`: a configured segment's mean paired drop;
  - `max_p95_increase`: p95 latency now <= baseline p95 x (1 + limit).
  Without a baseline these checks do not run and `notes` says why.
* Unjudged documents (`unjudged_policy`, default fail): they count as not relevant (the trec_eval
  convention), so a regression they may explain still fails, its message naming how many new top-K
  documents are unjudged (the list to judge). With "warn", a drop whose condensed lists (unjudged documents
  removed) stay within the limit warns, and an unverified broken case is left out of `max_broken_cases` and
  named in `unverified_broken_cases`. When the affected cases' mean Judged@K is under `JUDGED_FLOOR` the
  condensed figures cannot tell, and the message says so instead of calling the drop unverified.
* Access scopes (when the report has `access`: some case ran as a principal, or rag.access is on or defines
  evaluation principals): `max_access_leaks` (default 0) counts the returned or attached chunks that a
  case's principal may not read (`app.access.scope.may_read` over the stored metadata), over every case;
  `leak_probe` (zero tolerance, always fails) counts the leaks of the probe, every case run again as every
  other evaluation principal, and a probe run that could not retrieve (it checked nothing).
* Safety: `max_forbidden_hits` (default 0: one forbidden document in any top K fails), and for the
  no-answer cases `min_correct_abstention` and `max_false_answer_rate`; `no_answer_policy` (warn) holds when
  at least one no-answer case abstained (returned nothing): 0 of n is what it catches.

A check's `passed` says whether it held; its `severity` ("fail" or "warn") whether not holding fails the
gate or warns. A policy set to "off" leaves its check out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any, Literal

from app.evaluation.compare.comparison import JUDGED_FLOOR, MIN_TESTED_SEGMENT
from app.evaluation.compare.pairing import WAY_BACK
from app.evaluation.golden.segments import case_segments
from app.evaluation.report.model import (
    AccessLeak,
    CaseFigures,
    CaseRecord,
    Comparison,
    Gate,
    GateCheckRecord,
    GateFailure,
    MetricComparison,
    Report,
    Summary,
)
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import fmt, fmt_p, snake_name
from app.settings import EvaluateThresholds, SegmentThresholds

# threshold field -> (the figure's name in the report JSON's summary, comparison, the figure)
_LEVELS: dict[str, tuple[str, str, Callable[[Summary], float | None]]] = {
    "min_recall": ("recall", ">=", lambda s: s.recall),
    "min_hit_rate": ("hitRate", ">=", lambda s: s.hit_rate),
    "min_mrr": ("mrr", ">=", lambda s: s.mrr),
    "min_ndcg": ("ndcg", ">=", lambda s: s.ndcg),
    "max_duplicate_rate": ("duplicateRate", "<=", lambda s: s.duplicate_rate),
    "max_p95_ms": ("latencyMs.p95", "<=", lambda s: (s.latency_ms or {}).get("p95")),
    "min_correct_abstention": (
        "noAnswer.correctAbstentionRate",
        ">=",
        lambda s: s.no_answer.correct_abstention_rate,
    ),
    "max_false_answer_rate": ("noAnswer.falseAnswerRate", "<=", lambda s: s.no_answer.false_answer_rate),
}

Severity = Literal["fail", "warn"]

# what each check holds, in words, for the report's gate table (by name, or by the name's prefix before ".")
MEANS: dict[str, str] = {
    "min_recall": "mean Recall@K over the scored cases, at least",
    "min_hit_rate": "share of scored cases with a relevant document in the top K, at least",
    "min_mrr": "mean MRR@K over the scored cases, at least",
    "min_ndcg": "mean nDCG@K over the scored cases, at least",
    "max_duplicate_rate": "mean share of the top K that repeats a higher-ranked result, at most",
    "max_p95_ms": "p95 single-query latency in ms, at most",
    "min_correct_abstention": "share of no-answer cases that returned nothing, at least",
    "max_false_answer_rate": "share of no-answer cases that returned documents, at most",
    "max_forbidden_hits": "forbidden documents in any top K (a count), at most",
    "max_access_leaks": "returned or attached chunks the case's principal may not read (a count), at most",
    "leak_probe": "chunks a case run as another evaluation principal returned that it may not read, none",
    "no_answer_policy": "no-answer cases that abstained (a count, not a rate), at least",
    "scored_cases": "cases scored (with a relevant document in the index) and no-answer cases, at least",
    "not_checked": "paired cases compared with the baseline, at least (else: not checked, the run fails)",
    "abstention_broken": "core no-answer cases that abstained in the baseline and answer now, at most",
    "significant_drop": "the drop against the baseline (core set): a significant one fails, any other warns",
    "max_drop": "the drop against the baseline (core set), at most; beyond it, significant fails, else warns",
    "max_broken_cases": "core cases whose hit went 1 -> 0 on documents still judged relevant, at most",
    "unverified_broken_cases": "broken cases that unjudged documents may explain (unjudged_policy: warn)",
    "high_risk_broken": "broken cases marked risk: high, in any set (a count), at most",
    "removed_cases": "hard cases of the baseline that left the golden set (no retired reason) or the "
    "scoring, none",
    "segment_drop": "segments of 10+ paired cases with a significant drop (Holm over segments), none",
    "segments": "a configured segment's level or drop",
    "max_p95_increase": "p95 latency growth against the baseline (a ratio: 0.2 = +20%), at most",
}


# the default rule in one paragraph, under the reports' gate tables
GATE_RULE = (
    "By default the gate fails on a run that scored nothing, on a run with a baseline it could not be "
    "compared with (not checked), on a forbidden document in any top K, on a significant drop (max-T "
    "adjusted p < alpha) of Recall, HitRate, MRR or nDCG against the baseline on the core set, on a broken "
    "core case (hit 1 → 0) whose baseline hit rests on documents still judged relevant, on a no-answer case "
    "that abstained and answers now, on a broken high-risk case, and on a hard case of the baseline "
    "(failed or nDCG < 1) removed without a retired reason or gone from the scoring; a drop that is not "
    "significant, a significant drop in a segment of 10+ cases and 0 abstentions of the no-answer cases "
    "warn. Unjudged documents count as not relevant (docs/baselines.md)."
)


def check_means(name: str) -> str:
    """What the check `name` holds, in words (`MEANS`)."""
    return MEANS.get(name) or MEANS.get(name.split(".", 1)[0], "")


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
                    means=check_means(c.name),
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
    report: Report,
    thresholds: EvaluateThresholds,
    no_baseline_reason: str | None = None,
    comparison: Comparison | None = None,
    not_checked: str | None = None,
    report_path: str | None = None,
) -> GateResult:
    """All configured checks on `report`: its summary's figures (a report without a summary has none,
    so every level fails), whether anything was scored, its comparison (None: no baseline, for the reason
    given; or, with `not_checked`, a baseline that could not be used, which fails the run) and its case
    records (to name the cases with forbidden documents). `comparison` is the one a measured report (built
    without it) is judged by; None: the report's own. `report_path` is this run's report file, named in
    the way forward of a run that was not checked."""
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
    _scored_cases(result, summary)
    _segment_levels(result, report, thresholds)
    _forbidden(result, summary, report, thresholds)
    _access_leaks(result, report, thresholds)
    _leak_probe(result, report)
    _no_answer_policy(result, summary, thresholds)
    _regressions(
        result,
        report,
        thresholds,
        comparison or report.comparison,
        no_baseline_reason,
        not_checked,
        report_path,
    )
    return result


def _scored_cases(result: GateResult, summary: Summary) -> None:
    """`scored_cases`: a run that scored nothing (no case with a relevant document in the index, no
    no-answer case) measured nothing, and fails; whatever its baseline, it never becomes one."""
    scored = summary.scored_cases + summary.no_answer.cases
    message = f"{summary.scored_cases} case(s) scored, {summary.no_answer.cases} no-answer case(s)"
    if scored == 0:
        unscorable = summary.unscorable_case_ids
        message = (
            f"no case could be scored: {summary.cases} case(s), none with a relevant document in the index "
            "and none a no-answer case, so nothing was measured"
        )
        if unscorable:
            shown = ", ".join(unscorable[:10]) + (" …" if len(unscorable) > 10 else "")
            message += f"; unscorable: {shown} (`sieve golden check` says where their ids went)"
    result.checks.append(
        GateCheck("scored_cases", "summary.scoredCases", ">=", 1.0, float(scored), scored >= 1, message)
    )


def _no_answer_policy(result: GateResult, summary: Summary, thresholds: EvaluateThresholds) -> None:
    """`no_answer_policy`: abstained = round(correctAbstentionRate x n) of the n no-answer cases; the
    check holds when abstained >= 1. Not checked without no-answer cases."""
    severity = policy_severity(thresholds.no_answer_policy)
    no_answer = summary.no_answer
    n = no_answer.cases
    if severity is None or n == 0:
        return
    rate = no_answer.correct_abstention_rate
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
        where = [
            f"{', '.join(c.scores.forbidden_found)} in case {c.case.id}"
            for c in report.cases
            if c.scores.forbidden_found
        ]
        message += " (" + "; ".join(where) + ")"
    result.checks.append(
        GateCheck("max_forbidden_hits", "forbidden.hits", "<=", float(limit), float(hits), passed, message)
    )


SHOWN_LEAKS = 10


def _leak_list(leaks: list[AccessLeak]) -> str:
    shown = "; ".join(leak.describe() for leak in leaks[:SHOWN_LEAKS])
    return shown + (f"; … and {len(leaks) - SHOWN_LEAKS} more" if len(leaks) > SHOWN_LEAKS else "")


def _access_leaks(result: GateResult, report: Report, thresholds: EvaluateThresholds) -> None:
    """`max_access_leaks`: the cases' leaks (`report.access.leaks`, one per chunk) against the limit. Not
    checked without an access section (no case ran scoped) or with the limit unset."""
    limit = thresholds.max_access_leaks
    if limit is None or report.access is None:
        return
    leaks = report.access.leaks
    message = f"chunks returned to a principal that may not read them: {len(leaks)}, allowed {limit}"
    if leaks:
        message += " (" + _leak_list(leaks) + ")"
    result.checks.append(
        GateCheck(
            "max_access_leaks",
            "access.leaks",
            "<=",
            float(limit),
            float(len(leaks)),
            len(leaks) <= limit,
            message,
        )
    )


def _leak_probe(result: GateResult, report: Report) -> None:
    """`leak_probe`: no leak in the probe's runs, and no probe run that failed (it checked nothing). Not
    checked when the probe did not run (no evaluation principals; or rag.evaluate.leak_probe off, which a
    note says)."""
    probe = report.access.probe if report.access is not None else None
    if probe is None:
        if report.access is not None and report.access.principals:
            result.notes.append(
                "leak probe not run (rag.evaluate.leak_probe is false): no case was re-run as the other "
                "evaluation principals"
            )
        return
    found = len(probe.leaks)
    message = f"{probe.runs} probe run(s) as {len(probe.principals)} principal(s): {found} leak(s)"
    if probe.leaks:
        message += " (" + _leak_list(probe.leaks) + ")"
    if probe.errors:
        shown = "; ".join(probe.errors[:SHOWN_LEAKS])
        message += f"; {len(probe.errors)} probe run(s) failed, unchecked: {shown}"
    result.checks.append(
        GateCheck(
            "leak_probe",
            "access.probe.leaks",
            "<=",
            0.0,
            float(found + len(probe.errors)),
            found == 0 and not probe.errors,
            message,
        )
    )


def _regressions(
    result: GateResult,
    report: Report,
    thresholds: EvaluateThresholds,
    comparison: Comparison | None,
    no_baseline_reason: str | None,
    not_checked: str | None,
    report_path: str | None,
) -> None:
    """Every check against the baseline (the module docstring's "Regressions"). A run with a baseline is
    compared or fails as not checked (an unusable baseline, nothing paired, fewer pairs than the floor);
    only a run without any baseline passes them without checking, and a note says so."""
    if comparison is None:
        if not_checked is not None:
            result.checks.append(_not_checked(not_checked, 0, 1, report_path))
            return
        reason = no_baseline_reason or "none configured"
        result.notes.append(f"regression gate passed without checking: no baseline ({reason})")
        return
    _removed_cases(result, thresholds, comparison)
    paired = comparison.paired_cases + comparison.paired_no_answer
    floor = paired_floor(comparison, thresholds)
    if not comparison.comparable or paired < floor:
        result.checks.append(_not_checked(_unchecked_reason(comparison, floor), paired, floor, report_path))
        return
    result.checks.append(_checked(comparison, paired, floor))
    rows = core_rows(comparison)
    if comparison.by_set and not rows:
        result.notes.append("no core case is paired with the baseline: the drop checks did not run")
    for metric in measures.GATED:  # read when the gate runs: a measure registered since is checked too
        name = snake_name(metric)
        row = rows.get(metric)
        if row is None:
            continue
        limit = getattr(thresholds.max_drop, name, None)  # no settings field: the default rule only
        check = (
            _drop_check(name, metric, row, limit, thresholds)
            if limit is not None
            else _default_drop_check(name, metric, row, thresholds)
        )
        if check is not None:
            result.checks.append(_judged_caveat(check, comparison, metric, limit, thresholds))
    _broken_cases(result, report, thresholds, comparison)
    _abstention_broken(result, report, thresholds, comparison)
    _high_risk(result, report, thresholds, comparison)
    _segment_drops(result, thresholds, comparison)
    _p95_increase(result, thresholds, comparison)


def paired_floor(comparison: Comparison, thresholds: EvaluateThresholds) -> int:
    """The fewest paired cases (scored and no-answer) a check needs: `min_paired_cases`, or by default
    ceil(baseline's scored and no-answer cases / 2), and at least 1."""
    if thresholds.min_paired_cases is not None:
        return thresholds.min_paired_cases
    return max(1, math.ceil(comparison.baseline_scored / 2))


def _unchecked_reason(comparison: Comparison, floor: int) -> str:
    """Why a comparison does not make a check, in words."""
    paired = comparison.paired_cases + comparison.paired_no_answer
    parts = [f"{paired} case(s) paired with the baseline, fewer than the {floor} a check needs"]
    if comparison.cases.changed:
        parts.append(f"{len(comparison.cases.changed)} changed their own topK")
    left = [c for c in comparison.removed_cases if c.left_scoring is not None]
    if left:
        parts.append(f"{len(left)} left the scoring")
    gone = len(comparison.cases.only_in_baseline)
    if gone:
        parts.append(f"{gone} of the baseline's cases are not in this run")
    return "; ".join(parts) + " (rag.evaluate.thresholds.min_paired_cases)"


def _not_checked(reason: str, paired: int, floor: int, report_path: str | None) -> GateCheck:
    """The failing check of a run that has a baseline but could not be compared with it."""
    target = report_path or "FILE"
    message = (
        f"not checked against the baseline: {reason}. The run fails and the baseline stays. Ways forward: "
        f"`sieve baseline accept {target}` starts over from this run on purpose; `sieve eval --baseline "
        "none` (RAG__EVALUATE__BASELINE=none at start-up) is an exploratory run without a comparison"
    )
    return GateCheck(
        "not_checked", "comparison.pairedCases", ">=", float(floor), float(paired), False, message
    )


def _checked(comparison: Comparison, paired: int, floor: int) -> GateCheck:
    """The holding check of a compared run: on how many pairs, and how (K, renames, changed cases)."""
    parts = [f"compared with the baseline on {paired} paired case(s) (at least {floor})"]
    parts += comparison.notes
    if comparison.cases.renamed:
        parts.append(f"{len(comparison.cases.renamed)} renamed case(s) paired by content")
    if comparison.cases.changed:
        shown = ", ".join(f"{c.id} ({c.reason})" for c in comparison.cases.changed)
        parts.append(f"{len(comparison.cases.changed)} changed case(s) left out: {shown}")
    return GateCheck(
        "not_checked", "comparison.pairedCases", ">=", float(floor), float(paired), True, "; ".join(parts)
    )


def core_rows(comparison: Comparison) -> dict[str, MetricComparison]:
    """The paired statistics the regression checks read: the core set's (`Comparison.by_set`), or every
    paired case's when the golden set has one part only."""
    if comparison.by_set:
        return comparison.by_set.get("core", {})
    return comparison.metrics


def p_text(row: MetricComparison) -> str:
    """A tested row's p-values as the gate's lines say them: `p=0.016 (exact), adjusted 0.016 (max-T)`;
    a Monte Carlo one with its standard error, and a word when it lies within that error of alpha."""
    how = "exact" if row.exact else "Monte Carlo"
    text = f"p={fmt_p(row.p_value)} ({how}), adjusted {fmt_p(row.p_adjusted)} (max-T)"
    if row.p_error is not None:
        text += f" ± {row.p_error:.2g}"
    if row.near_alpha:
        text += ": within Monte Carlo error of alpha, another seed may decide the other way"
    return text


def _drop_text(metric: str, row: MetricComparison) -> str:
    drop = row.baseline - row.current
    return f"{metric} {row.baseline:.3f} -> {row.current:.3f}: drop {drop:+.3f}"


def _drop_check(
    name: str, metric: str, row: MetricComparison, limit: float, thresholds: EvaluateThresholds
) -> GateCheck:
    """`max_drop.<name>`: a drop beyond `limit` fails when significant (or always, without
    `regression_requires_significance`) and warns when it is not significant."""
    drop = row.baseline - row.current
    beyond = drop > limit + 1e-12
    failed = beyond and (row.significant or not thresholds.regression_requires_significance)
    if failed:
        why = p_text(row)
    elif beyond:
        why = f"not significant ({p_text(row)}): a warning"
    else:
        why = "within the allowed drop"
    message = f"{_drop_text(metric, row)}, allowed {limit} ({why})"
    severity: Severity = "fail" if failed or not beyond else "warn"
    return GateCheck(f"max_drop.{name}", metric, "<=", float(limit), drop, not beyond, message, severity)


def _default_drop_check(
    name: str, metric: str, row: MetricComparison, thresholds: EvaluateThresholds
) -> GateCheck | None:
    """`significant_drop.<name>`, the rule with no `max_drop` set: a significant drop (pHolm < alpha over
    the compared measures) has `regression_policy`'s severity; a drop that is not significant warns."""
    severity = policy_severity(thresholds.regression_policy)
    if severity is None:
        return None
    drop = row.baseline - row.current
    dropped = drop > 1e-12
    if dropped and row.significant:
        why = f"significant, {p_text(row)}"
    elif dropped:
        why = f"not significant, {p_text(row)}: a warning"
        severity = "warn"
    else:
        why = "no drop"
    message = f"{_drop_text(metric, row)} ({why})"
    return GateCheck(f"significant_drop.{name}", metric, "<=", 0.0, drop, not dropped, message, severity)


def _judged_caveat(
    check: GateCheck,
    comparison: Comparison,
    metric: str,
    limit: float | None,
    thresholds: EvaluateThresholds,
) -> GateCheck:
    """A failing drop check with what unjudged documents may mean for it: with `unjudged_policy: warn` a drop
    the condensed lists do not show only warns; with "fail" (unjudged = not relevant) it stays failed and
    names the documents to judge. When the affected cases are judged too thinly for the condensed lists to
    tell (Judged@K < JUDGED_FLOOR), it says so instead of calling the drop unverified."""
    if not check.failed:
        return check
    account = comparison.unjudged
    if account is None or not account.new_unjudged:
        return check
    thin = _thinly_judged(comparison)
    if thin is not None:
        return replace(check, message=f"{check.message}; {account.headline}; {thin}")
    unverified = _unverified_drop(comparison, metric, limit if limit is not None else 0.0)
    if unverified is None:
        return replace(
            check, message=f"{check.message}; {account.headline} (judge them: they count as not relevant)"
        )
    severity: Severity = "warn" if thresholds.unjudged_policy == "warn" else "fail"
    policy = "unjudged_policy: warn" if severity == "warn" else "unjudged count as not relevant"
    return replace(check, message=f"{check.message}; {unverified} ({policy})", severity=severity)


def _thinly_judged(comparison: Comparison) -> str | None:
    """The sentence for regressions judged too thinly for the condensed figures to mean anything, or None."""
    judged = comparison.judged_of_regressions
    if judged is None or judged >= JUDGED_FLOOR:
        return None
    return (
        f"Judged@K of the affected cases is {judged:.3f} (< {JUDGED_FLOOR}): too few judgments for the "
        "condensed figures to tell; unjudged documents count as not relevant, judge the new ones to settle it"
    )


def _unverified_drop(comparison: Comparison, metric: str, limit: float) -> str | None:
    """Why a drop beyond its limit may come from unjudged documents, or None: the change brought unjudged
    documents into some top K, and on the condensed lists (unjudged documents removed) the drop is within
    the limit."""
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
    result: GateResult, report: Report, thresholds: EvaluateThresholds, comparison: Comparison
) -> None:
    """`max_broken_cases` (default, unset: 0 with `broken_case_policy`'s severity) over the broken core cases
    whose baseline hit rested on documents the golden set still judges relevant (a break by relabelling is
    named, not counted). Unjudged documents count as not relevant; with `unjudged_policy: warn` an
    unverified break (compare.unverified_reason) is left out and warned about in `unverified_broken_cases`."""
    limit = thresholds.max_broken_cases
    severity: Severity | None = (
        "fail" if limit is not None else policy_severity(thresholds.broken_case_policy)
    )
    if severity is None:
        return
    limit = 0 if limit is None else limit
    sets = {c.case.id: c.case.case_set for c in report.cases}
    relabelled = sorted(comparison.cases.broken_by_relabelling)
    broken = [i for i in comparison.cases.broken if i not in relabelled]
    incremental = [i for i in broken if sets.get(i, "core") != "core"]
    core = [i for i in broken if i not in incremental]
    lenient = thresholds.unjudged_policy == "warn"
    unverified = sorted(set(comparison.cases.unverified) & set(core)) if lenient else []
    counted = [i for i in core if i not in unverified]
    message = f"broken core cases (hit 1 -> 0): {len(counted)}, allowed {limit}"
    if thresholds.max_broken_cases is None:
        message += " (the default)"
    if counted:
        message += " (" + ", ".join(counted) + ")"
    for label, ids in (
        ("unverified left out (unjudged_policy: warn)", unverified),
        ("incremental, reported apart", incremental),
        ("broken by relabelling (the baseline's hit is no longer judged relevant), not counted", relabelled),
    ):
        if ids:
            message += f"; {len(ids)} {label}: {', '.join(ids)}"
    if counted:
        message += _unjudged_note(comparison)
    count = float(len(counted))
    check = GateCheck("max_broken_cases", "cases.broken", "<=", float(limit), count, count <= limit, message)
    result.checks.append(replace(check, severity=severity))
    if unverified:
        result.checks.append(_unverified_broken(comparison, unverified))


def _unjudged_note(comparison: Comparison) -> str:
    """ "; n of the m new top-K documents are unjudged" (and the thin-judgment sentence), or ""."""
    account = comparison.unjudged
    if account is None or not account.new_unjudged:
        return ""
    thin = _thinly_judged(comparison)
    return f"; {account.headline}" + (f"; {thin}" if thin else "")


def _unverified_broken(comparison: Comparison, unverified: list[str]) -> GateCheck:
    """The warning naming the broken cases `unjudged_policy: warn` left out, each with its reason."""
    details = comparison.case_details
    why = "; ".join(f"{i}: {details[i].why if i in details else 'unverified'}" for i in unverified)
    return GateCheck(
        "unverified_broken_cases",
        "cases.unverified",
        "<=",
        0.0,
        float(len(unverified)),
        False,
        f"{len(unverified)} broken case(s) may be broken only by unjudged documents ({why})",
        "warn",
    )


def _abstention_broken(
    result: GateResult, report: Report, thresholds: EvaluateThresholds, comparison: Comparison
) -> None:
    """`abstention_broken`: a core no-answer case that abstained in the baseline and answers now is broken,
    exactly as a hit 1 -> 0: the same limit (`max_broken_cases`, unset: 0) and severity
    (`broken_case_policy`). Checked when no-answer cases are paired."""
    limit = thresholds.max_broken_cases
    severity: Severity | None = (
        "fail" if limit is not None else policy_severity(thresholds.broken_case_policy)
    )
    if severity is None or comparison.paired_no_answer == 0:
        return
    limit = 0 if limit is None else limit
    sets = {c.case.id: c.case.case_set for c in report.cases}
    broken = comparison.cases.abstention_broken
    incremental = [i for i in broken if sets.get(i, "core") != "core"]
    counted = [i for i in broken if i not in incremental]
    message = (
        f"no-answer cases that abstained in the baseline and answer now: {len(counted)} of "
        f"{comparison.paired_no_answer} paired, allowed {limit}"
    )
    if counted:
        message += " (" + ", ".join(counted) + ")"
    if incremental:
        message += f"; {len(incremental)} incremental, reported apart: {', '.join(incremental)}"
    row = comparison.metrics.get("correctAbstention")
    if row is not None:
        message += f"; CorrectAbstention {row.baseline:.3f} -> {row.current:.3f} (p={fmt_p(row.p_value)})"
    count = float(len(counted))
    result.checks.append(
        GateCheck(
            "abstention_broken",
            "cases.abstentionBroken",
            "<=",
            float(limit),
            count,
            count <= limit,
            message,
            severity,
        )
    )


def _high_risk(
    result: GateResult, report: Report, thresholds: EvaluateThresholds, comparison: Comparison
) -> None:
    """`high_risk_broken`: a broken case marked `risk: high`, in any set and whatever judged its new
    documents, has `high_risk_policy`'s severity (checked when the golden set has high-risk cases)."""
    severity = policy_severity(thresholds.high_risk_policy)
    high = {c.case.id for c in report.cases if c.case.risk == "high"}
    if severity is None or not high:
        return
    relabelled = set(comparison.cases.broken_by_relabelling)
    broken = [i for i in comparison.cases.broken if i in high and i not in relabelled]
    owners = {c.case.id: c.case.owner for c in report.cases}
    named = ", ".join(f"{i} (owner {owners[i]})" if owners.get(i) else i for i in broken)
    message = f"broken high-risk cases: {len(broken)} of {len(high)}" + (f" ({named})" if broken else "")
    result.checks.append(
        GateCheck(
            "high_risk_broken",
            "cases.brokenHighRisk",
            "<=",
            0.0,
            float(len(broken)),
            not broken,
            message,
            severity,
        )
    )


def _removed_cases(result: GateResult, thresholds: EvaluateThresholds, comparison: Comparison) -> None:
    """`removed_cases`: a hard case of the baseline (failed, Recall@K < 1 or an error, or ranked below the
    ideal, nDCG@K < 1) that left the golden set without a `retired: [{id, reason}]` entry, or left the
    scoring (still in the golden set, but its expected ids went stale or every expectation is gone), has
    `removed_case_policy`'s severity; any other such case warns; removals that all carry a reason hold
    (and are named)."""
    severity = policy_severity(thresholds.removed_case_policy)
    removed = comparison.removed_cases
    if severity is None or not removed:
        return
    unexplained = [c for c in removed if c.retired_reason is None]
    hard = [c for c in unexplained if c.hard]
    others = [c for c in unexplained if not c.hard]
    gone = sum(1 for c in removed if c.left_scoring is None)
    left = len(removed) - gone
    parts = [f"{gone} case(s) removed since the baseline, {left} left the scoring"]
    if hard:
        parts.append(
            f"{len(hard)} hard in the baseline (failed or nDCG < 1), no retired reason: {_named(hard)}"
        )
    if others:
        parts.append(f"{len(others)} without a retired reason: {_named(others)}")
    retired = [f"{c.id} ({c.retired_reason})" for c in removed if c.retired_reason is not None]
    if retired:
        parts.append(f"retired: {', '.join(retired)}")
    if left:
        parts.append(f"the way back: {WAY_BACK}")
    if not hard and others:
        severity = "warn"
    result.checks.append(
        GateCheck(
            "removed_cases",
            "cases.removedUnretired",
            "<=",
            0.0,
            float(len(hard) if hard else len(others)),
            not unexplained,
            "; ".join(parts),
            severity,
        )
    )


def _named(cases: list[CaseFigures]) -> str:
    """The cases' ids, each that left the scoring with why: `a, b (left the scoring: ...)`."""
    return ", ".join(
        f"{c.id} (left the scoring: {c.left_scoring})" if c.left_scoring else c.id for c in cases
    )


def _segment_drops(result: GateResult, thresholds: EvaluateThresholds, comparison: Comparison) -> None:
    """`segment_drop` (`segment_drop_policy`): a segment of 10+ paired cases whose drop is significant
    (Holm over the tested segments, per measure); then each configured `segments` entry."""
    severity = policy_severity(thresholds.segment_drop_policy)
    tested = [r for r in comparison.segments if r.p_holm is not None]
    if severity is not None and tested:
        dropped = [r for r in tested if r.significant and r.delta < 0]
        shown = "; ".join(
            f"{r.kind}:{r.name} {r.metric} {r.baseline:.3f} -> {r.current:.3f} (n={r.paired_cases}, "
            f"pHolm={fmt_p(r.p_holm)})"
            for r in dropped
        )
        segments = len({(r.kind, r.name) for r in tested})
        message = (
            f"significant segment drops: {len(dropped)} over {segments} segments of "
            f"{MIN_TESTED_SEGMENT}+ cases" + (f" ({shown})" if dropped else "")
        )
        result.checks.append(
            GateCheck(
                "segment_drop",
                "segments.drops",
                "<=",
                0.0,
                float(len(dropped)),
                not dropped,
                message,
                severity,
            )
        )
    for key, config in thresholds.segments.items():
        _segment_max_drops(result, key, config, comparison)


def _segment_max_drops(
    result: GateResult, key: str, config: SegmentThresholds, comparison: Comparison
) -> None:
    """A configured segment's `max_drop`: the mean paired difference over the segment's cases, beyond the
    limit, fails (no significance is asked of one segment: the limit is the user's own); a segment no
    paired case belongs to fails (nothing to check is not a pass)."""
    kind, _, name = key.partition(":")
    for metric in measures.GATED:
        field_name = snake_name(metric)
        limit = getattr(config.max_drop, field_name, None)
        if limit is None:
            continue
        check_name = f"segments.{key}.max_drop.{field_name}"
        row = next(
            (r for r in comparison.segments if (r.kind, r.name, r.metric) == (kind, name, metric)), None
        )
        if row is None:
            result.checks.append(
                GateCheck(check_name, metric, "<=", float(limit), None, False, f"no paired case is in {key}")
            )
            continue
        drop = row.baseline - row.current
        message = (
            f"{key} {metric} {row.baseline:.3f} -> {row.current:.3f}: drop {drop:+.3f}"
            f", allowed {limit} (n={row.paired_cases}, p={fmt_p(row.p_value)})"
        )
        result.checks.append(
            GateCheck(check_name, metric, "<=", float(limit), drop, drop <= limit + 1e-12, message)
        )


def _segment_levels(result: GateResult, report: Report, thresholds: EvaluateThresholds) -> None:
    """Each configured segment's levels (`min_recall`, ... over the segment's scored cases); a segment
    no scored case belongs to fails its levels."""
    for key, config in thresholds.segments.items():
        members = [c for c in report.cases if c.scores.metrics and in_segment(c, key)]
        for name, (metric, _, _) in _LEVELS.items():
            if not name.startswith("min_") or not hasattr(config, name):
                continue
            threshold = getattr(config, name)
            if threshold is None:
                continue
            value = (
                fmean(float(c.scores.metrics[metric]) for c in members if c.scores.metrics)
                if members
                else None
            )
            message = (
                f"{key}: {metric}={fmt(value, 4)} over {len(members)} scored case(s), needs >= {threshold}"
                if members
                else f"{key}: no scored case is in this segment"
            )
            result.checks.append(
                GateCheck(
                    f"segments.{key}.{name}",
                    metric,
                    ">=",
                    float(threshold),
                    value,
                    value is not None and value >= threshold,
                    message,
                )
            )


def in_segment(case: CaseRecord, key: str) -> bool:
    """Whether `case` belongs to the segment `<kind>:<name>` (`run.segments.case_segments`)."""
    kind, _, name = key.partition(":")
    return (kind, name) in case_segments(case)


def _p95_increase(result: GateResult, thresholds: EvaluateThresholds, comparison: Comparison) -> None:
    """`max_p95_increase`: the p95 single-query latency may grow to baseline x (1 + limit) at most; without
    both figures (latency_sample 0 on either side) the check fails."""
    limit = thresholds.max_p95_increase
    if limit is None:
        return
    row = comparison.budget.get("p95Ms")
    before = row.baseline if row else None
    now = row.current if row else None
    if before is None or now is None or before <= 0:
        message = "p95 latency is missing on one side (rag.evaluate.latency_sample 0?)"
        result.checks.append(
            GateCheck("max_p95_increase", "latencyMs.p95", "<=", limit, None, False, message)
        )
        return
    increase = now / before - 1.0
    message = f"p95 {before:.0f} ms -> {now:.0f} ms: {increase:+.1%}, allowed +{limit:.0%}"
    result.checks.append(
        GateCheck(
            "max_p95_increase", "latencyMs.p95", "<=", limit, increase, increase <= limit + 1e-12, message
        )
    )
