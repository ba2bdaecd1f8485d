"""The report as Markdown, read from the typed `Report`. A report read back from its file
(`Report.model_validate_json`) renders the same.

Text from the golden set, the index or a client (case ids, queries, tags, groups, notes, rationales, document
and chunk ids, sources, titles, snippets, reasons, segment names, error messages) goes through `md_text`
(app/evaluation/report/text.py), once, where it enters the Markdown: `[` and `]` are escaped (and a `(` right
after a `]`), so no link or image is made of it (`[x](javascript:...)` reads `\[x\]\(javascript:...)`); a
`<`, `>` or `&` that could open or close a tag, a comment, an autolink or an entity becomes an entity
(`<script>` reads `&lt;script&gt;`), so nothing becomes HTML in a Markdown viewer; and control characters,
line separators and lone surrogates become visible `\u0000`-style escapes, so the file stays one readable
text in a terminal (`grep` never calls it binary). In table cells `_cell` also escapes `|`."""

from __future__ import annotations

from collections.abc import Iterable

from app.evaluation.compare.comparison import BUDGET_LABELS, SMALL_SAMPLE
from app.evaluation.compare.gate import GATE_RULE
from app.evaluation.compare.pairing import WAY_BACK
from app.evaluation.render.audit import audit_markdown
from app.evaluation.render.lines import origin_line
from app.evaluation.render.tune import sweep_markdown
from app.evaluation.report.model import (
    WORST_CASES,
    AccessSection,
    CaseDetail,
    CaseRecord,
    Comparison,
    EmbedderIdentity,
    Gate,
    Group,
    Loss,
    MetricComparison,
    RankedDocument,
    Ranks,
    Report,
    Segment,
    StageStat,
    Summary,
    worst_cases,
)
from app.evaluation.report.text import md_text
from app.evaluation.run.runner import RANKED_OUT
from app.evaluation.run.segments import SMALL_SEGMENT
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import fmt as _f
from app.evaluation.scoring.measures import fmt_ms as _ms
from app.evaluation.scoring.measures import fmt_p as p_text


def k_label(report: Report) -> str:
    """The report's cut-off label (`measures.k_label`): "@5", or "@K" when cases carry their own topK."""
    return measures.k_label(report.run.k, bool(report.summary and report.summary.k_mixed))


def render_markdown(report: Report, case_detail: bool = False) -> str:
    """The report as Markdown, most telling first: the verdict, the gate, the comparison with the baseline and
    the worst cases; then the summary, the run, the stages, segments, groups, sweep and audit. `case_detail`
    (rag.evaluate.report.case_detail) appends every case's ranking and trace; without it they stay in the
    JSON's `cases`."""
    run = report.run
    lines = [f"# Retrieval evaluation — {run.started_at or ''}", ""]
    if report.status != "ok" or report.summary is None:
        lines += [
            f"**Nothing ran: {md_text(report.error)}**",
            "",
            f"- Golden set: `{run.golden_set}`",
            "",
            "Fix the golden set (the message above names the file, line or case and field) and run again.",
        ]
        return "\n".join(lines) + "\n"
    s = report.summary
    kl = k_label(report)
    lines += verdict_markdown(report, s, kl)
    lines += _gate_markdown(report.gate)
    lines += comparison_markdown(report.comparison, report.baseline_note, kl)
    lines += _worst_markdown(report, s, kl)
    lines += _summary_markdown(s, kl)
    lines += _run_markdown(report, s)
    lines += _stages_markdown(report, s, kl)
    lines += _segments_markdown(report.segments)
    lines += access_markdown(report.access)
    lines += _origin_lines(report)
    lines += _groups_markdown(report.groups)
    lines += sweep_markdown(report.sweep)
    audit = audit_markdown(report.audit)
    if audit:
        lines += audit[1:] if audit[0] == "" else audit
        lines.append("")
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {md_text(w)}" for w in report.warnings] + [""]
    lines += ["## Cases", ""]
    if case_detail:
        for c in report.cases:
            lines += _case_markdown(c, run.as_of)
    else:
        lines += [
            f"Every case's ranking, trace and judgments ({len(report.cases)} cases) are in the JSON "
            "report's `cases`; `rag.evaluate.report.case_detail: true` lists them here.",
            "",
        ]
    lines += ["## Conventions", "", run.conventions or "", ""]
    return "\n".join(lines) + "\n"


def verdict_markdown(report: Report, s: Summary, kl: str) -> list[str]:
    """The first lines: the gate's verdict, the headline figures and the comparison in one sentence."""
    gate = report.gate
    warned = len(gate.warnings)
    verdict = "PASSED" if gate.passed else "FAILED"
    if warned:
        verdict += f" with {warned} warning{'s' if warned != 1 else ''}"
    figures = ", ".join(
        f"{measures.label(key, kl)} {measures.fmt(getattr(s, attr))}"
        for key, attr in (("ndcg", "ndcg"), ("recall", "recall"), ("mrr", "mrr"))
    )
    comp = report.comparison
    if comp is not None and comp.comparable and "ndcg" in comp.metrics:
        row = comp.metrics["ndcg"]
        against = (
            f"nDCG{kl} {row.delta:+.3f} against the baseline (p {measures.fmt_p(row.p_value)}, adjusted "
            f"{measures.fmt_p(row.p_adjusted)}: {'significant' if row.significant else 'not significant'}); "
            f"{len(comp.cases.fixed)} fixed, {len(comp.cases.broken)} broken"
        )
        if comp.cases.abstention_broken:
            against += f", {len(comp.cases.abstention_broken)} no-answer case(s) no longer abstain"
        if comp.unjudged is not None and comp.unjudged.new_unjudged:
            against += f"; {comp.unjudged.headline} (to judge)"
        if comp.removed_cases or comp.added_cases:
            against += f"; {len(comp.removed_cases)} case(s) removed, {len(comp.added_cases)} added"
    elif comp is not None:
        against = "not checked: nothing could be paired with the baseline"
    else:
        against = f"no baseline ({report.baseline_note or 'none'})"
    no_answer = s.no_answer.cases
    unscorable = f", {len(s.unscorable_case_ids)} unscorable" if s.unscorable_case_ids else ""
    lines = [
        f"**Gate {verdict}.** {figures} over {s.scored_cases} scored cases "
        f"({s.cases} in all, {no_answer} no-answer, {s.failed} failed{unscorable}); {against}.",
        "",
    ]
    update = report.baseline_update
    if update is not None:
        lines += [
            ("This run is the new baseline: " if update.promoted else "The baseline stays: ")
            + f"{update.reason}.",
            "",
        ]
    return lines


def _gate_markdown(gate: Gate) -> list[str]:
    out: list[str] = []
    if gate.checks:
        warned = len(gate.warnings)
        out += [
            "## Gate: "
            + ("PASSED" if gate.passed else "FAILED")
            + (f" ({warned} warning{'s' if warned != 1 else ''})" if warned else ""),
            "",
            "| Check | What it holds | Value | Needs | | |",
            "|---|---|---|---|---|---|",
        ]
        for c in gate.checks:
            status = "ok" if c.passed else "WARN" if c.severity == "warn" else "**FAIL**"
            out.append(
                f"| {c.name} | {_cell(c.means, None)} | {_f(c.value)} | {c.op} {c.threshold:g} | {status} | "
                f"{_cell(c.message, 400)} |"
            )
        out += ["", GATE_RULE, ""]
    for note in gate.notes:
        out += [f"- {md_text(note)}"]
    if gate.notes:
        out.append("")
    return out


def comparison_markdown(comp: Comparison | None, baseline_note: str | None, kl: str) -> list[str]:
    """The "Compared with baseline" section (also what `sieve compare` prints under its line)."""
    if comp is None:
        return ["## Compared with baseline", "", f"No comparison: {baseline_note or 'no baseline'}.", ""]
    base = comp.baseline
    kind = f" ({base.kind})" if base.kind else ""
    out = [
        "## Compared with baseline",
        "",
        f"Baseline{kind} `{base.path}`, evaluated {base.evaluated_at or '?'} "
        f"(code {base.run.code_version or '?'}); {comp.paired_cases} paired scored cases"
        + (f", {comp.paired_no_answer} paired no-answer cases" if comp.paired_no_answer else "")
        + ".",
        "",
    ]
    out += [f"- {note}" for note in comp.notes] + ([""] if comp.notes else [])
    if comp.cases.renamed:
        renamed = ", ".join(f"{md_text(r.baseline_id)} → {md_text(r.id)}" for r in comp.cases.renamed)
        out += [f"Renamed, paired by content (same caseSha256): {renamed}.", ""]
    if comp.cases.changed:
        changed = "; ".join(f"{md_text(c.id)}: {c.reason}" for c in comp.cases.changed)
        out += [f"Changed, left out of the pairing: {changed}.", ""]
    if not comp.comparable:
        out += ["**Not checked**: no case could be paired with the baseline; no statistics.", ""]
    elif comp.paired_cases < SMALL_SAMPLE:
        out += [
            f"> Only {comp.paired_cases} paired cases (fewer than {SMALL_SAMPLE}): small differences "
            "cannot be significant here; read the deltas as indications, not findings.",
            "",
        ]
    if comp.metrics:
        out += [
            "Per-case differences (current − baseline): 95% CI by percentile bootstrap (10,000 resamples); "
            "p by the paired sign-flip test (exact up to 20 non-zero pairs, else Monte Carlo ± its standard "
            "error); the gated measures are tested together, p adjusted by Westfall–Young step-down max-T "
            "over the same sign flips; significant = adjusted p < alpha. The other rows are shown, not "
            "tested; CorrectAbstention is over the paired no-answer cases.",
            "",
            *METRIC_HEADER,
        ]
        out += _metric_rows(comp.metrics, kl)
        out.append("")
    out += _by_set_markdown(comp, kl)
    out += _composition_markdown(comp, kl)
    out += _budget_markdown(comp)
    out += _segment_comparison_markdown(comp, kl)
    out += ["What changed between the runs:", ""]
    out += [f"- `{d}`" if d.startswith("rag.") else f"- {md_text(d)}" for d in comp.differences]
    if not comp.differences:
        out.append("- nothing: same settings, embedder, corpus, golden set, K and asOf")
    out.append("")
    out += _unjudged_markdown(comp, kl)
    out += _case_changes_markdown(comp)
    out += _removed_added_markdown(comp, kl)
    out += _stage_deltas_markdown(comp)
    return out


def _unjudged_markdown(comp: Comparison, kl: str) -> list[str]:
    """The unjudged account: how many new top-K documents nobody judged, what that means for the verdict."""
    if comp.unjudged is None:
        return []
    out = [
        f"**{comp.unjudged.headline}.** Unjudged documents count as not relevant in the gate. A broken or "
        "worsened case whose condensed list (unjudged removed) did not drop is marked *unverified*: nobody "
        "has judged what pushed its relevant documents down; one whose top K is judged too thinly for its "
        "condensed list to tell is marked *cannot tell*. Judge the new documents (`sieve golden pool "
        "--report`) to settle both.",
        "",
    ]
    if "ndcg" in comp.condensed_metrics:
        row = comp.condensed_metrics["ndcg"]
        out += [
            f"Condensed lists: nDCG{kl} {_f(row.baseline)} → {_f(row.current)} "
            f"({row.delta:+.3f}, p {p_text(row.p_value)}).",
            "",
        ]
    return out


def _case_changes_markdown(comp: Comparison) -> list[str]:
    """The fixed, broken and worsened cases with their top 3 before and now, then the cases broken by
    relabelling."""
    out: list[str] = []
    cases = comp.cases
    for title, ids in (
        ("Fixed (hit 0 → 1)", cases.fixed),
        ("Broken (hit 1 → 0)", cases.broken),
        ("Worsened (nDCG dropped)", [x.id for x in cases.worsened]),
        ("Abstention broken (abstained → answers)", cases.abstention_broken),
    ):
        if title.startswith("Abstention") and not comp.paired_no_answer:
            continue
        out += [f"{title}: {len(ids)}", ""]
        if ids:
            out += [
                "| Case | Query | Before (top 3, fused score) | Now (top 3, fused score) "
                "| New in top K (unjudged) | Verdict |",
                "|---|---|---|---|---|---|",
            ]
            for i in ids:
                out.append(_detail_row(i, comp.case_details.get(i), fixed=title.startswith("Fixed")))
            out.append("")
    moved = cases.improved[:10] + cases.worsened[:10]
    if moved:
        out += [
            "nDCG changed: "
            + ", ".join(f"{md_text(x.id)} {x.delta:+.3f}" for x in moved)
            + f" ({len(cases.improved)} improved, {len(cases.worsened)} worsened).",
            "",
        ]
    if cases.broken_by_relabelling:
        out += [
            "Broken by relabelling (the baseline's hit is no longer judged relevant; not a regression): "
            f"{_ids(cases.broken_by_relabelling)}.",
            "",
        ]
    return out


def _stage_deltas_markdown(comp: Comparison) -> list[str]:
    """Per stage, the relevant ids it removed and the recall after it, before and now."""
    out: list[str] = []
    if comp.stages:
        out += [
            "| Stage | Removed relevant (before → now) | Recall after stage (before → now) |",
            "|---|---|---|",
        ]
        for st in comp.stages:
            rr, ra = st.removed_relevant, st.recall_after
            out.append(
                f"| {st.name} | {rr.baseline if rr.baseline is not None else 'n/a'} → {rr.current} | "
                f"{_f(ra.baseline)} → {_f(ra.current)} |"
            )
        out.append("")
    return out


METRIC_HEADER = (
    "| Metric | Baseline | Current | Δ | 95% CI | p | p adjusted | How | Significant |",
    "|---|---|---|---|---|---|---|---|---|",
)


def _metric_rows(rows: dict[str, MetricComparison], kl: str) -> list[str]:
    out = []
    for name, row in rows.items():
        low, high = row.ci95 or (None, None)
        how = "exact" if row.exact else f"Monte Carlo ± {row.p_error:.2g}" if row.p_error else "Monte Carlo"
        if row.near_alpha:
            how += ", within its error of alpha"
        tested = row.p_adjusted is not None
        out.append(
            f"| {measures.label(name, kl)} | {_f(row.baseline)} | {_f(row.current)} | {row.delta:+.3f} | "
            f"[{_f(low)}, {_f(high)}] | {p_text(row.p_value)} | {p_text(row.p_adjusted) if tested else '-'} "
            f"| {how} | {('yes' if row.significant else 'no') if tested else 'not tested'} |"
        )
    return out


def _by_set_markdown(comp: Comparison, kl: str) -> list[str]:
    """The paired figures of the core and the incremental set apart (the gate's defaults read the core)."""
    out: list[str] = []
    for name, rows in comp.by_set.items():
        out += [
            f"The {name} set alone{' (the one the gate checks by default)' if name == 'core' else ''}:",
            "",
            *METRIC_HEADER,
            *_metric_rows(rows, kl),
            "",
        ]
    return out


def _composition_markdown(comp: Comparison, kl: str) -> list[str]:
    """Every case beside the paired ones: how much of the change the added and removed cases explain."""
    if not (comp.removed_cases or comp.added_cases) or not comp.composition:
        return []
    out = [
        "Every scored case against the paired ones (the rest of the change comes from the cases added or "
        "removed):",
        "",
        "| Metric | All: baseline → now | Paired: baseline → now | From added/removed cases |",
        "|---|---|---|---|",
    ]
    for name, row in comp.composition.items():
        explained = "n/a" if row.composition is None else f"{row.composition:+.3f}"
        out.append(
            f"| {measures.label(name, kl)} | {_f(row.baseline_all)} → {_f(row.current_all)} | "
            f"{_f(row.baseline_common)} → {_f(row.current_common)} | {explained} |"
        )
    return out + [""]


def _removed_added_markdown(comp: Comparison, kl: str) -> list[str]:
    """The cases only one run has, with their figures in that run."""
    out: list[str] = []
    gone = [c for c in comp.removed_cases if c.left_scoring is None]
    left = [c for c in comp.removed_cases if c.left_scoring is not None]
    for title, cases in (
        ("Removed from the golden set since the baseline (figures of the baseline)", gone),
        ("Left the scoring: in the golden set, scored by the baseline, not now (baseline figures)", left),
        ("Added to the golden set (figures of this run)", comp.added_cases),
    ):
        if not cases:
            continue
        out += [
            f"{title}: {len(cases)}",
            "",
            f"| Case | Set | Risk | nDCG{kl} | Recall{kl} | Failed | Why |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in cases:
            m = c.metrics or {}
            reason = c.retired_reason or c.left_scoring
            if reason is None:
                reason = "-" if title.startswith("Added") else "(no retired reason given)"
            out.append(
                f"| {_cell(c.id, None)} | {c.set} | {c.risk or '-'} | {_f(m.get('ndcg'))} | "
                f"{_f(m.get('recall'))} | {'yes' if c.failed else 'no'} | {_cell(reason)} |"
            )
        out.append("")
    if left:
        out += [f"The way back: {WAY_BACK}.", ""]
    return out


def _budget_markdown(comp: Comparison) -> list[str]:
    """The cost beside the quality: each budget figure before and now, with the ratio."""
    if not comp.budget:
        return []
    out = ["| Budget | Baseline | Current | Ratio |", "|---|---|---|---|"]
    for key, row in comp.budget.items():
        digits = 3 if key == "duplicateRate" else 1
        before, now = row.baseline, row.current
        ratio = f"{now / before:.2f}×" if before and now is not None else "n/a"
        out.append(f"| {BUDGET_LABELS.get(key, key)} | {_f(before, digits)} | {_f(now, digits)} | {ratio} |")
    return out + [""]


def _segment_comparison_markdown(comp: Comparison, kl: str) -> list[str]:
    """The tested segments (10+ paired cases) whose figure moved, nDCG first, with Holm over segments."""
    tested = [r for r in comp.segments if r.p_holm is not None and abs(r.delta) > 1e-12]
    if not tested:
        return []
    out = [
        "Segments of 10+ paired cases that moved (p Holm-adjusted over the segments, per measure):",
        "",
        "| Segment | Metric | Cases | Baseline | Current | Δ | p | p (Holm) | Significant |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in tested:
        out.append(
            f"| {r.kind}:{_cell(r.name)} | {measures.label(r.metric, kl)} | {r.paired_cases} | "
            f"{_f(r.baseline)} | {_f(r.current)} | {r.delta:+.3f} | {p_text(r.p_value)} | "
            f"{p_text(r.p_holm)} | {'yes' if r.significant else 'no'} |"
        )
    return out + [""]


def _detail_row(case_id: str, d: CaseDetail | None, fixed: bool) -> str:
    if d is None:
        return f"| {_cell(case_id, None)} |  | (nothing) | (nothing) | - | - |"
    before = _ids_with_scores(d.before, d.before_fused)
    now = _ids_with_scores(d.now, d.now_fused)
    new_text = f"{len(d.new_in_top_k)} ({len(d.new_unjudged)} unjudged)"
    verdict = "-" if fixed else (d.why or "verified")
    verdict_cell = _cell(verdict, None)  # the verdict names doc ids: never cut
    case = _cell(case_id, None)
    return f"| {case} | {_cell(d.query or '')} | {before} | {now} | {new_text} | {verdict_cell} |"


def _ids_with_scores(ids: list[str], fused: list[float | None]) -> str:
    """`doc-a (0.897), doc-b (0.512)`; a comparison read from a report without fused scores shows "n/a"."""
    scores = list(fused) + [None] * (len(ids) - len(fused))
    return ", ".join(f"{_cell(i, None)} ({_f(f)})" for i, f in zip(ids, scores, strict=False)) or "(nothing)"


def _ranked_text(docs: list[RankedDocument]) -> str:
    """`doc-a (0.897; dense #2, bm25 #1, fused #1), doc-b (0.512)`: full doc ids with their fused scores and
    their ranks in the candidate lists, "(nothing)" for none."""
    return (
        ", ".join(
            f"{_cell(d.doc_id, None)} ({_f(d.scores.get('fused'))}{_prefixed('; ', ranks_text(d.ranks))})"
            for d in docs
        )
        or "(nothing)"
    )


def ranks_text(ranks: Ranks) -> str:
    """`dense #3, bm25 #12, fused #7`: an item's ranks in the candidate lists it was in ("" for none)."""
    listed = (("dense", ranks.dense), ("bm25", ranks.bm25), ("fused", ranks.fused), ("rerank", ranks.rerank))
    return ", ".join(f"{name} #{rank}" for name, rank in listed if rank is not None)


def loss_text(loss: Loss, k: int | None = None) -> str:
    """`RANKED_OUT at dense #3, bm25 #12, fused #7 (K=5)`: where an expected id was lost and its ranks in the
    candidate lists (with `k`, the case's K after a RANKED_OUT)."""
    text = loss.where + _prefixed(" at ", ranks_text(loss.ranks))
    return text + (f" (K={k})" if k is not None and loss.where == RANKED_OUT else "")


def _prefixed(prefix: str, text: str) -> str:
    return prefix + text if text else ""


def _worst_markdown(report: Report, s: Summary, kl: str) -> list[str]:
    lines = ["## Worst cases", ""]
    if s.failed_case_ids:
        lines += [
            f"{len(s.failed_case_ids)} case(s) with recall < 1 or an error: {_ids(s.failed_case_ids)}. "
            f"The worst {WORST_CASES} are below; each document with its fused score (the order) and its "
            "ranks in the candidate lists (dense and BM25 search, after fusion, after rerank).",
            "",
        ]
    worst = worst_cases(report.cases)
    if not worst:
        lines.append("Every scored case found all its expected documents at rank 1.")
    else:
        lines += [
            f"| Case | Query | nDCG{kl} | Expected | Got (top 3, fused score) | Where lost |",
            "|---|---|---|---|---|---|",
        ]
        for c in worst:
            got = _ranked_text(c.outcome.ranked_documents[:3])
            lost = "; ".join(f"{x.id}: {loss_text(x, c.resolved.top_k)}" for x in c.analysis.lost) or "-"
            if c.resolved.unscorable:
                lost = "; ".join(f"{i}: NOT_IN_INDEX" for i in c.resolved.missing_from_index)
            if c.scores.metrics:
                nd = _f(c.scores.metrics["ndcg"])
            elif c.case.expect_no_answer:
                nd = "no answer expected"
            else:
                nd = c.outcome.status
            lines.append(
                f"| {_cell(c.case.id, None)} | {_cell(c.case.query)} | {nd} | "
                f"{_cell(', '.join(c.resolved.expected), None) or '-'} | "
                f"{got} | {_cell(lost or '-', None)} |"
            )
        lines += _risk_lines(worst)
    return lines + [""]


def _risk_lines(cases: list[CaseRecord]) -> list[str]:
    """Risk, owner and rationale of the listed cases that carry any."""
    out = []
    for c in cases:
        parts = [f"risk {c.case.risk}"] if c.case.risk else []
        parts += [f"owner {c.case.owner}"] if c.case.owner else []
        parts += [c.case.rationale] if c.case.rationale else []
        if parts:
            out.append(f"- {_cell(c.case.id, None)}: {_cell('; '.join(parts))}")
    return ["", *out] if out else []


def _summary_markdown(s: Summary, kl: str) -> list[str]:
    lines = ["## Summary", "", "| Metric | Value |", "|---|---|"]
    scored, hits = s.counts.scored_cases, s.counts.hits
    found, total = s.counts.relevant_found, s.counts.relevant_total
    extras = {
        "recall": f" (mean per case; {found} of {total} relevant found)" if total else "",
        "hitRate": f" = {hits}/{scored}" if scored else "",
        "duplicateRate": " (ids and content)",
    }
    for key in measures.HEADLINE:
        lines.append(
            f"| {measures.label(key, kl)} | "
            f"{measures.measure(key).format(s.figure(key))}{extras.get(key, '')} |"
        )
    lat = s.latency_ms or {}
    batch = s.batch_latency_ms or {}
    na = s.no_answer
    na_n = na.cases
    abst = round((na.correct_abstention_rate or 0) * na_n) if na_n else 0
    lines += [
        f"| Latency p50 / p95 / max (single query, {s.latency_sample_cases} cases) | "
        f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {_ms(lat.get('max'))} |",
        f"| Batched run per case p50 / p95 | {_ms(batch.get('p50'))} / {_ms(batch.get('p95'))} |",
        f"| No-answer: CorrectAbstention / FalseAnswerRate | {_f(na.correct_abstention_rate)} "
        f"({abst}/{na_n}) / {_f(na.false_answer_rate)} ({na_n - abst}/{na_n}) |",
        f"| Forbidden documents in top K | {s.forbidden.get('hits', 0)} "
        f"(in {s.forbidden.get('cases', 0)} cases) |",
        f"| Expected ids missing from the index | {s.expected_missing_from_index}{_unscorable_note(s)} |",
    ]
    lines += _judgment_rows(s, kl)
    lines.append("")
    if s.at_k:
        lines += [
            "Several cut-offs from the same ranking (every case cut at the same K):",
            "",
            "| K | " + " | ".join(measures.label(m) for m in measures.RANKING) + " |",
            "|---|" + "---|" * len(measures.RANKING),
        ]
        for k, row in s.at_k.items():
            lines.append(f"| {k} | " + " | ".join(_f(row[m]) for m in measures.RANKING) + " |")
        lines.append("")
    return lines


def _unscorable_note(s: Summary) -> str:
    """What the stale expectations cost: chunk ids are left out of every figure, and a case left with none
    is unscorable."""
    if not s.expected_missing_from_index:
        return ""
    note = " (chunk ids among them are left out of every figure"
    if s.unscorable_case_ids:
        note += f"; unscorable, every expectation stale: {_ids(s.unscorable_case_ids)}"
    return note + ")"


def _judgment_rows(s: Summary, kl: str) -> list[str]:
    """Summary rows for how complete the judgments are (Judged@K, the condensed-list figures) and for the
    evidence chunks; reports without these figures have none of the rows."""
    rows = []
    if s.judged is not None:
        rows.append(
            f"| Judged{kl} (share of the top K with a judgment) | {_f(s.judged)} "
            f"({s.unjudged_in_top_k} unjudged ids in the scored cases' top K) |"
        )
    cond = s.condensed
    if cond.get("ndcg") is not None:
        rows.append(
            f"| Condensed list (unjudged removed): nDCG{kl} / Recall{kl} / MRR | {_f(cond['ndcg'])} / "
            f"{_f(cond.get('recall'))} / {_f(cond.get('mrr'))} |"
        )
    ev = s.evidence
    if ev.cases:
        lost = ", ".join(f"`{k}` {v}" for k, v in ev.lost_by.items()) or "none lost"
        stale = ev.unscorable
        not_scored = f"; not scored, no group whole in the index: {_ids(stale)}" if stale else ""
        rows.append(
            f"| Evidence: EvidenceRecall{kl} / EvidenceHit{kl} ({ev.cases} cases) | "
            f"{_f(ev.evidence_recall)} / {_f(ev.evidence_hit)} ({lost}{not_scored}) |"
        )
    if ev.char_cases:
        rows.append(
            f"| Evidence characters: EvidenceCharRecall{kl} / CharPrecision{kl} ({ev.char_cases} cases; "
            "evidence characters returned / evidence characters, / characters returned) | "
            f"{_f(ev.evidence_char_recall)} / {_f(ev.char_precision)} |"
        )
    return rows


def _run_markdown(report: Report, s: Summary) -> list[str]:
    run = report.run
    k_note = f"{run.k}" + (
        f" — cases carry their own topK, so the headline figures are at each case's K (default {run.k})"
        if s.k_mixed
        else ""
    )
    corpus = run.corpus_fingerprint
    return [
        "## Run",
        "",
        "| | |",
        "|---|---|",
        f"| Golden set | `{run.golden_set}` (version {run.dataset_version or 'n/a'}, "
        f"sha256 {(run.golden_set_sha256 or '')[:12]}) |",
        f"| Cases | {s.cases} ({s.scored_cases} scored, {s.no_answer.cases} no-answer, {s.failed} failed) |",
        f"| K | {k_note} |",
        f"| As of | {run.as_of or 'today'} (the date the hard filter's effective dates use"
        f"{_own_dates(report)}) |",
        f"| Embedder | {_ident(run.models.embedder)} |",
        f"| Reranker | {run.models.reranker or 'none (rerank stage skipped)'} |",
        f"| Store | {run.store or ''} ({run.chunks if run.chunks is not None else '?'} chunks, "
        f"sha256 {corpus.sha256[:12] if corpus is not None else ''}) |",
        f"| Chain | {run.chain_summary or ''} (sha256 {(run.chain_sha256 or '')[:12]}) |",
        f"| Chain settings | {_cell(run.chain_settings or '', None)} |",
        f"| Code version | {run.code_version or 'unknown'} |",
        f"| Duration | {(run.duration_ms or 0.0) / 1000:.1f} s |",
        "",
    ]


def _own_dates(report: Report) -> str:
    own = sum(1 for c in report.cases if c.resolved.as_of and c.resolved.as_of != report.run.as_of)
    return f"; {own} case(s) are judged as of their own asOf" if own else ""


# the character figures of the list after each stage (run/evidence.py), when the run has them
_STAGE_CHAR_LABELS = {"evidenceCharRecall": "EvidenceCharRecall", "charPrecision": "CharPrecision"}


def _stage_char_columns(report: Report, kl: str) -> tuple[list[str], list[str]]:
    """(keys, headers) of the character columns of the stage table: context characters, and the evidence
    character figures when some case's evidence has spans."""
    keys = [
        k for k in (*_STAGE_CHAR_LABELS, "contextChars") if any(k in st.after_stage for st in report.stages)
    ]
    return keys, [
        f"{_STAGE_CHAR_LABELS[k]}{kl}" if k in _STAGE_CHAR_LABELS else "Context chars" for k in keys
    ]


def _stage_char_cell(key: str, value: float | None) -> str:
    return (f"{value:.0f}" if value is not None else "—") if key == "contextChars" else _f(value)


def _stages_markdown(report: Report, s: Summary, kl: str) -> list[str]:
    char_keys, char_headers = _stage_char_columns(report, kl)
    lines = [
        "## Per-stage filter statistics",
        "",
        "Removed = candidates (chunks) the stage dropped over all cases; removed relevant = expected ids the "
        "stage made disappear from the list (a filter removing relevant documents is a bug to look at; "
        "dropping a second chunk of a document that stays is not counted). "
        + "/".join(measures.label(m) for m in measures.AFTER_STAGE)
        + " are of the list after the stage, cut at K"
        + (", and so are its character figures (means over the cases that have them)." if char_keys else "."),
        "",
        "| Stage | Removed | Removed relevant | Avg ms | "
        + " | ".join([*(measures.label(m, kl) for m in measures.AFTER_STAGE), *char_headers])
        + " | Note |",
        "|---|---|---|---|" + "---|" * (len(measures.AFTER_STAGE) + len(char_keys)) + "---|",
    ]
    for st in report.stages:
        note = st.skipped or ("" if st.enabled else "disabled")
        if st.added:
            note = (note + "; " if note else "") + f"added {st.added}"
        flag = " ⚠" if st.removed_relevant else ""
        lines.append(
            f"| {st.name} | {st.removed} | {st.removed_relevant}{flag} | {_ms(st.latency_ms)} | "
            + " | ".join(
                [
                    *(_f(st.after_stage.get(m)) for m in measures.AFTER_STAGE),
                    *(_stage_char_cell(k, st.after_stage.get(k)) for k in char_keys),
                ]
            )
            + f" | {note} |"
        )
    if report.candidate_origins:
        lines += [
            "",
            "Candidates came from: "
            + ", ".join(f"{k} {v}" for k, v in report.candidate_origins.items())
            + ".",
        ]
    if s.lost_by:
        lines += [
            "",
            "Where expected documents outside the top K were lost: "
            + ", ".join(f"`{k}` {v}" for k, v in s.lost_by.items())
            + ".",
        ]
    return lines + [""]


def _segments_markdown(segs: list[Segment]) -> list[str]:
    """The segments section: a row per segment of at least `SMALL_SEGMENT` cases (with Δ nDCG and p when
    compared), then the small ones on one line; nothing without segments."""
    if not segs:
        return []
    with_delta = any(sg.delta is not None for sg in segs)
    shown = measures.GATED
    out = [
        "## Segments",
        "",
        f"Means of the per-case figures over each segment's scored cases with at least {SMALL_SEGMENT} "
        "cases; the smaller ones, too small to read much into, share one line below."
        + (
            " Δ nDCG and its p-value against the baseline are exploratory (uncorrected)."
            if with_delta
            else ""
        ),
        "",
        "| Kind | Segment | Cases | "
        + " | ".join(measures.measure(key).header() for key in shown)
        + " |"
        + (" Δ nDCG | p |" if with_delta else ""),
        "|---|---|---|" + "---|" * len(shown) + ("---|---|" if with_delta else ""),
    ]
    out += [_segment_row(sg, with_delta) for sg in segs if not sg.small]
    small = [sg for sg in segs if sg.small]
    if small:
        out += [
            "",
            f"Small segments (fewer than {SMALL_SEGMENT} cases, nDCG): "
            + ", ".join(
                f"{sg.kind} {md_text(sg.name)} {_f(sg.metrics.get('ndcg'))} ({sg.cases})" for sg in small
            )
            + ".",
        ]
    return out + [""]


def _segment_row(sg: Segment, with_delta: bool) -> str:
    """A segment's row: its means of the gated measures (`measures.GATED`) and, `with_delta`, its nDCG
    difference from the baseline and the p-value."""
    m = sg.metrics
    row = (
        f"| {sg.kind} | {_cell(sg.name, None)} | {sg.cases} | "
        + " | ".join(_f(m.get(key)) for key in measures.GATED)
        + " |"
    )
    if with_delta:
        d = sg.delta.metrics.get("ndcg") if sg.delta is not None else None
        row += f" {d['delta']:+.3f} | {p_text(d['pValue'])} |" if d else " n/a | n/a |"
    return row


def principal_text(c: CaseRecord) -> str:
    """Whom the case ran as, and why: its own `principal`, the default principal, or "" when unscoped."""
    run_as = c.resolved.run_as
    if run_as is None:
        return ""
    if c.case.principal is not None:
        return run_as
    return f"{run_as} (rag.access.eval_default_principal)"


def access_markdown(access: AccessSection | None) -> list[str]:
    """The report's "Access scopes" section (nothing without `access`): the evaluation principals and how
    many cases ran as each, the leaks of the cases' own runs, the leak probe, and the cases whose expected
    ids their principal may not read (ACL_FILTERED)."""
    if access is None:
        return []
    default = access.default_principal or "none"
    out = [
        "## Access scopes",
        "",
        f"rag.access.enabled: {'true' if access.enabled else 'false'}; default principal: "
        f"{md_text(default)}. Every returned or attached chunk is checked with `may_read` against the "
        "stored metadata, never the filter's own decision (docs/access.md).",
        "",
        "| Principal | Tenant | Reads as | Cases |",
        "|---|---|---|---:|",
    ]
    names = list(dict.fromkeys([*access.principals, *access.cases_by_principal]))
    for name in names:
        scope = access.principals.get(name, {})
        readers = scope.get("readers")
        listed = [str(r) for r in readers] if isinstance(readers, list) else []
        reads = "everything" if scope.get("admin") else _ids(listed)
        tenant = scope.get("tenant")
        out.append(
            f"| {md_text(name)} | {md_text(str(tenant)) if tenant else ''} | {reads} | "
            f"{access.cases_by_principal.get(name, 0)} |"
        )
    out += ["", f"- Access leaks in the cases' own runs: {len(access.leaks)}"]
    out += [f"  - {md_text(leak.describe())}" for leak in access.leaks[:20]]
    probe = access.probe
    if probe is None:
        out.append("- Leak probe: not run (no evaluation principals)")
    else:
        out.append(
            f"- Leak probe: {probe.runs} runs (each case as every other evaluation principal: "
            f"{_ids(probe.principals)}), {len(probe.leaks)} leak(s), {len(probe.errors)} failed run(s), "
            f"{probe.duration_ms:.0f} ms"
        )
        out += [f"  - {md_text(leak.describe())}" for leak in probe.leaks[:20]]
        out += [f"  - failed: {md_text(error)}" for error in probe.errors[:20]]
    if access.acl_filtered:
        out.append(
            "- Cases with expected ids out of their principal's scope (ACL_FILTERED): "
            f"{len(access.acl_filtered)}"
        )
        out += [
            f"  - {md_text(a.case)} as {md_text(a.principal)}: {_ids(a.ids)}" for a in access.acl_filtered
        ]
    return out + [""]


def _origin_lines(report: Report) -> list[str]:
    """Where the cases came from (manual, generated, the query log), as a sentence."""
    origin = origin_line(report.origins)
    return [origin[0].upper() + origin[1:] + ".", ""] if origin else []


def _groups_markdown(grps: list[Group]) -> list[str]:
    """The paraphrase groups: how many return the same top document, and the groups whose phrasings differ
    in nDCG, widest spread first."""
    if not grps:
        return []
    spread = sorted((g for g in grps if (g.spread or 0) > 0), key=lambda g: (-(g.spread or 0), g.name))
    out = [
        "## Paraphrase groups",
        "",
        f"{len(grps)} groups; {sum(1 for g in grps if g.same_top1)} return the same top document for "
        f"every phrasing; {len(spread)} differ in nDCG between phrasings" + (":" if spread else "."),
        "",
    ]
    if spread:
        out += [
            "| Group | Cases | HitRate | nDCG min | nDCG max | Spread | Same top 1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in spread:
            out.append(
                f"| {_cell(g.name, None)} | {_cell(', '.join(g.cases), None)} | {_f(g.hit_rate)} | "
                f"{_f(g.ndcg_min)} | "
                f"{_f(g.ndcg_max)} | {_f(g.spread)} | {'yes' if g.same_top1 else 'no'} |"
            )
        out.append("")
    return out


def _case_markdown(c: CaseRecord, run_as_of: str | None = None) -> list[str]:
    """A case in full: what it asks and expects, then (unless it failed) how it went, its figures, what
    each stage removed, where its expected ids were lost, its judgments and its ranked documents."""
    out = _case_question(c, run_as_of)
    if c.outcome.error:
        return out + ["", f"**Failed:** {md_text(c.outcome.error)}", ""]
    out += _case_outcome(c)
    out += _case_metrics_table(c)
    out += [f"Filter stats: {_filter_stats(c.analysis.filter_stats) or 'nothing removed'}", ""]
    if c.analysis.lost:
        out += ["Lost: " + _losses(c.analysis.lost), ""]
    out += _case_judgment_lines(c)
    out += (
        _ranked_table(c.outcome.ranked_documents)
        if c.outcome.ranked_documents
        else ["No documents returned."]
    )
    return out + [""]


def _case_question(c: CaseRecord, run_as_of: str | None) -> list[str]:
    """The case as the golden set states it: query, tag, topK, note, what it expects (or no answer), its own
    asOf, its stale ids and its forbidden documents."""
    spec, resolved = c.case, c.resolved
    out = [f"### {md_text(spec.id)}", "", f"- Query: {md_text(spec.query)}"]
    if spec.knowledge_tag:
        out.append(f"- Knowledge tag: {md_text(spec.knowledge_tag)}")
    principal = principal_text(c)
    if principal:
        out.append(f"- Principal: {md_text(principal)}")
    out.append(f"- topK: {resolved.top_k}")
    if spec.note:
        out.append(f"- Note: {md_text(spec.note)}")
    if spec.expect_no_answer:
        out.append(f"- Expected: no answer (abstained: {'yes' if c.outcome.abstained else 'no'})")
    else:
        exp = ", ".join(f"{md_text(k)} ({v:g})" for k, v in resolved.expected.items())
        out.append(f"- Expected ({resolved.match_on}): {exp}")
        if resolved.alternatives:
            out.append(
                f"- Alternatives ({len(resolved.alternatives)} evidence groups): "
                "each figure is the best of them"
            )
    if resolved.as_of and resolved.as_of != run_as_of:
        out.append(f"- As of: {resolved.as_of} (its own asOf)")
    if resolved.missing_from_index:
        out.append(f"- Not in the index: {_ids(resolved.missing_from_index)}")
    if resolved.unscorable:
        out += ["", f"**Not scored:** {md_text(resolved.unscorable)}.", ""]
    if spec.forbidden_doc_ids:
        found = _ids(c.scores.forbidden_found) or "none found"
        out.append(f"- Forbidden: {_ids(spec.forbidden_doc_ids)} ({found})")
    return out


def _case_outcome(c: CaseRecord) -> list[str]:
    """How the case's retrieval went: its group, what it found and returned, its latency and trace id."""
    scores, outcome = c.scores, c.outcome
    out = [f"- Group: {md_text(c.case.group)}"] if c.case.group else []
    out.append(
        f"- Found {scores.hit_count} of {scores.expected_count} expected; first hit at rank "
        f"{scores.first_hit_rank or '-'}; "
        f"{outcome.final_count} returned of {outcome.original_count} candidates"
    )
    out.append(f"- Latency: {_ms(outcome.latency_ms)}" + ("; fallback used" if outcome.fallback_used else ""))
    if outcome.trace_id:
        out.append(f"- Trace id: {outcome.trace_id}")
    leaks = scores.access_leaks or []
    if leaks:
        out.append(f"- **Access leaks ({len(leaks)}):** " + "; ".join(md_text(x.describe()) for x in leaks))
    return out + [""]


def _case_metrics_table(c: CaseRecord) -> list[str]:
    """The case's headline figures at its own K, as a one-row table (nothing for an unscored case)."""
    if not c.scores.metrics:
        return []
    kl = measures.k_label(c.resolved.top_k)
    return [
        "| " + " | ".join(measures.label(key, kl) for key in measures.HEADLINE) + " |",
        "|" + "---|" * len(measures.HEADLINE),
        "| "
        + " | ".join(measures.measure(key).format(c.scores.metrics.get(key)) for key in measures.HEADLINE)
        + " |",
        "",
    ]


def _filter_stats(stats: list[StageStat]) -> str:
    """`similarity_threshold -3 (1 relevant), fallback +2`: the stages that removed or added candidates."""
    return ", ".join(
        f"{s.name} -{s.removed}"
        + (f" ({s.removed_relevant} relevant)" if s.removed_relevant else "")
        + (f" +{s.added}" if s.added else "")
        for s in stats
        if s.removed or s.added
    )


def _ranked_table(docs: list[RankedDocument]) -> list[str]:
    """The case's ranked documents: scores, ranks in the candidate lists, verdict and snippet."""
    return [
        "| Rank | docId | Source | Title | Fused | Dense | BM25 | Rerank "
        "| dense# | bm25# | fused# | rerank# | Matched | Reason | Snippet |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_ranked_row(d) for d in docs),
    ]


def _ranked_row(d: RankedDocument) -> str:
    sc, rk = d.scores, d.ranks
    places = " | ".join(str(r) if r is not None else "-" for r in (rk.dense, rk.bm25, rk.fused, rk.rerank))
    return (
        f"| {d.rank} | {_cell(d.doc_id, None)} | {_cell(d.source, None)} | {_cell(d.title)} | "
        f"{_f(sc.get('fused'))} | {_f(sc.get('dense'))} | "
        f"{_f(sc.get('bm25'), 2)} | {_f(sc.get('rerank'), 2)} | {places} | "
        f"{'yes' if d.matched else 'no'} | "
        f"{_cell(d.reason, None)} | {_cell(d.snippet, 200)}"
        + (f" (+ attached {_ids(d.attached)})" if d.attached else "")
        + " |"
    )


def _losses(lost: list[Loss]) -> str:
    return "; ".join(f"{md_text(x.id)} {loss_text(x)} ({md_text(x.reason)})" for x in lost)


def _case_judgment_lines(c: CaseRecord) -> list[str]:
    """A case's evidence figures, where its evidence was lost, Judged@K and its unjudged ids."""
    out = []
    if c.scores.evidence:
        groups = " | ".join(_ids(g) for g in c.resolved.evidence_groups)
        line = (
            f"Evidence ({groups}): EvidenceRecall {_f(c.scores.evidence.get('evidenceRecall'))}, "
            f"EvidenceHit {_f(c.scores.evidence.get('evidenceHit'))}"
        )
        if "evidenceCharRecall" in c.scores.evidence:
            line += (
                f", EvidenceCharRecall {_f(c.scores.evidence['evidenceCharRecall'])}, "
                f"CharPrecision {_f(c.scores.evidence['charPrecision'])}"
            )
        if c.analysis.evidence_lost:
            line += "; lost: " + _losses(c.analysis.evidence_lost)
        out += [line, ""]
    if c.resolved.expanded_sources:
        shown = "; ".join(
            f"{md_text(src)} -> {_ids(docs) or '(no document)'}"
            for src, docs in c.resolved.expanded_sources.items()
        )
        out += [f"expectedSources expanded to documents: {shown}", ""]
    if c.scores.judged is not None:
        unjudged = _ids(c.scores.unjudged) or "none"
        out += [f"Judged@K {_f(c.scores.judged)}; unjudged in the top K: {unjudged}", ""]
    return out


def _ident(embedder: EmbedderIdentity | str | None) -> str:
    if not isinstance(embedder, EmbedderIdentity):
        return str(embedder or "")
    return f"{embedder.name} (dim {embedder.dimension}, checksum {embedder.checksum})"


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(md_text(i) for i in ids)


def _cell(text: str, limit: int | None = 120) -> str:
    """Text made safe for a table cell (`md_text`, `|` escaped, a newline as a space); prose is cut at
    `limit` characters, ids (`limit` None) never."""
    text = str(text).replace("\n", " ")
    cell = md_text(text if limit is None else text[:limit]).replace("|", "\\|")
    return cell
