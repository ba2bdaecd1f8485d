"""The evaluation report as one self-contained HTML page, rendered from the report JSON alone.

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
  `report["sweep"]`, with the recommended points and the current setting marked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from app.evaluation.report.model import Report
from app.evaluation.run.runner import NOT_IN_INDEX, NOT_RETRIEVED
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import HEADLINE, fmt, fmt_p, k_label

TEMPLATES = Path(__file__).with_name("templates")
WORST_CASES = 20

# the tiles follow the Markdown summary's order
TILE_METRICS = HEADLINE

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


def render_html(typed: Report) -> str:
    """The HTML page of a report (`status` ok or invalid), drawn from its JSON (`Report.to_json`), so a
    report read back from its file renders the same."""
    report = typed.to_json()
    view = {
        "report": report,
        "run": report.get("run") or {},
        "k_label": _k_label(report),
        "ok": report.get("status") == "ok",
    }
    if view["ok"]:
        view |= {
            "tiles": tiles(report),
            "funnel": funnel(report),
            "segments": segment_bars(report),
            "groups": report.get("groups") or [],
            "sweep": sweep_chart(report.get("sweep")),
            "worst": worst_cases(report.get("cases") or []),
        }
    return _ENV.get_template("report.html.j2").render(**view)


def _k_label(report: dict[str, Any]) -> str:
    run, summary = report.get("run") or {}, report.get("summary") or {}
    return k_label(run.get("k"), bool(summary.get("kMixed")))


# -- tiles -------------------------------------------------------------------------------------------


def tiles(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One tile per summary metric: its value, its counts and, with a comparison, the baseline delta."""
    s = report["summary"]
    counts = s.get("counts") or {}
    comparison = report.get("comparison") or {}
    compared = comparison.get("metrics") or {}
    scored = counts.get("scoredCases", s.get("scoredCases"))
    count_text = {
        "recall": f"{counts.get('relevantFound')} of {counts.get('relevantTotal')} relevant found"
        if counts.get("relevantTotal")
        else f"{scored} scored cases",
        "hitRate": f"{counts.get('hits')} of {scored} cases hit" if scored else "no scored case",
    }
    out = []
    for key in TILE_METRICS:
        row = compared.get(key)
        out.append(
            {
                "key": key,
                "label": measures.label(key, _k_label(report)),
                "value": s.get(key),
                "counts": count_text.get(key, f"mean over {scored} scored cases"),
                "delta": _delta(row),
            }
        )
    na = s.get("noAnswer") or {}
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
    if s.get("judged") is not None:
        out.append(
            {
                "key": "judged",
                "label": "Judged" + _k_label(report),
                "value": s["judged"],
                "counts": f"{s.get('unjudgedInTopK', 0)} unjudged ids in the top K",
                "delta": None,
            }
        )
    evidence = s.get("evidence") or {}
    if evidence.get("cases"):
        out.append(
            {
                "key": "evidenceHit",
                "label": "Evidence hit" + _k_label(report),
                "value": evidence.get("evidenceHit"),
                "counts": f"{evidence['cases']} cases name evidence chunks",
                "delta": None,
            }
        )
    lat = s.get("latencyMs") or {}
    if lat.get("p95") is not None:
        out.append(
            {
                "key": "latencyP95",
                "label": "Latency p95",
                "value": lat["p95"],
                "digits": 0,
                "unit": " ms",
                "counts": f"single query, {s.get('latencySampleCases', 0)} cases; "
                f"p50 {lat.get('p50') or 0:.0f} ms",
                "delta": None,
            }
        )
    return out


def _delta(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if not row:
        return None
    ci = row.get("ci95")
    return {
        "delta": row["delta"],
        "ci": ci,
        "p": row.get("pValue"),
        "pHolm": row.get("pHolm"),
        "significant": bool(row.get("significant")),
        "baseline": row.get("baseline"),
        "direction": "up" if row["delta"] > 0 else "down" if row["delta"] < 0 else "flat",
    }


# -- funnel ------------------------------------------------------------------------------------------

FUNNEL_WIDTH = 900  # label, bar, then the figures as text
FUNNEL_ROW = 34
FUNNEL_LABEL = 150
FUNNEL_BAR = 420


def funnel(report: dict[str, Any]) -> dict[str, Any]:
    """The per-stage funnel (see the module docstring for what each figure means)."""
    cases = report.get("cases") or []
    candidates = sum(int(c.get("originalCount") or 0) for c in cases)
    relevant = sum(
        int(c.get("expectedCount") or 0)
        - sum(1 for x in c.get("lost") or [] if x.get("where") in (NOT_IN_INDEX, NOT_RETRIEVED))
        for c in cases
        if c.get("metrics") is not None
    )
    rows = []
    kept, rel = candidates, relevant
    for st in report.get("stages") or []:
        if st["name"] != "candidates":
            kept = kept - int(st.get("removed") or 0) + int(st.get("added") or 0)
            rel = rel - int(st.get("removedRelevant") or 0)
        note = st.get("skipped") or ("" if st.get("enabled", True) else "disabled")
        rows.append(
            {
                "name": st["name"],
                "kept": kept,
                "removed": int(st.get("removed") or 0),
                "added": int(st.get("added") or 0),
                "relevantKept": rel,
                "removedRelevant": int(st.get("removedRelevant") or 0),
                "recall": (st.get("afterStage") or {}).get("recall"),
                "latencyMs": st.get("latencyMs"),
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


def segment_bars(report: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for i, sg in enumerate(report.get("segments") or []):
        m = sg.get("metrics") or {}
        ndcg = m.get("ndcg")
        delta = ((sg.get("delta") or {}).get("metrics") or {}).get("ndcg")
        rows.append(
            {
                "kind": sg.get("kind"),
                "name": sg.get("name"),
                "cases": sg.get("cases"),
                "small": sg.get("small"),
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
SERIES = (
    ("recall", "Recall", "#2563eb"),
    ("correctAbstention", "Correct abstention", "#16a34a"),
    ("meanResults", "Mean results (right axis)", "#d97706"),
)


def sweep_chart(sweep: dict[str, Any] | None) -> dict[str, Any] | None:
    """The sweep curve's geometry from the report's `sweep` section (None when the sweep is off)."""
    if not sweep or not sweep.get("rows"):
        return None
    param = sweep.get("param") or next(iter(sweep.get("grid") or {}), "")
    rows = [
        r
        for r in sweep["rows"]
        if isinstance((r.get("params") or {}).get(param), int | float) and isinstance(r.get("metrics"), dict)
    ]
    if not rows:
        return None
    rows.sort(key=lambda r: r["params"][param])
    xs = [float(r["params"][param]) for r in rows]
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1.0
    plot_w = SWEEP_W - SWEEP_PAD["left"] - SWEEP_PAD["right"]
    plot_h = SWEEP_H - SWEEP_PAD["top"] - SWEEP_PAD["bottom"]
    max_results = max([float(r["metrics"].get("meanResults") or 0) for r in rows] + [1.0])

    def px(x: float) -> float:
        return round(SWEEP_PAD["left"] + plot_w * (x - x0) / span, 2)

    def py(y: float, top: float = 1.0) -> float:
        return round(SWEEP_PAD["top"] + plot_h * (1 - y / top), 2)

    series = []
    for key, label, colour in SERIES:
        top = max_results if key == "meanResults" else 1.0
        points = [
            {
                "x": px(float(r["params"][param])),
                "y": py(float(r["metrics"][key]), top),
                "param": r["params"][param],
                "value": r["metrics"][key],
            }
            for r in rows
            if r["metrics"].get(key) is not None
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
    rec = sweep.get("recommendation") or {}
    for name, label, colour in (
        ("abstention", "Recommended for abstention", "#16a34a"),
        ("best", "Best nDCG passing the gate", "#7c3aed"),
    ):
        point = (rec.get(name) or {}).get("point") or {}
        if isinstance(point.get(param), int | float):
            marks.append(
                {
                    "name": name,
                    "label": label,
                    "colour": colour,
                    "value": point[param],
                    "x": px(float(point[param])),
                    "metrics": rec[name].get("metrics") or {},
                }
            )
    current = ((sweep.get("current") or {}).get("point") or {}).get(param)
    if isinstance(current, int | float) and x0 <= current <= x1:
        marks.append(
            {
                "name": "current",
                "label": "Current setting",
                "colour": "#6b7280",
                "value": current,
                "x": px(float(current)),
                "metrics": (sweep.get("current") or {}).get("metrics") or {},
            }
        )
    x_ticks = [{"x": px(x0 + span * i / 4), "label": f"{x0 + span * i / 4:.3f}"} for i in range(5)]
    y_ticks = [
        {"y": py(i / 4), "label": f"{i / 4:.2f}", "right": f"{max_results * i / 4:.1f}"} for i in range(5)
    ]
    # the other parameters of the rows (e.g. chain.fallback.enabled=false during a threshold sweep)
    others = sorted({k for r in rows for k in r["params"] if k != param})
    held = {k: sorted({json.dumps(r["params"].get(k)) for r in rows}) for k in others}
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
        "current": sweep.get("current"),
        "costMs": sweep.get("costMs") or {},
    }


# -- cases -------------------------------------------------------------------------------------------


def worst_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases worth a look first, worst first: failed, then no-answer cases that answered, then by
    nDCG and recall; a case with a forbidden document in its top K is always in (the Markdown's order)."""

    def badness(c: dict[str, Any]) -> tuple[float, float, str]:
        if c.get("status") == "failed":
            return (-1.0, 0.0, c["id"])
        if c.get("expectNoAnswer"):
            return (0.0 if not c.get("abstained") else 2.0, 0.0, c["id"])
        m = c.get("metrics") or {}
        return (m.get("ndcg", 0.0), m.get("recall", 0.0), c["id"])

    bad = [c for c in cases if badness(c)[0] < 1.0 or c.get("forbiddenFound")]
    return sorted(bad, key=badness)[:WORST_CASES]
