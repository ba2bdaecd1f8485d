"""The evaluation report as one self-contained HTML page, rendered from the typed `Report` alone.

The page opens from disk with no network: the CSS and a few lines of JavaScript (sortable columns) are
inline, the charts are SVG drawn here, and a Content-Security-Policy forbids every outside fetch. Golden
queries and document text are untrusted, so the Jinja2 environment escapes everything by default.

Charts:
- funnel: per stage, the candidates kept over all cases (`kept` = candidates − removed + added, from the
  report's `stages` section, starting from the sum of the cases' `originalCount`), the relevant ids kept
  (relevant ids among the candidates − the stage's and the earlier stages' `removedRelevant`; a fallback's
  re-added documents are not counted back) and the mean Recall@K of the list after the stage;
- segments: mean nDCG@K per segment;
- sweep: recall, correct abstention and mean results against the swept parameter, one point per row of
  the report's `sweep`, with the recommended points and the current setting marked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from app.evaluation.compare.comparison import BUDGET_LABELS
from app.evaluation.compare.gate import GATE_RULE
from app.evaluation.render.markdown import k_label, ranks_text
from app.evaluation.report.model import MetricComparison, Report, Summary, Sweep, worst_cases
from app.evaluation.run.runner import NOT_IN_INDEX, NOT_RETRIEVED
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import HEADLINE, fmt, fmt_p

TEMPLATES = Path(__file__).with_name("templates")

# the tiles follow the Markdown summary's order
TILE_METRICS = HEADLINE
# a summary figure's JSON name -> its Summary field ("top1Accuracy" -> "top1_accuracy")
_SUMMARY_FIELDS = {info.alias or name: name for name, info in Summary.model_fields.items()}

_ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=True,  # every query, title and snippet is untrusted text
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


_ENV.filters["f"] = fmt
_ENV.filters["p"] = fmt_p
_ENV.filters["ranks"] = ranks_text


def render_html(report: Report) -> str:
    """The HTML page of a report (`status` ok or invalid), drawn from the typed report, so a report read
    back from its file (`Report.model_validate_json`) renders the same."""
    view: dict[str, Any] = {
        "report": report,
        "run": report.run,
        "k_label": k_label(report),
        "ok": report.status == "ok",
    }
    if view["ok"]:
        view |= {
            "tiles": tiles(report),
            "funnel": funnel(report),
            "segments": segment_bars(report),
            "groups": report.groups,
            "sweep": sweep_chart(report.sweep),
            "worst": worst_cases(report.cases),
            "gate_rule": GATE_RULE,
            "budget_labels": BUDGET_LABELS,
        }
    return _ENV.get_template("report.html.j2").render(**view)


# -- tiles -------------------------------------------------------------------------------------------


def tiles(report: Report) -> list[dict[str, Any]]:
    """One tile per summary metric: its value, its counts and, with a comparison, the baseline delta."""
    s = report.summary or Summary()
    counts = s.counts
    compared = report.comparison.metrics if report.comparison is not None else {}
    scored = counts.get("scoredCases", s.scored_cases)
    count_text = {
        "recall": f"{counts.get('relevantFound')} of {counts.get('relevantTotal')} relevant found"
        if counts.get("relevantTotal")
        else f"{scored} scored cases",
        "hitRate": f"{counts.get('hits')} of {scored} cases hit" if scored else "no scored case",
    }
    out = []
    for key in TILE_METRICS:
        out.append(
            {
                "key": key,
                "label": measures.label(key, k_label(report)),
                "value": getattr(s, _SUMMARY_FIELDS[key]),
                "counts": count_text.get(key, f"mean over {scored} scored cases"),
                "delta": _delta(compared.get(key)),
            }
        )
    na = s.no_answer
    n = na.get("cases") or 0
    if n:
        rate = na.get("correctAbstentionRate")
        abstained = round((rate or 0) * n)
        out.append(
            {
                "key": "correctAbstention",
                "label": "Correct abstention",
                "value": rate,
                "counts": f"{abstained} of {n} no-answer cases returned nothing",
                "delta": None,
            }
        )
    if s.judged is not None:
        out.append(
            {
                "key": "judged",
                "label": "Judged" + k_label(report),
                "value": s.judged,
                "counts": f"{s.unjudged_in_top_k} unjudged ids in the top K",
                "delta": None,
            }
        )
    evidence = s.evidence
    if evidence.get("cases"):
        out.append(
            {
                "key": "evidenceHit",
                "label": "Evidence hit" + k_label(report),
                "value": evidence.get("evidenceHit"),
                "counts": f"{evidence['cases']} cases name evidence chunks",
                "delta": None,
            }
        )
    lat = s.latency_ms or {}
    if lat.get("p95") is not None:
        out.append(
            {
                "key": "latencyP95",
                "label": "Latency p95",
                "value": lat["p95"],
                "digits": 0,
                "unit": " ms",
                "counts": f"single query, {s.latency_sample_cases} cases; p50 {lat.get('p50') or 0:.0f} ms",
                "delta": None,
            }
        )
    return out


def _delta(row: MetricComparison | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "delta": row.delta,
        "ci": row.ci95,
        "p": row.p_value,
        "pHolm": row.p_holm,
        "significant": row.significant,
        "baseline": row.baseline,
        "direction": "up" if row.delta > 0 else "down" if row.delta < 0 else "flat",
    }


# -- funnel ------------------------------------------------------------------------------------------

FUNNEL_WIDTH = 900  # label, bar, then the figures as text
FUNNEL_ROW = 34
FUNNEL_LABEL = 150
FUNNEL_BAR = 420


def funnel(report: Report) -> dict[str, Any]:
    """The per-stage funnel (see the module docstring for what each figure means)."""
    cases = report.cases
    candidates = sum(c.original_count or 0 for c in cases)
    relevant = sum(
        c.expected_count - sum(1 for x in c.lost if x.where in (NOT_IN_INDEX, NOT_RETRIEVED))
        for c in cases
        if c.metrics is not None
    )
    rows: list[dict[str, Any]] = []
    kept, rel = candidates, relevant
    for st in report.stages:
        if st.name != "candidates":
            kept = kept - st.removed + st.added
            rel = rel - st.removed_relevant
        note = st.skipped or ("" if st.enabled else "disabled")
        rows.append(
            {
                "name": st.name,
                "kept": kept,
                "removed": st.removed,
                "added": st.added,
                "relevantKept": rel,
                "removedRelevant": st.removed_relevant,
                "recall": st.after_stage.get("recall"),
                "latencyMs": st.latency_ms,
                "note": note,
            }
        )
    # the grey bar is scaled to the most candidates, the green one to the relevant ids among the
    # candidates (a few dozen against thousands would not show on one scale)
    top = max([r["kept"] for r in rows] + [1])
    for i, r in enumerate(rows):
        r["y"] = i * FUNNEL_ROW
        r["width"] = round(FUNNEL_BAR * max(r["kept"], 0) / top, 2)
        r["relWidth"] = round(FUNNEL_BAR * max(r["relevantKept"], 0) / max(relevant, 1), 2)
    return {
        "rows": rows,
        "candidates": candidates,
        "relevant": relevant,
        "width": FUNNEL_WIDTH,
        "label": FUNNEL_LABEL,
        "bar": FUNNEL_BAR,
        "height": max(len(rows), 1) * FUNNEL_ROW,
    }


# -- segments ----------------------------------------------------------------------------------------

SEGMENT_ROW = 22
SEGMENT_LABEL = 230
SEGMENT_BAR = 300


def segment_bars(report: Report) -> dict[str, Any]:
    rows = []
    for i, sg in enumerate(report.segments):
        m = sg.metrics
        ndcg = m.get("ndcg")
        delta = sg.delta.metrics.get("ndcg") if sg.delta is not None else None
        rows.append(
            {
                "kind": sg.kind,
                "name": sg.name,
                "cases": sg.cases,
                "small": sg.small,
                "metrics": m,
                "delta": delta,
                "y": i * SEGMENT_ROW,
                "width": round(SEGMENT_BAR * (ndcg or 0.0), 2),
            }
        )
    return {
        "rows": rows,
        "label": SEGMENT_LABEL,
        "bar": SEGMENT_BAR,
        "height": max(len(rows), 1) * SEGMENT_ROW,
        "width": SEGMENT_LABEL + SEGMENT_BAR + 60,
    }


# -- threshold sweep ---------------------------------------------------------------------------------

SWEEP_W, SWEEP_H = 640, 300
SWEEP_PAD = {"left": 50, "right": 60, "top": 20, "bottom": 40}
# (the figure's JSON name, its PointFigures field, label, colour)
SERIES = (
    ("recall", "recall", "Recall", "#2563eb"),
    ("correctAbstention", "correct_abstention", "Correct abstention", "#16a34a"),
    ("meanResults", "mean_results", "Mean results (right axis)", "#d97706"),
)


def sweep_chart(sweep: Sweep | None) -> dict[str, Any] | None:
    """The sweep curve's geometry from the report's `sweep` (None when the sweep is off)."""
    if sweep is None or not sweep.rows:
        return None
    param = sweep.param or next(iter(sweep.grid), "")
    rows = sorted(
        (r for r in sweep.rows if isinstance(r.params.get(param), int | float)),
        key=lambda r: r.params[param],
    )
    if not rows:
        return None
    xs = [float(r.params[param]) for r in rows]
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1.0
    plot_w = SWEEP_W - SWEEP_PAD["left"] - SWEEP_PAD["right"]
    plot_h = SWEEP_H - SWEEP_PAD["top"] - SWEEP_PAD["bottom"]
    max_results = max([float(r.metrics.mean_results or 0) for r in rows] + [1.0])

    def px(x: float) -> float:
        return round(SWEEP_PAD["left"] + plot_w * (x - x0) / span, 2)

    def py(y: float, top: float = 1.0) -> float:
        return round(SWEEP_PAD["top"] + plot_h * (1 - y / top), 2)

    series = []
    for key, attr, label, colour in SERIES:
        top = max_results if key == "meanResults" else 1.0
        points = [
            {
                "x": px(float(r.params[param])),
                "y": py(float(getattr(r.metrics, attr)), top),
                "param": r.params[param],
                "value": getattr(r.metrics, attr),
            }
            for r in rows
            if getattr(r.metrics, attr) is not None
        ]
        series.append(
            {
                "key": key,
                "label": label,
                "colour": colour,
                "points": points,
                "path": " ".join(f"{p['x']},{p['y']}" for p in points),
            }
        )
    marks = []
    rec = sweep.recommendation
    for name, label, colour, chosen in (
        ("abstention", "Recommended for abstention", "#16a34a", rec.abstention),
        ("best", "Best nDCG passing the gate", "#7c3aed", rec.best),
    ):
        value = chosen.point.get(param) if chosen is not None else None
        if chosen is not None and isinstance(value, int | float):
            marks.append(
                {
                    "name": name,
                    "label": label,
                    "colour": colour,
                    "value": value,
                    "x": px(float(value)),
                    "metrics": chosen.metrics,
                }
            )
    current = sweep.current.point.get(param)
    if isinstance(current, int | float) and x0 <= current <= x1:
        marks.append(
            {
                "name": "current",
                "label": "Current setting",
                "colour": "#6b7280",
                "value": current,
                "x": px(float(current)),
                "metrics": sweep.current.metrics,
            }
        )
    x_ticks = [{"x": px(x0 + span * i / 4), "label": f"{x0 + span * i / 4:.3f}"} for i in range(5)]
    y_ticks = [
        {"y": py(i / 4), "label": f"{i / 4:.2f}", "right": f"{max_results * i / 4:.1f}"} for i in range(5)
    ]
    # the other parameters of the rows (e.g. chain.fallback.enabled=false during a threshold sweep)
    others = sorted({k for r in rows for k in r.params if k != param})
    held = {k: sorted({json.dumps(r.params.get(k)) for r in rows}) for k in others}
    return {
        "param": param,
        "held": {k: ", ".join(v) for k, v in held.items()},
        "rows": rows,
        "series": series,
        "marks": marks,
        "xTicks": x_ticks,
        "yTicks": y_ticks,
        "width": SWEEP_W,
        "height": SWEEP_H,
        "pad": SWEEP_PAD,
        "plotW": plot_w,
        "plotH": plot_h,
        "recommendation": rec,
        "current": sweep.current,
        "cost_ms": sweep.cost_ms,
    }


# -- cases -------------------------------------------------------------------------------------------
