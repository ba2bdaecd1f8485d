"""The report built from a run, without I/O or clock: `measure_report` turns an `Evaluation` (and the run
description, whose timestamps come in) into the report, and `build_report` adds its verdict (comparison,
gate, baseline update) once; the report JSON (`schemaVersion`), case records and the per-stage
table included; the segments and paraphrase groups are computed here, once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from statistics import fmean

from app.access.scope import ADMIN
from app.evaluation.golden.audit.checks import ACL_FILTERED_FINDING, AuditResult, summary_line
from app.evaluation.golden.cases import GoldenCase
from app.evaluation.golden.language import query_language
from app.evaluation.golden.principals import eval_principals, principal_label
from app.evaluation.report.model import (
    AccessSection,
    AclFiltered,
    Audit,
    BaselineUpdate,
    CaseAnalysis,
    CaseBudget,
    CaseMeasures,
    CaseOutcome,
    CaseRecord,
    CaseResolution,
    CaseSpec,
    Comparison,
    EvidenceFigures,
    Gate,
    Loss,
    NoAnswerFigures,
    RankedDocument,
    Report,
    RunInfo,
    StageRow,
    Summary,
    SummaryCounts,
    Sweep,
)
from app.evaluation.run.evidence import STAGE_CHAR_KEYS
from app.evaluation.run.fingerprint import access_matters, case_sha256
from app.evaluation.run.runner import (
    ACL_FILTERED,
    NOT_IN_INDEX,
    NOT_RETRIEVED,
    RANKED_OUT,
    CaseResult,
    Evaluation,
    candidate_positions,
    rank_key,
    ranks_of,
)
from app.evaluation.run.segments import groups, origin_comparison, segments, with_deltas
from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.metrics import rank_ids
from app.settings import AccessSettings

SNIPPET_CHARS = 200


def summary_record(evaluation: Evaluation) -> Summary:
    """Macro averages over the cases with relevant documents; no-answer cases get their own figures."""
    cases = evaluation.cases
    scored = [c for c in cases if c.metrics is not None]
    return Summary.model_validate(
        {
            **_measure_means(scored),
            "cases": len(cases),
            "succeeded": sum(1 for c in cases if c.error is None),
            "failed": sum(1 for c in cases if c.error is not None),
            "scored_cases": len(scored),
            "counts": _counts(scored),
            "k_mixed": evaluation.k_mixed,
            "at_k": {str(k): _means_at(scored, k) for k in evaluation.k_values},
            **_latencies(cases),
            "no_answer": _no_answer(cases),
            "forbidden": {
                "hits": sum(len(c.forbidden_found) for c in cases),
                "cases": sum(1 for c in cases if c.forbidden_found),
            },
            "expected_missing_from_index": sum(len(c.missing_from_index) for c in cases),
            "lost_by": _lost_by(c.lost for c in cases),
            "failed_case_ids": [
                c.case.id
                for c in cases
                if c.error is not None or (c.metrics is not None and c.metrics["recall"] < 1.0)
            ],
            "unscorable_case_ids": [c.case.id for c in cases if c.unscorable is not None],
            "judged": _mean_or_none([c.judged for c in scored if c.judged is not None]),
            "unjudged_in_top_k": sum(len(c.unjudged) for c in scored),
            "condensed": _table_means([c.condensed for c in scored if c.condensed], measures.RANKING),
            "evidence": _evidence_summary(cases),
            "budget": _budget_summary(cases),
        }
    )


def _measure_means(scored: list[CaseResult]) -> dict[str, float | None]:
    """The summary's headline figures: per `HEADLINE` measure, its aggregation (the mean) of the scored
    cases' values, by the measure's key (None when no case is scored)."""
    return _table_means([c.metrics for c in scored if c.metrics is not None], measures.HEADLINE)


def _table_means(tables: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float | None]:
    """Per key, the mean over the case tables that have it (None when none has)."""
    return {key: _mean_or_none([t[key] for t in tables if key in t]) for key in keys}


def _means_at(scored: list[CaseResult], k: int) -> dict[str, float | None]:
    """The `RANKING` means at the extra cut-off `k`."""
    return _table_means([c.at_k[k] for c in scored if k in c.at_k], measures.RANKING)


def _mean_or_none(values: list[float]) -> float | None:
    return fmean(values) if values else None


def _counts(scored: list[CaseResult]) -> SummaryCounts:
    """The counts behind the ratios: scored cases, those with a hit, relevant ids found and expected."""
    return SummaryCounts(
        scored_cases=len(scored),
        hits=sum(1 for c in scored if (c.counts.get("hitCount") or 0) > 0),
        relevant_found=sum(int(c.counts.get("hitCount") or 0) for c in scored),
        relevant_total=sum(int(c.counts.get("expectedCount") or 0) for c in scored),
    )


def _latencies(cases: list[CaseResult]) -> dict[str, dict[str, float] | int | None]:
    """The single-query latency over the timed sample, its size, and the batched run's per-case latency."""
    batch = [c.latency_ms for c in cases if c.latency_ms is not None]
    single = [c.single_latency_ms for c in cases if c.single_latency_ms is not None]
    return {
        "latency_ms": metrics.latency_summary(single) if single else None,
        "latency_sample_cases": len(single),
        "batch_latency_ms": metrics.latency_summary(batch) if batch else None,
    }


def _no_answer(cases: list[CaseResult]) -> NoAnswerFigures:
    """Over the no-answer cases that ran: their count and the shares that abstained and that answered."""
    no_answer = [c for c in cases if c.case.expect_no_answer and c.error is None]
    return NoAnswerFigures(
        cases=len(no_answer),
        correct_abstention_rate=_mean_or_none([1.0 if c.abstained else 0.0 for c in no_answer]),
        false_answer_rate=_mean_or_none([0.0 if c.abstained else 1.0 for c in no_answer]),
    )


def _lost_by(losses: Iterable[list[Loss]]) -> dict[str, int]:
    """How many losses there are at each `where`, sorted by it."""
    lost: dict[str, int] = {}
    for case_losses in losses:
        for item in case_losses:
            lost[item.where] = lost.get(item.where, 0) + 1
    return dict(sorted(lost.items()))


def case_budget(c: CaseResult) -> CaseBudget | None:
    """What one case's answer cost (None when its retrieval failed): `contextChars` = the characters of the
    top K's texts with their attached chunks (what a generator is handed), `candidates` = the candidates
    before the stages, `modelCalls` = texts a model scored for it: the query's embedding (1) plus every
    query-passage pair the cross-encoder scored."""
    result = c.result
    if result is None:
        return None
    chars = sum(len(d.text) + sum(len(a.text) for a in d.attached) for d in result.documents)
    calls = 1 + sum(stage.model_inputs for stage in result.trace.stages)
    return CaseBudget(context_chars=chars, candidates=result.original_count, model_calls=calls)


def _budget_summary(cases: list[CaseResult]) -> dict[str, float]:
    """The mean of each `case_budget` figure over the cases that ran (empty when none did)."""
    budgets = [b for b in (case_budget(c) for c in cases) if b is not None]
    if not budgets:
        return {}
    return {
        "contextChars": fmean(b.context_chars for b in budgets),
        "candidates": fmean(b.candidates for b in budgets),
        "modelCalls": fmean(b.model_calls for b in budgets),
    }


def _evidence_summary(cases: list[CaseResult]) -> EvidenceFigures:
    """Over the cases that name evidence and ran: their count, mean evidenceRecall and evidenceHit, and
    where the evidence chunks of the unanswered ones were lost; `unscorable`: the cases that name evidence
    but none of whose groups the index holds whole (no evidence figure)."""
    tables = [c.evidence for c in cases if c.evidence is not None]
    chars = [t for t in tables if "evidenceCharRecall" in t]
    return EvidenceFigures(
        cases=len(tables),
        evidence_recall=_mean_or_none([t["evidenceRecall"] for t in tables]),
        evidence_hit=_mean_or_none([t["evidenceHit"] for t in tables]),
        char_cases=len(chars),
        evidence_char_recall=_mean_or_none([t["evidenceCharRecall"] for t in chars]),
        char_precision=_mean_or_none([t["charPrecision"] for t in chars]),
        lost_by=_lost_by(c.evidence_lost for c in cases if c.evidence is not None),
        unscorable=[c.case.id for c in cases if c.case.evidence_groups() and not c.evidence_groups],
    )


def stage_table(evaluation: Evaluation) -> list[StageRow]:
    """Per stage, over all cases: removed, removedRelevant, latency, and the averages of Recall/MRR/nDCG of
    the list after that stage (first row: the raw candidates)."""
    ok = [c for c in evaluation.cases if c.result is not None]
    rows = [
        StageRow(
            name="candidates",
            enabled=True,
            skipped=None,
            removed=0,
            removed_relevant=0,
            added=0,
            latency_ms=_mean([c.result.trace.candidates_ms for c in ok]),  # type: ignore[union-attr]
            after_stage=_after(ok, "candidates"),
        )
    ]
    for i, name in enumerate(evaluation.stage_names):
        stats = [c.stage_stats[i] for c in ok if i < len(c.stage_stats)]
        skipped = {s.skipped for s in stats if s.skipped}
        rows.append(
            StageRow(
                name=name,
                enabled=all(s.enabled for s in stats) if stats else True,
                skipped="; ".join(sorted(skipped)) or None,
                removed=sum(s.removed for s in stats),
                removed_relevant=sum(s.removed_relevant for s in stats),
                added=sum(s.added for s in stats),
                latency_ms=_mean([s.latency_ms for s in stats]),
                after_stage=_after(ok, name),
            )
        )
    return rows


def _after(cases: list[CaseResult], stage: str) -> dict[str, float | None]:
    """The `AFTER_STAGE` means of the list after `stage` over the scored cases, and the means of its
    character figures (`evidence.STAGE_CHAR_KEYS`) over the cases that have them (a figure none has is
    left out)."""
    scored = [c for c in cases if c.metrics is not None]
    means = _table_means(
        [c.after_stage[stage] for c in scored if stage in c.after_stage], measures.AFTER_STAGE
    )
    chars = _table_means([c.after_stage[stage] for c in cases if stage in c.after_stage], STAGE_CHAR_KEYS)
    return {**means, **{key: value for key, value in chars.items() if value is not None}}


def _mean(values: list[float]) -> float | None:
    return round(fmean(values), 3) if values else None


def measure_report(
    evaluation: Evaluation,
    run_info: Mapping[str, object],
    sweep: Sweep | None = None,
    audit: AuditResult | None = None,
    access: AccessSettings | None = None,
) -> Report:
    """The measured report of `evaluation`, without I/O or clock (its times come from `evaluation` and
    `run_info`): what the comparison, the gate and the baseline update read, before `build_report` adds
    them. `run_info` is the run description (`session.run_description`); the segments carry no delta yet
    (`build_report` adds them from the comparison); `sweep` and `audit` are the run's (None: not run),
    the audit's per-case content hashes put into the case records' `expectedContent`; `access` the
    rag.access the cases ran under (`access_section`; None: read as the default, access off)."""
    started = datetime.fromtimestamp(evaluation.started_at, UTC).isoformat(timespec="seconds")
    records = [_with_content(case_record(c), audit) for c in evaluation.cases]
    run = RunInfo.model_validate(
        {
            **run_info,
            "startedAt": started,
            "evaluatedAt": run_info.get("evaluatedAt") or started,
            "durationMs": round(evaluation.duration_ms, 1),
            "goldenSet": evaluation.golden.path,
            "datasetVersion": evaluation.golden.dataset_version,
            "k": evaluation.default_k,
            "kValues": list(evaluation.k_values),
            "asOf": evaluation.as_of.isoformat() if evaluation.as_of else run_info.get("asOf"),
            "gain": evaluation.gain,
            "conventions": metrics.conventions(evaluation.gain),
            "retired": [{"id": r.id, "reason": r.reason} for r in evaluation.golden.retired],
        }
    )
    section = access_section(evaluation, records, access or AccessSettings())
    return Report(
        status="ok",
        run=run,
        summary=summary_record(evaluation),
        sweep=sweep,
        audit=_with_acl_filtered(_audit_record(audit), section) if audit is not None else None,
        access=section,
        stages=stage_table(evaluation),
        segments=segments(records),
        origins=origin_comparison(records),
        groups=groups(records),
        candidate_origins=_candidate_origins(evaluation),
        warnings=list(evaluation.warnings),
        cases=records,
    )


def _candidate_origins(evaluation: Evaluation) -> dict[str, int]:
    """How many candidates each search found over the run's cases (dense, bm25, both), summed."""
    origins: dict[str, int] = {}
    for c in evaluation.cases:
        if c.result is not None:
            for k, v in c.result.trace.candidate_origins.items():
                origins[k] = origins.get(k, 0) + v
    return origins


def access_section(
    evaluation: Evaluation, records: list[CaseRecord], access: AccessSettings
) -> AccessSection | None:
    """The report's `access`: None when rag.access cannot move a result (`fingerprint.access_matters`)
    and no case ran as a principal; else the settings' scopes, the number of cases run as each principal
    (`(unscoped)` for none), every case's leaks, the cases with ACL_FILTERED losses and the leak probe."""
    ran_as = [c.principal for c in evaluation.cases]
    if not access_matters(access) and all(p is None for p in ran_as):
        return None
    by_principal: dict[str, int] = {}
    for principal in ran_as:
        label = principal_label(principal)
        by_principal[label] = by_principal.get(label, 0) + 1
    scopes = {name: p.describe() for name, p in eval_principals(access).items()}
    if any(p is not None and p.admin for p in ran_as):
        scopes.setdefault(ADMIN.name, ADMIN.describe())
    filtered = [
        AclFiltered(case=r.case.id, principal=r.resolved.run_as or "", ids=ids)
        for r in records
        if (ids := [loss.id for loss in r.analysis.lost if loss.where == ACL_FILTERED])
    ]
    return AccessSection(
        enabled=access.enabled,
        default_principal=access.eval_default_principal if access.enabled else None,
        principals=scopes,
        cases_by_principal=dict(sorted(by_principal.items())),
        leaks=[leak for c in evaluation.cases for leak in c.leaks],
        acl_filtered=filtered,
        probe=evaluation.probe,
    )


def _with_acl_filtered(audit: Audit, section: AccessSection | None) -> Audit:
    """`audit` with the run's ACL_FILTERED cases as a finding, when some case ran as a principal (without
    one, the audit is the golden set's alone, as `sieve golden check` reports it)."""
    if section is None or not audit.ran or not _some_case_scoped(section):
        return audit
    audit.acl_filtered = list(section.acl_filtered)
    audit.findings = {**audit.findings, ACL_FILTERED_FINDING: len(section.acl_filtered)}
    audit.summary = summary_line(audit)
    return audit


def _some_case_scoped(section: AccessSection) -> bool:
    return any(name != principal_label(None) for name in section.cases_by_principal)


def _audit_record(audit: AuditResult) -> Audit:
    """The report's `audit`: the audit without its per-case content hashes (the case records carry them)."""
    return Audit(**{f.name: getattr(audit, f.name) for f in fields(Audit)})


def _with_content(record: CaseRecord, audit: AuditResult | None) -> CaseRecord:
    """`record` with its expected documents' content hashes from `audit` (the next audit remaps stale ids
    with them); as it is without an audit."""
    if audit is None:
        return record
    content = dict(audit.expected_content.get(record.case.id, {}))
    return record.model_copy(
        update={"resolved": record.resolved.model_copy(update={"expected_content": content})}
    )


@dataclass(frozen=True)
class Verdict:
    """What is judged of a measured report: its comparison with the baseline (None: no baseline, for
    `baseline_note`), the gate's record and whether the run replaces the last passing baseline."""

    comparison: Comparison | None
    baseline_note: str | None
    gate: Gate
    baseline_update: BaselineUpdate


def build_report(measured: Report, verdict: Verdict) -> Report:
    """The finished report: the measured parts (`measure_report`) with the verdict, built once; nothing is
    set on it afterwards."""
    return Report(
        status=measured.status,
        run=measured.run,
        summary=measured.summary,
        comparison=verdict.comparison,
        baseline_note=verdict.baseline_note,
        gate=verdict.gate,
        baseline_update=verdict.baseline_update,
        sweep=measured.sweep,
        audit=measured.audit,
        access=measured.access,
        stages=measured.stages,
        segments=with_deltas(measured.segments, verdict.comparison),
        origins=measured.origins,
        groups=measured.groups,
        candidate_origins=measured.candidate_origins,
        warnings=measured.warnings,
        cases=measured.cases,
    )


def invalid_report(golden_path: str, error: str, run_info: Mapping[str, object], started_at: str) -> Report:
    """The report of a run that could not start (the golden set is broken): it says why nothing ran."""
    return Report(
        status="invalid",
        error=error,
        run=RunInfo.model_validate({**run_info, "goldenSet": golden_path, "startedAt": started_at}),
        gate=Gate(passed=False),
    )


def ranked_documents(c: CaseResult) -> list[RankedDocument]:
    """The case's final ranking as the report shows it: each document with its scores, its ranks in the
    candidate lists, whether it matched (first occurrence of a relevant id) and why (relevant with its grade,
    a duplicate, FORBIDDEN, judged not relevant, unjudged)."""
    case = c.case
    docs = c.result.documents if c.result else []
    relevant = metrics.relevant_ids(c.relevance)
    positions = candidate_positions(c.result.trace) if c.result else {}
    seen: set[str] = set()
    ranked = []
    for rank, d in enumerate(docs, start=1):
        # the ids the rank returns at the case's level: at chunk level also its attached chunks
        ids = rank_ids(rank_key(d, c.key))
        hits = [i for i in ids if i in relevant]
        key = next((i for i in hits if i not in seen), hits[0] if hits else ids[0])
        if d.doc_id in case.forbidden_doc_ids:
            reason = "FORBIDDEN"
        elif key in relevant and key in seen:
            reason = "duplicate of a higher-ranked hit"
        elif key in relevant:
            grade = c.relevance.get(key, 1.0)
            reason = (
                f"relevant (grade {grade:g})"
                if key == ids[0]
                else f"relevant (grade {grade:g}, attached {key})"
            )
        elif key in c.judged_ids:
            reason = "judged not relevant"
        else:
            reason = "unjudged"
        ranked.append(
            RankedDocument(
                rank=rank,
                doc_id=d.doc_id,
                chunk_id=d.chunk_id,
                source=d.source,
                title=d.title,
                scores={k: round(v, 6) for k, v in d.scores.items()},
                ranks=ranks_of(positions, d.chunk_id),
                origin=sorted(d.origin),
                matched=key in relevant and key not in seen,
                reason=reason,
                snippet=d.text[:SNIPPET_CHARS],
                attached=[a.chunk_id for a in d.attached],
            )
        )
        seen.update(ids)
    return ranked


def case_spec(case: GoldenCase) -> CaseSpec:
    """What the golden case says of itself, as the report records it."""
    return CaseSpec(
        id=case.id,
        query=case.query,
        knowledge_tag=case.knowledge_tag,
        note=case.note,
        tags=case.tags,
        group=case.group,
        language=query_language(case.query),
        origin=case.origin,
        generator=case.generator,
        passage_chunk_id=case.passage_chunk_id,
        literalness=case.literalness,
        case_sha256=case_sha256(case),
        forbidden_doc_ids=case.forbidden_doc_ids,
        expect_no_answer=case.expect_no_answer,
        case_set=case.case_set,
        risk=case.risk,
        owner=case.owner,
        rationale=case.rationale,
        principal=case.principal,
    )


def case_resolution(c: CaseResult) -> CaseResolution:
    """The case as the run resolved it against the index."""
    return CaseResolution(
        top_k=c.k,
        match_on=c.key,
        expected=dict(c.relevance),
        missing_from_index=c.missing_from_index,
        evidence_groups=c.evidence_groups,
        expanded_sources=c.expanded_sources,
        as_of=c.as_of.isoformat() if c.as_of else None,
        unscorable=c.unscorable,
        alternatives=[dict(a) for a in c.alternatives],
        run_as=c.principal.name if c.principal is not None else None,
    )


def case_outcome(c: CaseResult) -> CaseOutcome:
    """What the chain did for the case: its result's counts, latencies, trace id, ranking and cost."""
    result = c.result
    return CaseOutcome(
        status=c.status,
        error=c.error,
        original_count=result.original_count if result else None,
        final_count=len(result.documents) if result else None,
        abstained=c.abstained if c.case.expect_no_answer else None,
        latency_ms=c.latency_ms,
        single_latency_ms=c.single_latency_ms,
        fallback_used=result.fallback_used if result else None,
        trace_id=c.trace_id,
        ranked_documents=ranked_documents(c),
        budget=case_budget(c),
    )


def case_measures(c: CaseResult) -> CaseMeasures:
    """The case's scores (`runner.score_ranking`) as the report records them."""
    return CaseMeasures(
        metrics=c.metrics,
        at_k={str(k): {m: v[m] for m in measures.RANKING} for k, v in c.at_k.items()},
        expected_count=c.counts.get("expectedCount", len(metrics.relevant_ids(c.relevance))),
        hit_count=c.counts.get("hitCount"),
        first_hit_rank=c.counts.get("firstHitRank"),
        forbidden_found=c.forbidden_found,
        judged=c.judged,
        unjudged=list(c.unjudged),
        condensed=c.condensed,
        evidence=c.evidence,
        access_leaks=list(c.leaks) if c.principal is not None else None,
    )


def case_analysis(c: CaseResult) -> CaseAnalysis:
    """The case's trace analysis (`runner.analyse_trace`) as the report records it."""
    return CaseAnalysis(
        filter_stats=list(c.stage_stats),
        after_stage=c.after_stage,
        lost=list(c.lost),
        evidence_lost=list(c.evidence_lost),
    )


def case_record(c: CaseResult) -> CaseRecord:
    """The report's record of one case, composed of its parts: the golden case, the case as resolved
    against the index, the chain's outcome, its scores and its trace analysis."""
    return CaseRecord(
        case=case_spec(c.case),
        resolved=case_resolution(c),
        outcome=case_outcome(c),
        scores=case_measures(c),
        analysis=case_analysis(c),
    )


__all__ = [
    "ACL_FILTERED",
    "NOT_IN_INDEX",
    "NOT_RETRIEVED",
    "RANKED_OUT",
    "Verdict",
    "build_report",
    "invalid_report",
    "measure_report",
    "summary_record",
]
