"""Compare an evaluation report with a baseline report: what changed between the runs (from their
fingerprints), which cases pair (`pairing`), and, per metric, the paired difference with its bootstrap CI,
its sign-flip p-value and, for the gated measures, the p-value adjusted over them (Westfall-Young max-T).
Works on typed reports (`Report`), read from their files by `load_report`, so `sieve compare A.json B.json`
and the comparison inside a run are the same code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean

from pydantic import JsonValue, ValidationError
from pydantic.alias_generators import to_camel

from app.evaluation.compare.pairing import WAY_BACK, Pairing, pair
from app.evaluation.golden.segments import members
from app.evaluation.report.model import (
    BaselineRef,
    BeforeAfter,
    CaseChanges,
    CaseDelta,
    CaseDetail,
    CaseFigures,
    CaseRecord,
    Comparison,
    CompositionRow,
    EmbedderIdentity,
    MetricComparison,
    Report,
    RunFingerprint,
    RunInfo,
    SegmentComparison,
    StageDelta,
    StageRow,
    Summary,
    UnjudgedAccount,
)
from app.evaluation.scoring import measures, stats
from app.evaluation.scoring.metrics import match_key

SMALL_SAMPLE = 30
# below this Judged@K a case's condensed list (unjudged documents removed) cannot show a drop: its drop is
# neither verified nor unverified, and the report says so
JUDGED_FLOOR = 0.5
CANNOT_TELL = "cannot tell"
# a segment is tested for a drop (Holm over segments) from this many paired cases
MIN_TESTED_SEGMENT = 10
# the cost figures the comparison shows beside the quality (`Comparison.budget`)
BUDGET_KEYS = ("p95Ms", "duplicateRate", "contextChars", "candidates", "modelCalls")
BUDGET_LABELS = {
    "p95Ms": "p95 latency (ms)",
    "duplicateRate": "Duplicate rate",
    "contextChars": "Context characters per case",
    "candidates": "Candidates per case",
    "modelCalls": "Model calls per case",
}

# case id -> measure key -> the case's figure (a case record's `metrics` or `condensed`)
Figures = dict[str, Mapping[str, float]]


class BaselineError(ValueError):
    """The baseline report cannot be used; the message names the file and what is wrong."""


def load_report(path: str | Path) -> Report:
    """Read a report file with `Report.model_validate_json`. Raises BaselineError naming the file and, for a
    report of the wrong shape, the case and field (`case 'a' (cases[0]): metrics.ndcg: ...`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{p}: baseline report not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read the baseline report: {exc}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BaselineError(f"{p}: not a JSON report: {exc}") from None
    if not isinstance(data, dict) or "cases" not in data or "run" not in data:
        raise BaselineError(f"{p}: not a Sieve evaluation report (no 'run' and 'cases')")
    try:
        report = Report.model_validate_json(text)
    except ValidationError as exc:
        raise BaselineError(f"{p}: {validation_message(exc, data)}") from None
    if report.status != "ok":
        raise BaselineError(f"{p}: the baseline run did not evaluate anything (status {report.status!r})")
    _check_run(p, report.run)
    _check_cases(p, report)
    return report


def validation_message(exc: ValidationError, data: JsonValue) -> str:
    """The first problem of a report that does not validate, located as a reader finds it: `case 'a'
    (cases[0]): metrics.ndcg: Input should be a valid number, ...`, or `run: Input should be ...`."""
    error = exc.errors(include_url=False)[0]
    loc = list(error["loc"])
    where = ""
    if len(loc) >= 2 and loc[0] == "cases" and isinstance(loc[1], int):
        cases = data.get("cases") if isinstance(data, dict) else None
        case = cases[loc[1]] if isinstance(cases, list) and loc[1] < len(cases) else None
        case_id = case.get("id") if isinstance(case, dict) else None
        where = f"case {case_id!r} (cases[{loc[1]}])" if case_id is not None else f"cases[{loc[1]}]"
        loc = loc[2:]
        if loc and loc[0] in CaseRecord.model_fields:
            loc = loc[1:]  # the record's part: its JSON is flat
    field = ""
    for part in loc:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    located = ": ".join(x for x in (where, field) if x)
    return f"{located}: {error['msg']}" if located else str(error["msg"])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_run(p: Path, run: RunInfo) -> None:
    """The run's fingerprint must read as one (`fingerprint_of`): the comparison reads its fields."""
    try:
        fingerprint_of(run)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = ".".join(to_camel(part) if isinstance(part, str) else f"[{part}]" for part in error["loc"])
        raise BaselineError(f"{p}: run.{field}: {error['msg']}") from None


def _check_cases(p: Path, report: Report) -> None:
    """What the comparison pairs on must hold beyond the types: unique case ids, and every compared measure
    of a scored case a finite number."""
    seen: set[str] = set()
    for index, case in enumerate(report.cases):
        where = f"{p}: case {case.case.id!r} (cases[{index}])"
        if case.case.id in seen:
            raise BaselineError(f"{where}: duplicate case id")
        seen.add(case.case.id)
        if case.scores.metrics is not None:
            for name in measures.COMPARED:
                if not _is_number(case.scores.metrics.get(name)):
                    raise BaselineError(
                        f"{where}: metrics.{name} must be a number, got {case.scores.metrics.get(name)!r}"
                    )


def compare_reports(
    baseline_report: Report,
    current_report: Report,
    baseline_path: str,
    seed: int = 42,
    alpha: float = 0.05,
) -> Comparison:
    """Pair the cases (`pairing.pair`: by id, then by content; a case whose own topK changed left out; at the
    smaller K when the runs' K differ; a case that left the scoring counted as removed) and compare the
    pairs: figures over the paired cases scored on both sides, and the paired no-answer cases' abstention.
    When nothing can be paired the comparison is not `comparable` and carries no statistics: the gate
    fails the run as not checked."""
    pairing = pair(baseline_report, current_report)
    c_all = {c.case.id: c for c in current_report.cases}
    changes = CaseChanges(
        only_in_baseline=pairing.only_in_baseline,
        only_in_current=pairing.only_in_current,
        renamed=pairing.renamed,
        changed=pairing.changed,
    )
    b_run, c_run = fingerprint_of(baseline_report.run), fingerprint_of(current_report.run)
    ref = BaselineRef(
        path=baseline_path,
        evaluated_at=_evaluated_at(baseline_report.run),
        run=b_run.model_copy(update={"settings": None}),
    )
    retired = retired_reasons(current_report)
    removed = _one_side(pairing.baseline_by_id, pairing.only_in_baseline, retired)
    removed += _left_scoring(pairing)
    comparison = Comparison(
        baseline=ref,
        comparable=False,
        differences=describe_differences(b_run, c_run, pairing.baseline_by_id, c_all)
        + _pairing_differences(pairing),
        paired_cases=0,
        metrics={},
        cases=changes,
        stages=_stage_deltas(baseline_report.stages, current_report.stages),
        removed_cases=removed,
        added_cases=_one_side(c_all, changes.only_in_current, {}),
        k=pairing.k,
        notes=pairing.notes,
        baseline_scored=sum(1 for c in baseline_report.cases if _counted(c)),
    )
    before, after = scored_figures(pairing.baseline, pairing.current)
    if not before and not abstentions(pairing)[0]:
        return comparison
    return _with_statistics(comparison, pairing, baseline_report, current_report, seed, alpha)


def _counted(case: CaseRecord) -> bool:
    """A case that counts for the floor of a check: scored, or a no-answer case that ran."""
    return case.scores.metrics is not None or (
        case.case.expect_no_answer and case.outcome.abstained is not None
    )


def _pairing_differences(pairing: Pairing) -> list[str]:
    """The pairing's own findings in words: renamed and changed cases."""
    out = []
    if pairing.renamed:
        shown = ", ".join(f"{r.baseline_id} -> {r.id}" for r in pairing.renamed[:10])
        more = f", … ({len(pairing.renamed) - 10} more)" if len(pairing.renamed) > 10 else ""
        out.append(f"golden set: {len(pairing.renamed)} case(s) renamed, paired by content ({shown}{more})")
    for changed in pairing.changed:
        out.append(f"case {changed.id}: {changed.reason} (left out of the pairing)")
    return out


def _left_scoring(pairing: Pairing) -> list[CaseFigures]:
    """The cases the baseline scored that this run cannot, as removals: the baseline's figures, whether
    the case was hard there, why it left and the way back."""
    out = _one_side(pairing.baseline_by_id, sorted(pairing.left_scoring), {})
    return [
        c.model_copy(update={"left_scoring": pairing.left_scoring[c.id], "way_back": WAY_BACK}) for c in out
    ]


def abstentions(pairing: Pairing) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """The paired no-answer cases (ran on both sides), and whether each abstained before and now (1 or 0)."""
    ids = [
        i
        for i in pairing.paired
        if pairing.baseline[i].case.expect_no_answer
        and pairing.current[i].case.expect_no_answer
        and pairing.baseline[i].outcome.abstained is not None
        and pairing.current[i].outcome.abstained is not None
    ]
    before = {i: float(bool(pairing.baseline[i].outcome.abstained)) for i in ids}
    after = {i: float(bool(pairing.current[i].outcome.abstained)) for i in ids}
    return ids, before, after


def _with_statistics(
    comparison: Comparison,
    pairing: Pairing,
    baseline_report: Report,
    current_report: Report,
    seed: int,
    alpha: float,
) -> Comparison:
    """A copy of `comparison` (something paired) with its statistics: the paired rows (also on the
    condensed lists, per golden-set part and per segment), the paired abstention, the changed cases with
    their details, the unjudged account, the composition and the budget."""
    b_cases, c_cases = pairing.baseline, pairing.current
    before, after = scored_figures(b_cases, c_cases)
    scored = list(before)
    rows = _paired_rows(before, after, seed, alpha)
    no_answer, abstained_before, abstained_after = abstentions(pairing)
    if no_answer:
        rows["correctAbstention"] = _abstention_row(abstained_before, abstained_after, seed, alpha)
    changes = _classify(comparison.cases, b_cases, c_cases, before, after)
    changes.abstention_broken = [i for i in no_answer if abstained_before[i] > abstained_after[i]]
    changes.abstention_fixed = [i for i in no_answer if abstained_before[i] < abstained_after[i]]
    details, account = _case_details(b_cases, c_cases, scored, changes)
    regressions = changes.broken + [d.id for d in changes.worsened]
    judged = [j for j in (c_cases[i].scores.judged for i in dict.fromkeys(regressions)) if j is not None]
    return comparison.model_copy(
        update={
            "comparable": True,
            "cases": _unverified(changes, details),
            "paired_cases": len(scored),
            "paired_no_answer": len(no_answer),
            "metrics": rows,
            "case_details": details,
            "unjudged": account,
            "condensed_metrics": _condensed_rows(b_cases, c_cases, scored, seed, alpha),
            "judged_of_regressions": fmean(judged) if judged else None,
            "by_set": _by_set(before, after, c_cases, seed, alpha),
            "composition": _composition(baseline_report, current_report, rows),
            "budget": _budget(baseline_report, current_report),
            "segments": segment_comparisons(before, after, c_cases, seed, alpha),
        }
    )


def _abstention_row(
    before: dict[str, float], after: dict[str, float], seed: int, alpha: float
) -> MetricComparison:
    """CorrectAbstention over the paired no-answer cases (1 abstained, 0 answered), tested with the same
    paired sign-flip test as the ranking measures; a family of its own (its cases are not the ranking
    cases), so its adjusted p is its raw p."""
    ids = sorted(before)
    diffs = [after[i] - before[i] for i in ids]
    result = stats.max_t({"correctAbstention": diffs}, seed, alpha)["correctAbstention"]
    return MetricComparison(
        baseline=fmean(before[i] for i in ids),
        current=fmean(after[i] for i in ids),
        delta=fmean(diffs),
        ci95=stats.bootstrap_ci(diffs, seed=seed),
        p_value=result.p_value,
        p_adjusted=result.p_adjusted,
        adjustment="none (tested alone, over the no-answer cases)",
        exact=result.exact,
        p_error=result.error,
        near_alpha=result.near(alpha),
        significant=result.p_adjusted < alpha,
    )


def scored_figures(b_cases: dict[str, CaseRecord], c_cases: dict[str, CaseRecord]) -> tuple[Figures, Figures]:
    """The figures of the paired cases scored on both sides, before and after, in case id order."""
    paired = sorted(set(b_cases) & set(c_cases))
    before: Figures = {}
    after: Figures = {}
    for i in paired:
        b_metrics, c_metrics = b_cases[i].scores.metrics, c_cases[i].scores.metrics
        if b_metrics and c_metrics:
            before[i], after[i] = b_metrics, c_metrics
    return before, after


def _condensed_rows(
    b_cases: dict[str, CaseRecord], c_cases: dict[str, CaseRecord], scored: list[str], seed: int, alpha: float
) -> dict[str, MetricComparison]:
    """The paired statistics on the condensed lists, over the scored cases that have them on both sides."""
    both = [i for i in scored if b_cases[i].scores.condensed and c_cases[i].scores.condensed]
    return _paired_rows(
        {i: b_cases[i].scores.condensed or {} for i in both},
        {i: c_cases[i].scores.condensed or {} for i in both},
        seed,
        alpha,
        measures.RANKING,
    )


def _classify(
    one_sided: CaseChanges,
    b_cases: dict[str, CaseRecord],
    c_cases: dict[str, CaseRecord],
    before: Figures,
    after: Figures,
) -> CaseChanges:
    """`one_sided` (the cases of one run only) with the fixed and broken cases (hit 0 -> 1, 1 -> 0), the
    breaks by relabelling, and the cases whose nDCG improved or worsened, over the paired scored cases
    `before` / `after`."""
    scored = list(before)
    fixed, broken = stats.fixed_and_broken(
        {i: float(before[i]["hitRate"]) for i in scored}, {i: float(after[i]["hitRate"]) for i in scored}
    )
    improved, worsened = stats.changed_by(
        {i: float(before[i]["ndcg"]) for i in scored}, {i: float(after[i]["ndcg"]) for i in scored}
    )
    return one_sided.model_copy(
        update={
            "fixed": fixed,
            "broken": broken,
            "broken_by_relabelling": [i for i in broken if not _hit_still_judged(b_cases[i], c_cases[i])],
            "improved": [CaseDelta(id=i, delta=d) for i, d in improved],
            "worsened": [CaseDelta(id=i, delta=d) for i, d in worsened],
        }
    )


def _unverified(changes: CaseChanges, details: dict[str, CaseDetail]) -> CaseChanges:
    """`changes` with its broken and worsened cases sorted into those unjudged documents may explain
    (`unverified`) and those judged too thinly to tell (`thinly_judged`)."""
    regressions = changes.broken + [d.id for d in changes.worsened]
    return changes.model_copy(
        update={
            "unverified": sorted(
                {i for i in regressions if not details[i].verified and not thinly_judged(details[i])}
            ),
            "thinly_judged": sorted({i for i in regressions if thinly_judged(details[i])}),
        }
    )


def _case_details(
    b_cases: dict[str, CaseRecord], c_cases: dict[str, CaseRecord], scored: list[str], changes: CaseChanges
) -> tuple[dict[str, CaseDetail], UnjudgedAccount]:
    """The detail of every fixed, broken and worsened case, and the account of new unjudged documents over
    every paired scored case."""
    new_total = new_unjudged_total = 0
    new_by_case: dict[str, tuple[list[str], list[str]]] = {}
    for i in scored:
        new, unjudged = new_in_top_k(b_cases[i], c_cases[i])
        new_by_case[i] = (new, unjudged)
        new_total += len(new)
        new_unjudged_total += len(unjudged)
    details: dict[str, CaseDetail] = {}
    for i, metric in [(i, "hitRate") for i in changes.fixed + changes.broken] + [
        (d.id, "ndcg") for d in changes.worsened
    ]:
        if i in details:
            continue
        new, unjudged = new_by_case[i]
        why = unverified_reason(b_cases[i], c_cases[i], metric, unjudged)
        details[i] = CaseDetail(
            query=c_cases[i].case.query,
            before=_top(b_cases[i]),
            now=_top(c_cases[i]),
            before_fused=_top_fused(b_cases[i]),
            now_fused=_top_fused(c_cases[i]),
            new_in_top_k=new,
            new_unjudged=unjudged,
            verified=why is None,
            why=why or "",
        )
    account = UnjudgedAccount(
        new_in_top_k=new_total,
        new_unjudged=new_unjudged_total,
        headline=f"{new_unjudged_total} of the {new_total} new top-K documents are unjudged",
    )
    return details, account


def thinly_judged(detail: CaseDetail) -> bool:
    """A regression whose top K is judged too thinly to verify (`unverified_reason`'s "cannot tell")."""
    return detail.why.startswith(CANNOT_TELL)


def _hit_still_judged(before: CaseRecord, now: CaseRecord) -> bool:
    """Whether a broken case's baseline hit rested on judged documents: some document the baseline matched
    in its top K is still judged relevant (grade > 0) by the current golden set. When none is, the labels
    moved, not the chain."""
    k = before.resolved.top_k or len(before.outcome.ranked_documents)
    hits = {match_key(d, before.resolved.match_on) for d in before.outcome.ranked_documents[:k] if d.matched}
    return any(now.resolved.expected.get(key, 0.0) > 0 for key in hits) or not hits


def case_failed(case: CaseRecord) -> bool:
    """The failed-case rule of the summary: an error, or Recall@K < 1 on a scored case."""
    if case.outcome.status == "failed" or case.outcome.error is not None:
        return True
    return case.scores.metrics is not None and float(case.scores.metrics.get("recall", 1.0)) < 1.0


def case_hard(case: CaseRecord) -> bool:
    """A hard case: failed (`case_failed`), or scored with nDCG@K < 1 (its relevant documents not ranked
    ideally). A no-answer case is hard when it did not abstain."""
    if case_failed(case):
        return True
    if case.scores.metrics is not None:
        return float(case.scores.metrics.get("ndcg", 1.0)) < 1.0 - 1e-12
    return case.case.expect_no_answer and case.outcome.abstained is False


def _one_side(cases: dict[str, CaseRecord], ids: list[str], retired: dict[str, str]) -> list[CaseFigures]:
    """The cases `ids` of one run with their figures, failure and retirement reason."""
    out = []
    for i in ids:
        case = cases[i]
        figures = case.scores.metrics
        out.append(
            CaseFigures(
                id=i,
                set=case.case.case_set,
                risk=case.case.risk,
                status=case.outcome.status,
                metrics={m: float(figures[m]) for m in measures.GATED if m in figures} if figures else None,
                failed=case_failed(case),
                hard=case_hard(case),
                retired_reason=retired.get(i),
            )
        )
    return out


def retired_reasons(report: Report) -> dict[str, str]:
    """The golden set's retirements as the report records them: {case id: reason}."""
    return {r["id"]: r["reason"] for r in report.run.retired if "id" in r and "reason" in r}


def _composition(
    baseline: Report, current: Report, rows: dict[str, MetricComparison]
) -> dict[str, CompositionRow]:
    """Per gated measure, the summaries' figures (every scored case) beside the paired figures (`rows`), and
    the part of the change the added and removed cases explain (`CompositionRow`)."""
    out: dict[str, CompositionRow] = {}
    for name in measures.GATED:
        row = rows.get(name)
        b_all, c_all = summary_mean(baseline.summary, name), summary_mean(current.summary, name)
        b_common = row.baseline if row else None
        c_common = row.current if row else None
        explained = None
        if b_all is not None and c_all is not None and b_common is not None and c_common is not None:
            explained = (c_all - b_all) - (c_common - b_common)
        out[name] = CompositionRow(
            baseline_all=b_all,
            current_all=c_all,
            baseline_common=b_common,
            current_common=c_common,
            composition=explained,
        )
    return out


def summary_mean(summary: Summary | None, key: str) -> float | None:
    """The summary's macro mean of the measure with JSON key `key` (`hitRate` is `Summary.hit_rate`), None
    without a summary or a figure."""
    return summary.figure(key) if summary is not None else None


def _budget(baseline: Report, current: Report) -> dict[str, BeforeAfter]:
    """The cost of each run beside the other: p95 single-query latency (ms), duplicate rate, and the mean
    context characters, candidates and model calls per case (`Summary.budget`)."""

    def figures(report: Report) -> dict[str, float | None]:
        s = report.summary
        if s is None:
            return {}
        return {
            "p95Ms": (s.latency_ms or {}).get("p95"),
            "duplicateRate": s.figure("duplicateRate"),
            "contextChars": s.budget.get("contextChars"),
            "candidates": s.budget.get("candidates"),
            "modelCalls": s.budget.get("modelCalls"),
        }

    b, c = figures(baseline), figures(current)
    return {key: BeforeAfter(baseline=b.get(key), current=c.get(key)) for key in BUDGET_KEYS}


def _by_set(
    before: Figures,
    after: Figures,
    c_cases: dict[str, CaseRecord],
    seed: int,
    alpha: float,
) -> dict[str, dict[str, MetricComparison]]:
    """The paired statistics of each golden-set part, when the paired cases hold more than one."""
    parts: dict[str, list[str]] = {}
    for i in sorted(before):
        parts.setdefault(c_cases[i].case.case_set, []).append(i)
    if len(parts) < 2:
        return {}
    return {
        name: _paired_rows({i: before[i] for i in ids}, {i: after[i] for i in ids}, seed, alpha)
        for name, ids in sorted(parts.items())
    }


def segment_comparisons(
    before: Figures,
    after: Figures,
    c_cases: dict[str, CaseRecord],
    seed: int,
    alpha: float,
) -> list[SegmentComparison]:
    """Per segment of the paired scored cases (`run.segments.members`: the report's own segments, each
    tag, knowledge tag, risk, golden-set part when both exist, query language, origin and literalness
    band) and compared measure: the paired difference over the segment's paired cases and its sign-flip
    p-value. Per gated measure, the p-values of the segments with at least `MIN_TESTED_SEGMENT` paired
    cases are Holm-adjusted together (significant: pHolm < alpha); smaller segments and the measures the
    gate does not check are shown, not tested."""
    groups = members([c_cases[i] for i in sorted(before)])
    out: list[SegmentComparison] = []
    for name in measures.COMPARED:
        rows = []
        for (kind, segment), group in groups.items():
            ids = [c.case.id for c in group]
            b = [float(before[i][name]) for i in ids]
            a = [float(after[i][name]) for i in ids]
            diffs = [x - y for x, y in zip(a, b, strict=True)]
            rows.append(
                SegmentComparison(
                    kind=kind,
                    name=segment,
                    metric=name,
                    paired_cases=len(ids),
                    baseline=fmean(b),
                    current=fmean(a),
                    delta=fmean(diffs),
                    p_value=stats.sign_flip_p_value(diffs, seed=seed),
                )
            )
        if name in measures.GATED:
            tested = [r for r in rows if r.paired_cases >= MIN_TESTED_SEGMENT]
            for row, p_holm in zip(tested, stats.holm([r.p_value for r in tested]), strict=True):
                row.p_holm = p_holm
                row.significant = p_holm is not None and p_holm < alpha
        out.extend(rows)
    return out


def _paired_rows(
    before_by_case: Figures,
    after_by_case: Figures,
    seed: int,
    alpha: float,
    names: tuple[str, ...] | None = None,
) -> dict[str, MetricComparison]:
    """Per measure over the paired cases: the means, the mean difference with its bootstrap CI and the
    sign-flip p-value. The measures the gate checks (`measures.GATED`) are tested together
    (`stats.max_t`: exact up to 20 non-zero pairs, Westfall-Young step-down max-T over their sign flips):
    their adjusted p decides `significant` (< alpha). The other measures are shown with their raw p, not
    tested (no adjusted p, never significant)."""
    ids = sorted(before_by_case)
    rows: dict[str, MetricComparison] = {}
    if not ids:
        return rows
    names = measures.COMPARED if names is None else names
    diffs = {
        name: [float(after_by_case[i][name]) - float(before_by_case[i][name]) for i in ids] for name in names
    }
    family = stats.max_t({name: diffs[name] for name in names if name in measures.GATED}, seed, alpha)
    for name in names:
        tested = name in family
        result = family[name] if tested else stats.max_t({name: diffs[name]}, seed, alpha)[name]
        rows[name] = MetricComparison(
            baseline=fmean(float(before_by_case[i][name]) for i in ids),
            current=fmean(float(after_by_case[i][name]) for i in ids),
            delta=fmean(diffs[name]),
            ci95=stats.bootstrap_ci(diffs[name], seed=seed),
            p_value=result.p_value,
            p_adjusted=result.p_adjusted if tested else None,
            adjustment=stats.MAX_T if tested else None,
            exact=result.exact,
            p_error=result.error,
            near_alpha=tested and result.near(alpha),
            significant=tested and result.p_adjusted < alpha,
        )
    return rows


def _top_keys(case: CaseRecord) -> list[str]:
    """The case's top K at its matching level (docId, chunkId or source of each ranked document)."""
    k = case.resolved.top_k or len(case.outcome.ranked_documents)
    return [match_key(d, case.resolved.match_on) for d in case.outcome.ranked_documents[:k]]


def new_in_top_k(before: CaseRecord, now: CaseRecord) -> tuple[list[str], list[str]]:
    """The ids the change brought into a case's top K (in the current top K, not in the baseline's; each
    once, in rank order), and those of them that carry no judgment in the current run: its `unjudged`
    list, or, for a report written before Judged@K, the ids outside `expected` and `forbiddenDocIds`."""
    old = set(_top_keys(before))
    new: list[str] = []
    for key in _top_keys(now):
        if key not in old and key not in new:
            new.append(key)
    if "unjudged" in now.scores.model_fields_set:
        unjudged = set(now.scores.unjudged)
    else:
        judged = set(now.resolved.expected) | set(now.case.forbidden_doc_ids)
        unjudged = {key for key in new if key not in judged}
    return new, [key for key in new if key in unjudged]


def unverified_reason(
    before: CaseRecord, now: CaseRecord, metric: str, new_unjudged: list[str]
) -> str | None:
    """Why a broken (metric hitRate) or worsened (nDCG) case is not a verified regression, or None.

    The rule: a drop is unverified when the change brought unjudged documents into the top K and the
    condensed list (unjudged documents removed) did not drop: what pushed the judged relevant documents
    down is documents nobody has judged, which may be relevant. Without condensed figures on both sides (a
    report from before them) any new unjudged document makes the drop unverified.

    A case whose top K is judged too thinly (Judged@K < `JUDGED_FLOOR`) is not called unverified: its
    condensed list keeps the relevant documents near the top whatever the chain does, so it cannot show a
    drop; the reason starts "cannot tell" and names the documents to judge (`thinly_judged`)."""
    if not new_unjudged:
        return None
    b_cond, c_cond = before.scores.condensed, now.scores.condensed
    shown = ", ".join(new_unjudged)
    judged = now.scores.judged
    if judged is not None and judged < JUDGED_FLOOR:
        return (
            f"{CANNOT_TELL}: Judged@K {judged:.2f} < {JUDGED_FLOOR}, too few judgments for the condensed "
            f"list to show a drop; judge the {len(new_unjudged)} unjudged new document(s) in the top K "
            f"({shown})"
        )
    if b_cond is not None and c_cond is not None and metric in b_cond and metric in c_cond:
        if float(c_cond[metric]) < float(b_cond[metric]) - 1e-12:
            return None
        return (
            f"unverified: {len(new_unjudged)} unjudged new document(s) in the top K ({shown}); "
            f"with them removed {metric} {float(b_cond[metric]):.3f} -> {float(c_cond[metric]):.3f}"
        )
    return f"unverified: {len(new_unjudged)} unjudged new document(s) in the top K ({shown})"


def _top(case: CaseRecord, n: int = 3) -> list[str]:
    return [d.doc_id for d in case.outcome.ranked_documents[:n]]


def _top_fused(case: CaseRecord, n: int = 3) -> list[float | None]:
    """The fused score of each of `_top`'s documents (the score that decides the order; None when the
    report has none)."""
    return [d.scores.get("fused") for d in case.outcome.ranked_documents[:n]]


def _evaluated_at(run: RunInfo) -> str | None:
    return run.evaluated_at or run.started_at


def fingerprint_of(run: RunInfo) -> RunFingerprint:
    """The fingerprint a report's `run` carries beside its header, read off its fields (the fingerprint's
    keys a `RunInfo` does not declare, `settings`, `settingsSha256` and `embedder`, are among its extra
    fields). A key the run does not hold stays unset (`model_fields_set`): a report of an older Sieve."""
    return RunFingerprint.model_validate(run, from_attributes=True)


def flatten(node: JsonValue, prefix: str) -> dict[str, JsonValue]:
    """{"a": {"b": 1}} with prefix "rag" -> {"rag.a.b": 1}; lists and empty dicts are leaves."""
    if isinstance(node, dict) and node:
        out: dict[str, JsonValue] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: node}


class _Unset:
    """A setting one of the two runs does not have."""


_UNSET = _Unset()


def _show(value: JsonValue | _Unset) -> str:
    """A setting's value as JSON (strings quoted, so `"query: "` shows its space), or (unset)."""
    return "(unset)" if isinstance(value, _Unset) else json.dumps(value, ensure_ascii=False)


def describe_differences(
    b_run: RunFingerprint,
    c_run: RunFingerprint,
    b_cases: dict[str, CaseRecord] | None = None,
    c_cases: dict[str, CaseRecord] | None = None,
) -> list[str]:
    """What changed between two runs, in words, from their fingerprints: each changed setting of the
    fingerprinted sections (rag.models, rag.ingest, rag.store, rag.retrieval, rag.chain:
    `rag.models.query_prompt: null -> "query: "`), the embedder, the corpus, the golden set (cases added,
    removed, changed), K, asOf, nDCG's gain and the code version. A section only one report fingerprints (the
    other report's Sieve did not record it) is named once, as unknown, rather than key by key."""
    out = _settings_differences(b_run, c_run)
    if b_run.embedder is not None and b_run.embedder != c_run.embedder:
        out.append(f"embedder: {_embedder(b_run.embedder)} -> {_embedder(c_run.embedder)}")
    b_corpus, c_corpus = b_run.corpus_fingerprint, c_run.corpus_fingerprint
    if b_corpus is not None and c_corpus is not None and b_corpus.sha256 != c_corpus.sha256:
        nb, nc = b_corpus.chunks, c_corpus.chunks
        out.append(
            f"corpus: {nb} -> {nc} chunks ({nc - nb:+d} net; the chunk ids differ, so chunks were added, "
            f"removed or re-chunked)"
        )
    if b_corpus is not None and c_corpus is not None and b_corpus.scopes_sha256 != c_corpus.scopes_sha256:
        out.append("corpus scopes: the tenant or access of some chunks changed (who may read what)")
    if b_run.golden_set_sha256 and b_run.golden_set_sha256 != c_run.golden_set_sha256:
        out.append("golden set: " + _golden_changes(b_cases or {}, c_cases or {}))
    for label, before, after in (
        ("K", b_run.k, c_run.k),
        ("asOf", b_run.as_of, c_run.as_of),
        ("nDCG gain", b_run.gain, c_run.gain),
        ("code", b_run.code_version, c_run.code_version),
    ):
        if before is not None and before != after:
            out.append(f"{label}: {before} -> {after}")
    return out


def _settings_differences(b_run: RunFingerprint, c_run: RunFingerprint) -> list[str]:
    """Each changed setting of the sections both runs fingerprint, and each section only one does."""
    if "settings" not in b_run.model_fields_set:
        return ["the baseline report has no run fingerprint (written by an older Sieve): settings unknown"]
    out: list[str] = []
    b_settings, c_settings = b_run.settings or {}, c_run.settings or {}
    for section in sorted(set(b_settings) ^ set(c_settings)):
        older = "baseline" if section not in b_settings else "current"
        out.append(f"rag.{section}: not in the {older} report's fingerprint (an older Sieve): unknown")
    before: dict[str, JsonValue] = {}
    after: dict[str, JsonValue] = {}
    for section in set(b_settings) & set(c_settings):
        before.update(flatten(b_settings[section], f"rag.{section}"))
        after.update(flatten(c_settings[section], f"rag.{section}"))
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, _UNSET), after.get(key, _UNSET)
        if old != new:
            out.append(f"{key}: {_show(old)} -> {_show(new)}")
    return out


def _embedder(e: EmbedderIdentity | str | None) -> str:
    if not isinstance(e, EmbedderIdentity):
        return str(e)
    return f"{e.name} (dim {e.dimension}, checksum {e.checksum})"


def _golden_changes(b_cases: dict[str, CaseRecord], c_cases: dict[str, CaseRecord]) -> str:
    added = sorted(set(c_cases) - set(b_cases))
    removed = sorted(set(b_cases) - set(c_cases))
    changed = sorted(
        i
        for i in set(b_cases) & set(c_cases)
        if b_cases[i].case.case_sha256 and b_cases[i].case.case_sha256 != c_cases[i].case.case_sha256
    )
    parts = []
    for label, ids in (("added", added), ("removed", removed), ("changed", changed)):
        if ids:
            shown = ", ".join(ids[:10]) + (f", … ({len(ids) - 10} more)" if len(ids) > 10 else "")
            parts.append(f"{len(ids)} case(s) {label} ({shown})")
    return "; ".join(parts) or "the cases' canonical JSON differs"


def _stage_deltas(b_stages: list[StageRow], c_stages: list[StageRow]) -> list[StageDelta]:
    b_by = {s.name: s for s in b_stages}
    rows = []
    for s in c_stages:
        b = b_by.get(s.name)
        rows.append(
            StageDelta(
                name=s.name,
                removed_relevant=BeforeAfter(
                    baseline=b.removed_relevant if b else None, current=s.removed_relevant
                ),
                recall_after=BeforeAfter(
                    baseline=b.after_stage.get("recall") if b else None, current=s.after_stage.get("recall")
                ),
            )
        )
    return rows
