"""The report as Markdown, rendered from the report JSON alone, so a report read back from disk renders the
same."""

from __future__ import annotations

from typing import Any

from app.evaluation.compare.comparison import SMALL_SAMPLE
from app.evaluation.golden.audit import audit_markdown
from app.evaluation.render.tune import sweep_markdown
from app.evaluation.report.model import Report
from app.evaluation.run.segments import SMALL_SEGMENT, origin_line
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import fmt as _f
from app.evaluation.scoring.measures import fmt_ms as _ms
from app.evaluation.scoring.measures import fmt_p as p_text

WORST_CASES = 20


def k_label(report: Report | dict[str, Any]) -> str:
    """The report's cut-off label (`measures.k_label`): "@5", or "@K" when cases carry their own topK."""
    if isinstance(report, Report):
        return measures.k_label(report.run.k, bool(report.summary and report.summary.k_mixed))
    run, summary = report.get("run") or {}, report.get("summary") or {}
    return measures.k_label(run.get("k"), bool(summary.get("kMixed")))


def render_markdown(typed: Report, case_detail: bool = False) -> str:
    """The report as Markdown, most telling first: the verdict, the gate, the comparison with the baseline and
    the worst cases; then the summary, the run, the stages, segments, groups, sweep and audit. `case_detail`
    (rag.evaluate.report.case_detail) appends every case's ranking and trace; without it they stay in the
    JSON's `cases`. Drawn from the report's JSON (`Report.to_json`), so a report read back from its file
    renders the same."""
    report = typed.to_json()
    run = report["run"]
    lines = [f"# Retrieval evaluation — {run.get('startedAt', '')}", ""]
    if report["status"] != "ok":
        lines += [
            f"**Nothing ran: {report['error']}**",
            "",
            f"- Golden set: `{run.get('goldenSet')}`",
            "",
            "Fix the golden set (the message above names the file, line or case and field) and run again.",
        ]
        return "\n".join(lines) + "\n"
    kl = k_label(report)
    lines += verdict_markdown(report, kl)
    lines += _gate_markdown(report["gate"])
    lines += comparison_markdown(report, kl)
    lines += _worst_markdown(report, kl)
    lines += _summary_markdown(report, kl)
    lines += _run_markdown(report)
    lines += _stages_markdown(report, kl)
    lines += _segments_markdown(report)
    lines += sweep_markdown(report)
    audit = audit_markdown(report.get("audit"))
    if audit:
        lines += audit[1:] if audit[0] == "" else audit
        lines.append("")
    if report["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
    lines += ["## Cases", ""]
    if case_detail:
        for c in report["cases"]:
            lines += _case_markdown(c)
    else:
        lines += [
            f"Every case's ranking, trace and judgments ({len(report['cases'])} cases) are in the JSON "
            "report's `cases`; `rag.evaluate.report.case_detail: true` lists them here.",
            "",
        ]
    lines += ["## Conventions", "", run["conventions"], ""]
    return "\n".join(lines) + "\n"


def verdict_markdown(report: dict[str, Any], kl: str) -> list[str]:
    """The first lines: the gate's verdict, the headline figures and the comparison in one sentence."""
    s, gate = report["summary"], report["gate"]
    warned = len(gate.get("warnings") or [])
    verdict = "PASSED" if gate["passed"] else "FAILED"
    if warned:
        verdict += f" with {warned} warning{'s' if warned != 1 else ''}"
    figures = ", ".join(
        f"{measures.label(key, kl)} {measures.fmt(s.get(key))}" for key in ("ndcg", "recall", "mrr")
    )
    comp = report.get("comparison")
    if comp and comp.get("comparable") and "ndcg" in comp.get("metrics", {}):
        row = comp["metrics"]["ndcg"]
        cases = comp["cases"]
        against = (
            f"nDCG{kl} {row['delta']:+.3f} against the baseline (p {measures.fmt_p(row['pValue'])}, "
            f"{'significant' if row['significant'] else 'not significant'}); "
            f"{len(cases['fixed'])} fixed, {len(cases['broken'])} broken"
        )
    elif comp:
        against = "not comparable with the baseline"
    else:
        against = f"no baseline ({report.get('baselineNote') or 'none'})"
    return [
        f"**Gate {verdict}.** {figures} over {s['scoredCases']} scored cases "
        f"({s['cases']} in all, {s['noAnswer']['cases']} no-answer, {s['failed']} failed); {against}.",
        "",
    ]


def _worst_markdown(report: dict[str, Any], kl: str) -> list[str]:
    s = report["summary"]
    failed_ids = s.get("failedCaseIds") or []
    lines = ["## Worst cases", ""]
    if failed_ids:
        lines += [
            f"{len(failed_ids)} case(s) with recall < 1 or an error: {', '.join(failed_ids)}. "
            f"The worst {WORST_CASES} are below; each document with its fused score (the order).",
            "",
        ]
    worst = _worst(report["cases"])
    if not worst:
        lines.append("Every scored case found all its expected documents at rank 1.")
    else:
        lines += [
            f"| Case | Query | nDCG{kl} | Expected | Got (top 3, fused score) | Where lost |",
            "|---|---|---|---|---|---|",
        ]
        for c in worst:
            got = _ranked_text(c["rankedDocuments"][:3])
            lost = "; ".join(f"{x['id']}: {x['where']}" for x in c["lost"]) or "-"
            if c["metrics"]:
                nd = _f(c["metrics"]["ndcg"])
            elif c["expectNoAnswer"]:
                nd = "no answer expected"
            else:
                nd = c["status"]
            lines.append(
                f"| {c['id']} | {_cell(c['query'])} | {nd} | {', '.join(c['expected']) or '-'} | "
                f"{got} | {_cell(lost, None)} |"
            )
    return lines + [""]


def _ids_with_scores(ids: list[str], fused: list[float | None] | None) -> str:
    """`doc-a (0.897), doc-b (0.512)`; a comparison read from a report without fused scores shows "n/a"."""
    scores = list(fused or [])
    scores += [None] * (len(ids) - len(scores))
    return ", ".join(f"{i} ({_f(f)})" for i, f in zip(ids, scores, strict=False)) or "(nothing)"


def _ranked_text(docs: list[dict[str, Any]]) -> str:
    """`doc-a (0.897), doc-b (0.512)`: full doc ids with their fused scores, "(nothing)" for none."""
    return (
        ", ".join(f"{d['docId']} ({_f((d.get('scores') or {}).get('fused'))})" for d in docs) or "(nothing)"
    )


def _summary_markdown(report: dict[str, Any], kl: str) -> list[str]:
    s = report["summary"]
    lines = ["## Summary", "", "| Measure | Value |", "|---|---|"]
    counts = s.get("counts") or {}
    scored, hits = counts.get("scoredCases"), counts.get("hits")
    found, total = counts.get("relevantFound"), counts.get("relevantTotal")
    extras = {
        "recall": f" (mean per case; {found} of {total} relevant found)" if total else "",
        "hitRate": f" = {hits}/{scored}" if scored else "",
        "duplicateRate": " (ids and content)",
    }
    for key in measures.HEADLINE:
        lines.append(
            f"| {measures.label(key, kl)} | {measures.measure(key).format(s[key])}{extras.get(key, '')} |"
        )
    lat = s["latencyMs"] or {}
    batch = s.get("batchLatencyMs") or {}
    na = s["noAnswer"]
    na_n = na["cases"]
    abst = round((na["correctAbstentionRate"] or 0) * na_n) if na_n else 0
    lines += [
        f"| Latency p50 / p95 / max (single query, {s.get('latencySampleCases', 0)} cases) | "
        f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {_ms(lat.get('max'))} |",
        f"| Batched run per case p50 / p95 | {_ms(batch.get('p50'))} / {_ms(batch.get('p95'))} |",
        f"| No-answer: CorrectAbstention / FalseAnswerRate | {_f(na['correctAbstentionRate'])} "
        f"({abst}/{na_n}) / {_f(na['falseAnswerRate'])} ({na_n - abst}/{na_n}) |",
        f"| Forbidden documents in top K | {s['forbidden']['hits']} (in {s['forbidden']['cases']} cases) |",
        f"| Expected ids missing from the index | {s['expectedMissingFromIndex']} |",
    ]
    lines += _judgment_rows(s, kl)
    lines.append("")
    at_k = s.get("atK") or {}
    if at_k:
        lines += [
            "Several cut-offs from the same ranking (every case cut at the same K):",
            "",
            "| K | " + " | ".join(measures.label(m) for m in measures.RANKING) + " |",
            "|---|" + "---|" * len(measures.RANKING),
        ]
        for k, row in at_k.items():
            lines.append(f"| {k} | " + " | ".join(_f(row[m]) for m in measures.RANKING) + " |")
        lines.append("")
    return lines


def _run_markdown(report: dict[str, Any]) -> list[str]:
    run, s = report["run"], report["summary"]
    models = run.get("models", {})
    k_note = f"{run['k']}" + (
        f" — cases carry their own topK, so the headline figures are at each case's K (default {run['k']})"
        if s.get("kMixed")
        else ""
    )
    return [
        "## Run",
        "",
        "| | |",
        "|---|---|",
        f"| Golden set | `{run['goldenSet']}` (version {run.get('datasetVersion') or 'n/a'}, "
        f"sha256 {str(run.get('goldenSetSha256', ''))[:12]}) |",
        f"| Cases | {s['cases']} ({s['scoredCases']} scored, {s['noAnswer']['cases']} no-answer, "
        f"{s['failed']} failed) |",
        f"| K | {k_note} |",
        f"| As of | {run.get('asOf') or 'today'} (the date the hard filter's effective dates use) |",
        f"| Embedder | {_ident(models.get('embedder'))} |",
        f"| Reranker | {models.get('reranker') or 'none (rerank stage skipped)'} |",
        f"| Store | {run.get('store', '')} ({run.get('chunks', '?')} chunks, "
        f"sha256 {str((run.get('corpusFingerprint') or {}).get('sha256', ''))[:12]}) |",
        f"| Chain | {run.get('chainSummary', '')} (sha256 {str(run.get('chainSha256', ''))[:12]}) |",
        f"| Chain settings | {_cell(run.get('chainSettings', ''), None)} |",
        f"| Code version | {run.get('codeVersion', 'unknown')} |",
        f"| Duration | {run['durationMs'] / 1000:.1f} s |",
        "",
    ]


def _stages_markdown(report: dict[str, Any], kl: str) -> list[str]:
    s = report["summary"]
    lines = [
        "## Per-stage filter statistics",
        "",
        "Removed = candidates (chunks) the stage dropped over all cases; removed relevant = expected ids the "
        "stage made disappear from the list (a filter removing relevant documents is a bug to look at; "
        "dropping a second chunk of a document that stays is not counted). "
        + "/".join(measures.label(m) for m in measures.AFTER_STAGE)
        + " are of the list after the stage, cut at K.",
        "",
        "| Stage | Removed | Removed relevant | Avg ms | "
        + " | ".join(measures.label(m, kl) for m in measures.AFTER_STAGE)
        + " | Note |",
        "|---|---|---|---|" + "---|" * len(measures.AFTER_STAGE) + "---|",
    ]
    for st in report["stages"]:
        a = st["afterStage"]
        note = st["skipped"] or ("" if st["enabled"] else "disabled")
        if st.get("added"):
            note = (note + "; " if note else "") + f"added {st['added']}"
        flag = " ⚠" if st["removedRelevant"] else ""
        lines.append(
            f"| {st['name']} | {st['removed']} | {st['removedRelevant']}{flag} | {_ms(st['latencyMs'])} | "
            + " | ".join(_f(a.get(m)) for m in measures.AFTER_STAGE)
            + f" | {note} |"
        )
    origins = report.get("candidateOrigins") or {}
    if origins:
        lines += ["", "Candidates came from: " + ", ".join(f"{k} {v}" for k, v in origins.items()) + "."]
    if s["lostBy"]:
        lines += [
            "",
            "Where expected documents outside the top K were lost: "
            + ", ".join(f"`{k}` {v}" for k, v in s["lostBy"].items())
            + ".",
        ]
    return lines + [""]


def _judgment_rows(s: dict[str, Any], kl: str) -> list[str]:
    """Summary rows for how complete the judgments are (Judged@K, the condensed-list figures) and for the
    evidence chunks. Reports written before these figures existed have none of the keys."""
    rows = []
    if s.get("judged") is not None:
        rows.append(
            f"| Judged{kl} (share of the top K with a judgment) | {_f(s['judged'])} "
            f"({s.get('unjudgedInTopK', 0)} unjudged ids in the scored cases' top K) |"
        )
    cond = s.get("condensed") or {}
    if cond.get("ndcg") is not None:
        rows.append(
            f"| Condensed list (unjudged removed): nDCG{kl} / Recall{kl} / MRR | {_f(cond['ndcg'])} / "
            f"{_f(cond['recall'])} / {_f(cond['mrr'])} |"
        )
    ev = s.get("evidence") or {}
    if ev.get("cases"):
        lost = ", ".join(f"`{k}` {v}" for k, v in (ev.get("lostBy") or {}).items()) or "none lost"
        rows.append(
            f"| Evidence chunks: EvidenceRecall{kl} / EvidenceHit{kl} ({ev['cases']} cases) | "
            f"{_f(ev['evidenceRecall'])} / {_f(ev['evidenceHit'])} ({lost}) |"
        )
    return rows


def comparison_markdown(report: dict[str, Any], kl: str) -> list[str]:
    comp = report.get("comparison")
    if not comp:
        note = report.get("baselineNote") or "no baseline"
        return ["## Compared with baseline", "", f"No comparison: {note}.", ""]
    base = comp["baseline"]
    kind = f" ({base['kind']})" if base.get("kind") else ""
    out = [
        "## Compared with baseline",
        "",
        f"Baseline{kind} `{base['path']}`, evaluated {base.get('evaluatedAt') or '?'} "
        f"(code {base.get('run', {}).get('codeVersion', '?')}); {comp['pairedCases']} paired scored cases.",
        "",
    ]
    if not comp["comparable"]:
        out += ["**Not comparable** (K differs): no statistics.", ""]
    elif comp["pairedCases"] < SMALL_SAMPLE:
        out += [
            f"> Only {comp['pairedCases']} paired cases (fewer than {SMALL_SAMPLE}): small differences "
            "cannot be significant here; read the deltas as indications, not findings.",
            "",
        ]
    if comp["metrics"]:
        out += [
            "Per-case differences (current − baseline): 95% CI by percentile bootstrap (10,000 resamples); "
            "p by the paired sign-flip test; significant = Holm-adjusted p < alpha.",
            "",
            "| Metric | Baseline | Current | Δ | 95% CI | p | p (Holm) | Significant |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, row in comp["metrics"].items():
            ci = row["ci95"] or [None, None]
            out.append(
                f"| {measures.label(name, kl)} | "
                f"{_f(row['baseline'])} | {_f(row['current'])} | {row['delta']:+.3f} | "
                f"[{_f(ci[0])}, {_f(ci[1])}] | {p_text(row['pValue'])} | {p_text(row['pHolm'])} | "
                f"{'yes' if row['significant'] else 'no'} |"
            )
        out.append("")
    out += ["What changed between the runs:", ""]
    out += [f"- `{d}`" if d.startswith("rag.") else f"- {d}" for d in comp["differences"]]
    if not comp["differences"]:
        out.append("- nothing: same settings, embedder, corpus, golden set, K and asOf")
    out.append("")
    account = comp.get("unjudged")
    if account:
        out += [
            f"**{account['headline']}.** A broken or worsened case whose drop comes from unjudged "
            "documents (the condensed list, unjudged removed, did not drop) is *unverified*, not a "
            "regression: judge those documents (`sieve golden pool --report`) to settle it.",
            "",
        ]
        cond = comp.get("condensedMetrics") or {}
        if "ndcg" in cond:
            row = cond["ndcg"]
            out += [
                f"Condensed lists: nDCG{kl} {_f(row['baseline'])} → {_f(row['current'])} "
                f"({row['delta']:+.3f}, p {p_text(row['pValue'])}).",
                "",
            ]
    cases = comp["cases"]
    details = comp.get("caseDetails") or {}
    worsened_ids = [x["id"] for x in cases["worsened"]]
    for title, ids in (
        ("Fixed (hit 0 → 1)", cases["fixed"]),
        ("Broken (hit 1 → 0)", cases["broken"]),
        ("Worsened (nDCG dropped)", worsened_ids),
    ):
        out += [f"{title}: {len(ids)}", ""]
        if ids:
            out += [
                "| Case | Query | Before (top 3, fused score) | Now (top 3, fused score) "
                "| New in top K (unjudged) | Verdict |",
                "|---|---|---|---|---|---|",
            ]
            for i in ids:
                d = details.get(i, {})
                before = _ids_with_scores(d.get("before", []), d.get("beforeFused"))
                now = _ids_with_scores(d.get("now", []), d.get("nowFused"))
                new = d.get("newInTopK")
                new_text = "-" if new is None else f"{len(new)} ({len(d.get('newUnjudged') or [])} unjudged)"
                verdict = "-" if title.startswith("Fixed") else (d.get("why") or "verified")
                query = _cell(d.get("query", ""))
                out.append(f"| {i} | {query} | {before} | {now} | {new_text} | {_cell(verdict)} |")
            out.append("")
    moved = [(x, "+") for x in cases["improved"][:10]] + [(x, "") for x in cases["worsened"][:10]]
    if moved:
        out += [
            "nDCG changed: "
            + ", ".join(f"{x['id']} {x['delta']:+.3f}" for x, _ in moved)
            + f" ({len(cases['improved'])} improved, {len(cases['worsened'])} worsened).",
            "",
        ]
    if cases["onlyInBaseline"] or cases["onlyInCurrent"]:
        out += [
            "Left out of the paired figures: only in the baseline "
            f"{', '.join(cases['onlyInBaseline']) or '-'}; only in this run "
            f"{', '.join(cases['onlyInCurrent']) or '-'}.",
            "",
        ]
    if comp["stages"]:
        out += [
            "| Stage | Removed relevant (before → now) | Recall after stage (before → now) |",
            "|---|---|---|",
        ]
        for st in comp["stages"]:
            rr, ra = st["removedRelevant"], st["recallAfter"]
            out.append(
                f"| {st['name']} | {rr['baseline'] if rr['baseline'] is not None else 'n/a'} → "
                f"{rr['current']} | {_f(ra['baseline'])} → {_f(ra['current'])} |"
            )
        out.append("")
    return out


def _gate_markdown(gate: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if gate["checks"]:
        warned = len(gate.get("warnings") or [])
        out += [
            "## Gate: "
            + ("PASSED" if gate["passed"] else "FAILED")
            + (f" ({warned} warning{'s' if warned != 1 else ''})" if warned else ""),
            "",
            "| Check | Value | Needs | | |",
            "|---|---|---|---|---|",
        ]
        for c in gate["checks"]:
            status = "ok" if c["passed"] else "WARN" if c.get("severity") == "warn" else "**FAIL**"
            out.append(
                f"| {c['name']} | {_f(c['value'])} | {c['op']} {c['threshold']} | "
                f"{status} | {_cell(c.get('message', ''), 400)} |"
            )
        out.append("")
    for note in gate.get("notes") or []:
        out += [f"- {note}"]
    if gate.get("notes"):
        out.append("")
    return out


def _segments_markdown(report: dict[str, Any]) -> list[str]:
    segs = report.get("segments") or []
    out: list[str] = []
    if segs:
        with_delta = any(sg.get("delta") for sg in segs)
        out += [
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
            "| Kind | Segment | Cases | Recall | HitRate | MRR | nDCG |"
            + (" Δ nDCG | p |" if with_delta else ""),
            "|---|---|---|---|---|---|---|" + ("---|---|" if with_delta else ""),
        ]
        for sg in (sg for sg in segs if not sg["small"]):
            m = sg["metrics"]
            row = (
                f"| {sg['kind']} | {sg['name']} | {sg['cases']} | "
                f"{_f(m['recall'])} | {_f(m['hitRate'])} | {_f(m['mrr'])} | {_f(m['ndcg'])} |"
            )
            if with_delta:
                d = ((sg.get("delta") or {}).get("metrics") or {}).get("ndcg")
                row += f" {d['delta']:+.3f} | {p_text(d['pValue'])} |" if d else " n/a | n/a |"
            out.append(row)
        small = [sg for sg in segs if sg["small"]]
        if small:
            out += [
                "",
                f"Small segments (fewer than {SMALL_SEGMENT} cases, nDCG): "
                + ", ".join(
                    f"{sg['kind']} {sg['name']} {_f(sg['metrics']['ndcg'])} ({sg['cases']})" for sg in small
                )
                + ".",
            ]
        out.append("")
    origin = origin_line(report.get("origins"))
    if origin:
        out += [origin[0].upper() + origin[1:] + ".", ""]
    grps = report.get("groups") or []
    if grps:
        spread = sorted(
            (g for g in grps if (g.get("spread") or 0) > 0), key=lambda g: (-(g["spread"] or 0), g["name"])
        )
        out += [
            "## Paraphrase groups",
            "",
            f"{len(grps)} groups; {sum(1 for g in grps if g['sameTop1'])} return the same top document for "
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
                    f"| {g['name']} | {', '.join(g['cases'])} | {_f(g['hitRate'])} | {_f(g['ndcgMin'])} | "
                    f"{_f(g['ndcgMax'])} | {_f(g['spread'])} | {'yes' if g['sameTop1'] else 'no'} |"
                )
            out.append("")
    return out


def _case_markdown(c: dict[str, Any]) -> list[str]:
    out = [f"### {c['id']}", "", f"- Query: {c['query']}"]
    if c["knowledgeTag"]:
        out.append(f"- Knowledge tag: {c['knowledgeTag']}")
    out.append(f"- topK: {c['topK']}")
    if c["note"]:
        out.append(f"- Note: {c['note']}")
    if c["expectNoAnswer"]:
        out.append(f"- Expected: no answer (abstained: {'yes' if c['abstained'] else 'no'})")
    else:
        exp = ", ".join(f"{k} ({v:g})" for k, v in c["expected"].items())
        out.append(f"- Expected ({c['matchOn']}): {exp}")
    if c["forbiddenDocIds"]:
        found = ", ".join(c["forbiddenFound"]) or "none found"
        out.append(f"- Forbidden: {', '.join(c['forbiddenDocIds'])} ({found})")
    if c["error"]:
        out += ["", f"**Failed:** `{c['error']}`", ""]
        return out
    if c.get("group"):
        out.append(f"- Group: {c['group']}")
    out.append(
        f"- Found {c.get('hitCount')} of {c.get('expectedCount')} expected; first hit at rank "
        f"{c.get('firstHitRank') or '-'}; {c.get('finalCount')} returned of "
        f"{c.get('originalCount')} candidates"
    )
    out.append(f"- Latency: {_ms(c['latencyMs'])}" + ("; fallback used" if c["fallbackUsed"] else ""))
    out.append("")
    if c["metrics"]:
        m = c["metrics"]
        kl = measures.k_label(c.get("topK"))
        out += [
            "| " + " | ".join(measures.label(key, kl) for key in measures.HEADLINE) + " |",
            "|" + "---|" * len(measures.HEADLINE),
            "| " + " | ".join(measures.measure(key).format(m.get(key)) for key in measures.HEADLINE) + " |",
            "",
        ]
    stats = ", ".join(
        f"{s['name']} -{s['removed']}"
        + (f" ({s['removedRelevant']} relevant)" if s["removedRelevant"] else "")
        + (f" +{s['added']}" if s["added"] else "")
        for s in c["filterStats"]
        if s["removed"] or s["added"]
    )
    out += [f"Filter stats: {stats or 'nothing removed'}", ""]
    if c["lost"]:
        out += ["Lost: " + "; ".join(f"{x['id']} {x['where']} ({x['reason']})" for x in c["lost"]), ""]
    out += _case_judgment_lines(c)
    if c["rankedDocuments"]:
        out += [
            "| Rank | docId | Source | Title | Fused | Dense | BM25 | Rerank | Matched | Reason | Snippet |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in c["rankedDocuments"]:
            sc = d["scores"]
            out.append(
                f"| {d['rank']} | {d['docId']} | {d['source']} | {_cell(d['title'])} | "
                f"{_f(sc.get('fused'))} | {_f(sc.get('dense'))} | "
                f"{_f(sc.get('bm25'), 2)} | {_f(sc.get('rerank'), 2)} | {'yes' if d['matched'] else 'no'} | "
                f"{d['reason']} | {_cell(d.get('snippet', ''), 200)}"
                + (f" (+ attached {', '.join(d['attached'])})" if d.get("attached") else "")
                + " |"
            )
    else:
        out.append("No documents returned.")
    out.append("")
    return out


def _case_judgment_lines(c: dict[str, Any]) -> list[str]:
    """A case's evidence figures, where its evidence was lost, Judged@K and its unjudged ids."""
    out = []
    ev = c.get("evidence")
    if ev:
        groups = " | ".join(", ".join(g) for g in c.get("evidenceGroups") or [])
        line = (
            f"Evidence ({groups}): EvidenceRecall {_f(ev['evidenceRecall'])}, "
            f"EvidenceHit {_f(ev['evidenceHit'])}"
        )
        lost = c.get("evidenceLost") or []
        if lost:
            line += "; lost: " + "; ".join(f"{x['id']} {x['where']} ({x['reason']})" for x in lost)
        out += [line, ""]
    if c.get("expandedSources"):
        shown = "; ".join(
            f"{src} -> {', '.join(docs) or '(no document)'}" for src, docs in c["expandedSources"].items()
        )
        out += [f"expectedSources expanded to documents: {shown}", ""]
    if c.get("judged") is not None:
        unjudged = ", ".join(c.get("unjudged") or []) or "none"
        out += [f"Judged@K {_f(c['judged'])}; unjudged in the top K: {unjudged}", ""]
    return out


def _worst(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def badness(c: dict[str, Any]) -> tuple[float, float, str]:
        if c["status"] == "failed":
            return (-1.0, 0.0, c["id"])
        if c["expectNoAnswer"]:
            return (0.0 if not c["abstained"] else 2.0, 0.0, c["id"])
        m = c["metrics"] or {}
        return (m.get("ndcg", 0.0), m.get("recall", 0.0), c["id"])

    bad = [c for c in cases if badness(c)[0] < 1.0 or c["forbiddenFound"]]
    return sorted(bad, key=badness)[:WORST_CASES]


def _ident(embedder: Any) -> str:
    if not isinstance(embedder, dict):
        return str(embedder or "")
    return f"{embedder.get('name')} (dim {embedder.get('dimension')}, checksum {embedder.get('checksum')})"


def _cell(text: str, limit: int | None = 120) -> str:
    """Text made safe for a table cell; prose is cut at `limit` characters, ids (`limit` None) never."""
    cell = str(text).replace("|", "\\|").replace("\n", " ")
    return cell if limit is None else cell[:limit]
