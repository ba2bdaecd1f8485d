"""The evaluation report: one JSON document (`schemaVersion` 1) and its Markdown rendering.

Files: `<output_dir>/<prefix>-<UTC timestamp>.{md,json}` plus `<prefix>-latest.{md,json}`, each written to
a temporary file in the same folder and renamed into place, so a reader never sees half a report.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from statistics import fmean
from typing import Any

from app.evaluation import metrics
from app.evaluation.gate import GateCheck
from app.evaluation.runner import NOT_IN_INDEX, NOT_RETRIEVED, RANKED_OUT, CaseResult, Evaluation, match_key
from app.settings import EvaluateSettings

SCHEMA_VERSION = 1
SUMMARY_METRICS = ("recall", "hitRate", "mrr", "ndcg", "precision", "top1Accuracy", "duplicateRate")
WORST_CASES = 20


def summarize(evaluation: Evaluation) -> dict[str, Any]:
    """Macro averages over the cases with relevant documents; no-answer cases get their own figures."""
    cases = evaluation.cases
    scored = [c for c in cases if c.metrics is not None]
    no_answer = [c for c in cases if c.case.expect_no_answer and c.error is None]
    latencies = [c.latency_ms for c in cases if c.latency_ms is not None]
    summary: dict[str, Any] = {
        "cases": len(cases),
        "succeeded": sum(1 for c in cases if c.error is None),
        "failed": sum(1 for c in cases if c.error is not None),
        "scoredCases": len(scored),
    }
    for name in SUMMARY_METRICS:
        summary[name] = fmean(c.metrics[name] for c in scored) if scored else None  # type: ignore[index]
    summary["latencyMs"] = metrics.latency_summary(latencies) if latencies else None
    summary["noAnswer"] = {
        "cases": len(no_answer),
        "correctAbstentionRate": fmean(1.0 if c.abstained else 0.0 for c in no_answer) if no_answer else None,
        "falseAnswerRate": fmean(0.0 if c.abstained else 1.0 for c in no_answer) if no_answer else None,
    }
    summary["forbidden"] = {
        "hits": sum(len(c.forbidden_found) for c in cases),
        "cases": sum(1 for c in cases if c.forbidden_found),
    }
    summary["expectedMissingFromIndex"] = sum(len(c.missing_from_index) for c in cases)
    lost: dict[str, int] = {}
    for c in cases:
        for item in c.lost:
            lost[item["where"]] = lost.get(item["where"], 0) + 1
    summary["lostBy"] = dict(sorted(lost.items()))
    return summary


def stage_table(evaluation: Evaluation) -> list[dict[str, Any]]:
    """Per stage, over all cases: removed, removedRelevant, latency, and the averages of Recall/MRR/nDCG of
    the list after that stage (first row: the raw candidates)."""
    rows: list[dict[str, Any]] = []
    ok = [c for c in evaluation.cases if c.result is not None]
    scored = [c for c in ok if c.metrics is not None]
    rows.append(
        {
            "name": "candidates",
            "enabled": True,
            "skipped": None,
            "removed": 0,
            "removedRelevant": 0,
            "added": 0,
            "latencyMs": _mean([c.result.trace.candidates_ms for c in ok]),  # type: ignore[union-attr]
            "afterStage": _after(scored, "candidates"),
        }
    )
    for i, name in enumerate(evaluation.stage_names):
        stats = [c.stage_stats[i] for c in ok if i < len(c.stage_stats)]
        skipped = {s["skipped"] for s in stats if s["skipped"]}
        rows.append(
            {
                "name": name,
                "enabled": all(s["enabled"] for s in stats) if stats else True,
                "skipped": "; ".join(sorted(skipped)) or None,
                "removed": sum(s["removed"] for s in stats),
                "removedRelevant": sum(s["removedRelevant"] for s in stats),
                "added": sum(s["added"] for s in stats),
                "latencyMs": _mean([s["latencyMs"] for s in stats]),
                "afterStage": _after(scored, name),
            }
        )
    return rows


def _after(scored: list[CaseResult], stage: str) -> dict[str, float | None]:
    values = [c.after_stage[stage] for c in scored if stage in c.after_stage]
    return {m: (fmean(v[m] for v in values) if values else None) for m in ("recall", "mrr", "ndcg")}


def _mean(values: list[float]) -> float | None:
    return round(fmean(values), 3) if values else None


def build_report(evaluation: Evaluation, run_info: dict[str, Any], gate: list[GateCheck]) -> dict[str, Any]:
    summary = summarize(evaluation)
    origins: dict[str, int] = {}
    for c in evaluation.cases:
        if c.result is not None:
            for k, v in c.result.trace.candidate_origins.items():
                origins[k] = origins.get(k, 0) + v
    return {
        "schemaVersion": SCHEMA_VERSION,
        "status": "ok",
        "run": {
            **run_info,
            "startedAt": datetime.fromtimestamp(evaluation.started_at, UTC).isoformat(timespec="seconds"),
            "durationMs": round(evaluation.duration_ms, 1),
            "goldenSet": evaluation.golden.path,
            "datasetVersion": evaluation.golden.dataset_version,
            "k": evaluation.default_k,
            "conventions": metrics.CONVENTIONS,
        },
        "summary": summary,
        "gate": {
            "passed": all(c.passed for c in gate),
            "checks": [
                {
                    "name": c.name,
                    "metric": c.metric,
                    "op": c.op,
                    "threshold": c.threshold,
                    "value": c.value,
                    "passed": c.passed,
                }
                for c in gate
            ],
        },
        "stages": stage_table(evaluation),
        "candidateOrigins": origins,
        "warnings": evaluation.warnings,
        "cases": [_case_json(c) for c in evaluation.cases],
    }


def invalid_report(golden_path: str, error: str, run_info: dict[str, Any]) -> dict[str, Any]:
    """The report of a run that could not start (the golden set is broken): it says why nothing ran."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "status": "invalid",
        "error": error,
        "run": {**run_info, "goldenSet": golden_path, "startedAt": _now().isoformat(timespec="seconds")},
        "summary": None,
        "gate": {"passed": False, "checks": []},
        "stages": [],
        "cases": [],
    }


def _case_json(c: CaseResult) -> dict[str, Any]:
    case = c.case
    docs = c.result.documents if c.result else []
    relevant = metrics.relevant_ids(c.relevance)
    seen: set[str] = set()
    ranked = []
    for rank, d in enumerate(docs, start=1):
        key = match_key(d, c.key)
        if d.doc_id in case.forbidden_doc_ids:
            reason = "FORBIDDEN"
        elif key in relevant and key in seen:
            reason = "duplicate of a higher-ranked hit"
        elif key in relevant:
            grade = c.relevance.get(key, 1.0)
            reason = f"relevant (grade {grade:g})"
        else:
            reason = "not relevant"
        ranked.append(
            {
                "rank": rank,
                "docId": d.doc_id,
                "chunkId": d.chunk_id,
                "source": d.source,
                "title": d.title,
                "scores": {k: round(v, 6) for k, v in d.scores.items()},
                "origin": sorted(d.origin),
                "matched": key in relevant and key not in seen,
                "reason": reason,
            }
        )
        seen.add(key)
    return {
        "id": case.id,
        "query": case.query,
        "knowledgeTag": case.knowledge_tag,
        "topK": c.k,
        "note": case.note,
        "tags": case.tags,
        "matchOn": c.key,
        "expected": {k: v for k, v in c.relevance.items()},
        "forbiddenDocIds": case.forbidden_doc_ids,
        "expectNoAnswer": case.expect_no_answer,
        "status": c.status,
        "error": c.error,
        "metrics": c.metrics,
        "abstained": c.abstained if case.expect_no_answer else None,
        "latencyMs": c.latency_ms,
        "fallbackUsed": c.result.fallback_used if c.result else None,
        "rankedDocuments": ranked,
        "filterStats": c.stage_stats,
        "afterStage": c.after_stage,
        "lost": c.lost,
        "forbiddenFound": c.forbidden_found,
        "missingFromIndex": c.missing_from_index,
    }


# -- writing -----------------------------------------------------------------------------------------


def write_reports(report: dict[str, Any], settings: EvaluateSettings, markdown: str | None) -> list[Path]:
    """Write the timestamped and the `-latest` files; returns the paths written."""
    out = Path(settings.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _now().strftime("%Y%m%dT%H%M%SZ")
    written: list[Path] = []
    payloads: list[tuple[str, str]] = []
    if settings.write_json:
        payloads.append(("json", json.dumps(report, ensure_ascii=False, indent=2) + "\n"))
    if settings.write_markdown and markdown is not None:
        payloads.append(("md", markdown))
    for suffix, text in payloads:
        for name in (
            f"{settings.report_prefix}-{stamp}.{suffix}",
            f"{settings.report_prefix}-latest.{suffix}",
        ):
            path = out / name
            _atomic_write(path, text)
            written.append(path)
    return written


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _now() -> datetime:
    return datetime.now(UTC)


# -- Markdown ----------------------------------------------------------------------------------------


def render_markdown(report: dict[str, Any]) -> str:
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
    s = report["summary"]
    models = run.get("models", {})
    lines += [
        "## Run",
        "",
        "| | |",
        "|---|---|",
        f"| Golden set | `{run['goldenSet']}` (version {run.get('datasetVersion') or 'n/a'}) |",
        f"| Cases | {s['cases']} ({s['scoredCases']} scored, {s['noAnswer']['cases']} no-answer, "
        f"{s['failed']} failed) |",
        f"| K | {run['k']} (a case's own topK wins) |",
        f"| Embedder | {_ident(models.get('embedder'))} |",
        f"| Reranker | {models.get('reranker') or 'none (rerank stage skipped)'} |",
        f"| Store | {run.get('store', '')} ({run.get('chunks', '?')} chunks) |",
        f"| Chain | {run.get('chainSummary', '')} |",
        f"| Chain settings | {_cell(run.get('chainSettings', ''), 2000)} |",
        f"| Code version | {run.get('codeVersion', 'unknown')} |",
        f"| Duration | {run['durationMs'] / 1000:.1f} s |",
        "",
        "## Summary",
        "",
        "| Metric | Value |",
        "|---|---|",
    ]
    k = run["k"]
    for label, key in (
        (f"Recall@{k}", "recall"),
        (f"HitRate@{k}", "hitRate"),
        (f"MRR@{k}", "mrr"),
        (f"nDCG@{k}", "ndcg"),
        (f"Precision@{k}", "precision"),
        ("Top-1 accuracy", "top1Accuracy"),
        (f"Duplicate rate@{k}", "duplicateRate"),
    ):
        lines.append(f"| {label} | {_f(s[key])} |")
    lat = s["latencyMs"] or {}
    lines += [
        f"| Latency p50 / p95 / max | {_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / "
        f"{_ms(lat.get('max'))} |",
        f"| No-answer: correct abstention / false answer | {_f(s['noAnswer']['correctAbstentionRate'])} / "
        f"{_f(s['noAnswer']['falseAnswerRate'])} ({s['noAnswer']['cases']} cases) |",
        f"| Forbidden documents in top K | {s['forbidden']['hits']} (in {s['forbidden']['cases']} cases) |",
        f"| Expected ids missing from the index | {s['expectedMissingFromIndex']} |",
        "",
    ]
    gate = report["gate"]
    if gate["checks"]:
        lines += [
            "## Gate: " + ("PASSED" if gate["passed"] else "FAILED"),
            "",
            "| Check | Value | Needs | |",
            "|---|---|---|---|",
        ]
        for c in gate["checks"]:
            lines.append(
                f"| {c['name']} | {_f(c['value'])} | {c['op']} {c['threshold']} | "
                f"{'ok' if c['passed'] else '**FAIL**'} |"
            )
        lines.append("")
    lines += [
        "## Per-stage filter statistics",
        "",
        "Removed = candidates (chunks) the stage dropped over all cases; removed relevant = expected ids the "
        "stage made disappear from the list (a filter removing relevant documents is a bug to look at; "
        "dropping a second chunk of a document that stays is not counted). Recall/MRR/nDCG are of the list "
        "after the stage, cut at K.",
        "",
        f"| Stage | Removed | Removed relevant | Avg ms | Recall@{k} | MRR@{k} | nDCG@{k} | Note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for st in report["stages"]:
        a = st["afterStage"]
        note = st["skipped"] or ("" if st["enabled"] else "disabled")
        if st.get("added"):
            note = (note + "; " if note else "") + f"added {st['added']}"
        flag = " ⚠" if st["removedRelevant"] else ""
        lines.append(
            f"| {st['name']} | {st['removed']} | {st['removedRelevant']}{flag} | {_ms(st['latencyMs'])} | "
            f"{_f(a['recall'])} | {_f(a['mrr'])} | {_f(a['ndcg'])} | {note} |"
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
    lines += ["", "## Worst cases", ""]
    worst = _worst(report["cases"])
    if not worst:
        lines.append("Every scored case found all its expected documents at rank 1.")
    else:
        lines += [
            "| Case | Query | nDCG | Expected | Got (top 3) | Where lost |",
            "|---|---|---|---|---|---|",
        ]
        for c in worst:
            got = ", ".join(d["docId"] for d in c["rankedDocuments"][:3]) or "(nothing)"
            lost = "; ".join(f"{x['id']}: {x['where']}" for x in c["lost"]) or "-"
            nd = _f(c["metrics"]["ndcg"]) if c["metrics"] else c["status"]
            lines.append(
                f"| {c['id']} | {_cell(c['query'])} | {nd} | {', '.join(c['expected']) or '-'} | "
                f"{got} | {_cell(lost)} |"
            )
    if report["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    lines += ["", "## Cases", ""]
    for c in report["cases"]:
        lines += _case_markdown(c)
    lines += ["## Conventions", "", run["conventions"], ""]
    return "\n".join(lines) + "\n"


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
    out.append(f"- Latency: {_ms(c['latencyMs'])}" + ("; fallback used" if c["fallbackUsed"] else ""))
    out.append("")
    if c["metrics"]:
        m = c["metrics"]
        out += [
            "| Recall | HitRate | MRR | nDCG | Precision | Top-1 | Duplicates |",
            "|---|---|---|---|---|---|---|",
            f"| {_f(m['recall'])} | {_f(m['hitRate'])} | {_f(m['mrr'])} | {_f(m['ndcg'])} | "
            f"{_f(m['precision'])} | {_f(m['top1Accuracy'])} | {_f(m['duplicateRate'])} |",
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
    if c["rankedDocuments"]:
        out += [
            "| Rank | docId | Source | Title | Dense | BM25 | Rerank | Matched | Reason |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for d in c["rankedDocuments"]:
            sc = d["scores"]
            out.append(
                f"| {d['rank']} | {d['docId']} | {d['source']} | {_cell(d['title'])} | "
                f"{_f(sc.get('dense'))} | "
                f"{_f(sc.get('bm25'), 2)} | {_f(sc.get('rerank'), 2)} | {'yes' if d['matched'] else 'no'} | "
                f"{d['reason']} |"
            )
    else:
        out.append("No documents returned.")
    out.append("")
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


def _f(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ms(value: Any) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def _cell(text: str, limit: int = 120) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:limit]


__all__ = [
    "NOT_IN_INDEX",
    "NOT_RETRIEVED",
    "RANKED_OUT",
    "build_report",
    "invalid_report",
    "render_markdown",
    "summarize",
    "write_reports",
]
