"""The evaluation report as one self-contained HTML page, rendered from the typed `Report` alone.

The page opens from disk with no network: the CSS and a few lines of JavaScript (sortable columns) are
inline, the charts are SVG drawn here, and a Content-Security-Policy forbids every outside fetch. Golden
queries and document text are untrusted, so the Jinja2 environment escapes everything by default.

The template reads a `Page`: the report itself, and small frozen records for what is drawn from it (tiles,
funnel, segment bars, sweep curve), each holding its figures and its geometry.

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
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from app.evaluation.compare.comparison import BUDGET_LABELS
from app.evaluation.compare.gate import GATE_RULE
from app.evaluation.render.markdown import k_label, ranks_text
from app.evaluation.render.tune import figure_columns
from app.evaluation.report.model import (
    CaseRecord,
    Group,
    MetricComparison,
    ParamValue,
    PointFigures,
    Report,
    RunInfo,
    Segment,
    StageRow,
    Summary,
    Sweep,
    SweepCost,
    SweepPoint,
    SweepRow,
    worst_cases,
)
from app.evaluation.run.runner import NOT_IN_INDEX, NOT_RETRIEVED
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import fmt, fmt_p

TEMPLATES = Path(__file__).with_name("templates")

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


# -- tiles -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    """A tile's change against the baseline: `delta` = current − baseline, its 95% CI, p and the adjusted p
    (max-T over the gated measures), and which way it went ("up", "down" or "flat")."""

    delta: float
    ci: tuple[float, float] | None
    p: float
    p_adjusted: float | None
    significant: bool
    baseline: float
    direction: str


@dataclass(frozen=True)
class Tile:
    """One summary figure: `value` shown with `digits` decimals and `unit`, the counts behind it and, with a
    comparison, its `delta`."""

    key: str
    label: str
    value: float | None
    counts: str
    delta: Delta | None = None
    digits: int = 3
    unit: str = ""


def tiles(report: Report) -> list[Tile]:
    """One tile per summary metric (its value, its counts and, with a comparison, the baseline delta), then
    correct abstention, Judged@K, evidence hit and latency p95 where the report has them."""
    s = report.summary or Summary()
    kl = k_label(report)
    extras = (
        _abstention_tile(s),
        _judged_tile(s, kl),
        _evidence_tile(s, kl),
        _evidence_chars_tile(s, kl),
        _latency_tile(s),
    )
    return _metric_tiles(report, s, kl) + [t for t in extras if t is not None]


def _metric_tiles(report: Report, s: Summary, kl: str) -> list[Tile]:
    """A tile per headline measure (`measures.HEADLINE`, read when called, in the Markdown summary's order):
    the figure, what it counts and its delta against the baseline."""
    counts = s.counts
    compared = report.comparison.metrics if report.comparison is not None else {}
    scored = counts.scored_cases or s.scored_cases
    count_text = {
        "recall": f"{counts.relevant_found} of {counts.relevant_total} relevant found"
        if counts.relevant_total
        else f"{scored} scored cases",
        "hitRate": f"{counts.hits} of {scored} cases hit" if scored else "no scored case",
    }
    return [
        Tile(
            key=key,
            label=measures.label(key, kl),
            value=s.figure(key),
            counts=count_text.get(key, f"mean over {scored} scored cases"),
            delta=_delta(compared.get(key)),
        )
        for key in measures.HEADLINE
    ]


def _abstention_tile(s: Summary) -> Tile | None:
    """Correct abstention over the no-answer cases (None without any)."""
    na = s.no_answer
    n = na.cases
    if not n:
        return None
    rate = na.correct_abstention_rate
    abstained = round((rate or 0) * n)
    counts = f"{abstained} of {n} no-answer cases returned nothing"
    return Tile(key="correctAbstention", label="Correct abstention", value=rate, counts=counts)


def _judged_tile(s: Summary, kl: str) -> Tile | None:
    """Judged@K, the share of the top K with a judgment (None when the report has no judgments)."""
    if s.judged is None:
        return None
    counts = f"{s.unjudged_in_top_k} unjudged ids in the top K"
    return Tile(key="judged", label="Judged" + kl, value=s.judged, counts=counts)


def _evidence_tile(s: Summary, kl: str) -> Tile | None:
    """EvidenceHit@K over the cases that name evidence (None without any)."""
    evidence = s.evidence
    if not evidence.cases:
        return None
    counts = f"{evidence.cases} cases name evidence"
    return Tile(key="evidenceHit", label="Evidence hit" + kl, value=evidence.evidence_hit, counts=counts)


def _evidence_chars_tile(s: Summary, kl: str) -> Tile | None:
    """EvidenceCharRecall@K, with CharPrecision and the context characters (None without evidence spans)."""
    evidence = s.evidence
    if not evidence.char_cases or evidence.evidence_char_recall is None:
        return None
    context = s.budget.get("contextChars")
    counts = f"CharPrecision {evidence.char_precision or 0:.3f}" + (
        f"; {context:.0f} context characters a case" if context is not None else ""
    )
    return Tile(
        key="evidenceCharRecall",
        label="Evidence characters" + kl,
        value=evidence.evidence_char_recall,
        counts=counts,
    )


def _latency_tile(s: Summary) -> Tile | None:
    """The single-query latency p95 in whole ms, with the sample and the p50 (None when not timed)."""
    lat = s.latency_ms or {}
    if lat.get("p95") is None:
        return None
    return Tile(
        key="latencyP95",
        label="Latency p95",
        value=lat["p95"],
        counts=f"single query, {s.latency_sample_cases} cases; p50 {lat.get('p50') or 0:.0f} ms",
        digits=0,
        unit=" ms",
    )


def _delta(row: MetricComparison | None) -> Delta | None:
    if row is None:
        return None
    return Delta(
        delta=row.delta,
        ci=row.ci95,
        p=row.p_value,
        p_adjusted=row.p_adjusted,
        significant=row.significant,
        baseline=row.baseline,
        direction="up" if row.delta > 0 else "down" if row.delta < 0 else "flat",
    )


# -- funnel ------------------------------------------------------------------------------------------

FUNNEL_WIDTH = 900  # label, bar, then the figures as text
FUNNEL_ROW = 34
FUNNEL_LABEL = 150
FUNNEL_BAR = 420


@dataclass(frozen=True)
class FunnelRow:
    """One stage of the funnel: what it kept, removed and added over all cases, the relevant ids still in
    the list, the recall after it, and its bars (`y` its offset, `width` and `rel_width` their lengths)."""

    name: str
    kept: int
    removed: int
    added: int
    relevant_kept: int
    removed_relevant: int
    recall: float | None
    latency_ms: float | None
    note: str
    y: int
    width: float
    rel_width: float


@dataclass(frozen=True)
class Funnel:
    """The stage funnel: a row per stage over `candidates` candidates and `relevant` relevant ids, drawn
    `width` wide with a `label` column and bars up to `bar` long."""

    rows: list[FunnelRow]
    candidates: int
    relevant: int
    height: int
    width: int = FUNNEL_WIDTH
    label: int = FUNNEL_LABEL
    bar: int = FUNNEL_BAR


def funnel(report: Report) -> Funnel:
    """The per-stage funnel (see the module docstring for what each figure means)."""
    candidates = sum(c.outcome.original_count or 0 for c in report.cases)
    relevant = _relevant_candidates(report.cases)
    counted = _kept_after_stages(report.stages, candidates, relevant)
    # the grey bar is scaled to the most candidates, the green one to the relevant ids among the
    # candidates (a few dozen against thousands would not show on one scale)
    top = max([kept for _, kept, _ in counted] + [1])
    rows = [
        FunnelRow(
            name=st.name,
            kept=kept,
            removed=st.removed,
            added=st.added,
            relevant_kept=rel,
            removed_relevant=st.removed_relevant,
            recall=st.after_stage.get("recall"),
            latency_ms=st.latency_ms,
            note=st.skipped or ("" if st.enabled else "disabled"),
            y=i * FUNNEL_ROW,
            width=round(FUNNEL_BAR * max(kept, 0) / top, 2),
            rel_width=round(FUNNEL_BAR * max(rel, 0) / max(relevant, 1), 2),
        )
        for i, (st, kept, rel) in enumerate(counted)
    ]
    return Funnel(rows=rows, candidates=candidates, relevant=relevant, height=max(len(rows), 1) * FUNNEL_ROW)


def _relevant_candidates(cases: list[CaseRecord]) -> int:
    """The expected ids of the scored cases that were among the candidates (not lost before the chain)."""
    return sum(
        c.scores.expected_count - sum(1 for x in c.analysis.lost if x.where in (NOT_IN_INDEX, NOT_RETRIEVED))
        for c in cases
        if c.scores.metrics is not None
    )


def _kept_after_stages(
    stages: list[StageRow], candidates: int, relevant: int
) -> list[tuple[StageRow, int, int]]:
    """Each stage with the candidates and the relevant ids still in the list after it."""
    counted = []
    kept, rel = candidates, relevant
    for st in stages:
        if st.name != "candidates":
            kept = kept - st.removed + st.added
            rel = rel - st.removed_relevant
        counted.append((st, kept, rel))
    return counted


# -- segments ----------------------------------------------------------------------------------------

SEGMENT_ROW = 22
SEGMENT_LABEL = 230
SEGMENT_BAR = 300


@dataclass(frozen=True)
class SegmentDeltaView:
    """A segment's nDCG against the baseline: the paired difference and its uncorrected p-value."""

    delta: float
    p_value: float


@dataclass(frozen=True)
class SegmentBar:
    """One segment: its figures, its nDCG delta and its bar (`y` its offset, `width` the bar's length)."""

    kind: str
    name: str
    cases: int
    small: bool
    metrics: dict[str, float | None]
    delta: SegmentDeltaView | None
    y: int
    width: float


@dataclass(frozen=True)
class SegmentChart:
    """The segment bars, drawn with a `label` column and bars up to `bar` long; `columns` the figures of the
    segment table, the gated measures (`measures.GATED`)."""

    rows: list[SegmentBar]
    height: int
    columns: list[Column]
    label: int = SEGMENT_LABEL
    bar: int = SEGMENT_BAR
    width: int = SEGMENT_LABEL + SEGMENT_BAR + 60


def segment_bars(report: Report) -> SegmentChart:
    """A bar of mean nDCG@K per segment, in the report's order."""
    rows = [_segment_bar(i, sg) for i, sg in enumerate(report.segments)]
    columns = [
        Column(key, measures.measure(key).header(), measures.measure(key).digits) for key in measures.GATED
    ]
    return SegmentChart(rows=rows, height=max(len(rows), 1) * SEGMENT_ROW, columns=columns)


def _segment_bar(i: int, sg: Segment) -> SegmentBar:
    ndcg = sg.metrics.get("ndcg")
    delta = sg.delta.metrics.get("ndcg") if sg.delta is not None else None
    return SegmentBar(
        kind=sg.kind,
        name=sg.name,
        cases=sg.cases,
        small=sg.small,
        metrics=sg.metrics,
        delta=SegmentDeltaView(delta=delta["delta"], p_value=delta["pValue"]) if delta else None,
        y=i * SEGMENT_ROW,
        width=round(SEGMENT_BAR * (ndcg or 0.0), 2),
    )


# -- threshold sweep ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Padding:
    """The space around the sweep's plot, for the axes' labels."""

    left: int
    right: int
    top: int
    bottom: int


SWEEP_W, SWEEP_H = 640, 300
SWEEP_PAD = Padding(left=50, right=60, top=20, bottom=40)
# (the figure's JSON name, its PointFigures field, label, colour)
SERIES = (
    ("recall", "recall", "Recall", "#2563eb"),
    ("correctAbstention", "correct_abstention", "Correct abstention", "#16a34a"),
    ("meanResults", "mean_results", "Mean results (right axis)", "#d97706"),
)


@dataclass(frozen=True)
class CurvePoint:
    """A point of a sweep curve: where it is drawn, the swept value and the figure."""

    x: float
    y: float
    param: int | float
    value: float


@dataclass(frozen=True)
class Curve:
    """One figure over the swept values: its points and their SVG polyline `path`."""

    key: str
    label: str
    colour: str
    points: list[CurvePoint]
    path: str


@dataclass(frozen=True)
class Mark:
    """A vertical line at a swept value: a recommendation ("abstention", "best") or the "current" setting,
    with the figures at that point."""

    name: str
    label: str
    colour: str
    value: int | float
    x: float
    metrics: PointFigures


@dataclass(frozen=True)
class XTick:
    """A swept value under the x axis."""

    x: float
    label: str


@dataclass(frozen=True)
class YTick:
    """A grid line: its left label (the rates, 0 to 1) and its right one (the mean results)."""

    y: float
    label: str
    right: str


@dataclass(frozen=True)
class Column:
    """A figure column of a table: its JSON name, header and digits (0: a whole count)."""

    key: str
    header: str
    digits: int


@dataclass(frozen=True)
class SweepChart:
    """The sweep curve: the rows of `param`, the other parameters they `held` (name -> values), the curves,
    the marks, the ticks and the plot's size; `columns` the figures of its table of points, as the tune
    table shows them."""

    param: str
    held: dict[str, str]
    rows: list[SweepRow]
    columns: list[Column]  # as the tune table shows them (`render.tune.figure_columns`)
    series: list[Curve]
    marks: list[Mark]
    x_ticks: list[XTick]
    y_ticks: list[YTick]
    plot_w: int
    plot_h: int
    current: SweepPoint
    cost_ms: SweepCost
    width: int = SWEEP_W
    height: int = SWEEP_H
    pad: Padding = SWEEP_PAD


@dataclass(frozen=True)
class Axes:
    """The sweep's scales: the swept values from `x0` to `x1` across the plot, the rates from 0 to 1 up it
    (the mean results from 0 to `max_results` on the right axis)."""

    x0: float
    x1: float
    max_results: float
    plot_w: int = SWEEP_W - SWEEP_PAD.left - SWEEP_PAD.right
    plot_h: int = SWEEP_H - SWEEP_PAD.top - SWEEP_PAD.bottom

    @property
    def span(self) -> float:
        return (self.x1 - self.x0) or 1.0

    def x(self, value: float) -> float:
        return round(SWEEP_PAD.left + self.plot_w * (value - self.x0) / self.span, 2)

    def y(self, value: float, top: float = 1.0) -> float:
        return round(SWEEP_PAD.top + self.plot_h * (1 - value / top), 2)


def sweep_chart(sweep: Sweep | None) -> SweepChart | None:
    """The sweep curve's geometry from the report's `sweep` (None when the sweep is off)."""
    if sweep is None or not sweep.rows:
        return None
    param = sweep.param or next(iter(sweep.grid), "")
    rows = sorted(
        (r for r in sweep.rows if isinstance(r.params.get(param), int | float)),
        key=lambda r: _numeric(r.params[param]),
    )
    if not rows:
        return None
    xs = [float(_numeric(r.params[param])) for r in rows]
    axes = Axes(
        x0=min(xs), x1=max(xs), max_results=max([float(r.metrics.mean_results or 0) for r in rows] + [1.0])
    )
    return SweepChart(
        param=param,
        held=_held(rows, param),
        rows=rows,
        columns=[Column(*column) for column in figure_columns()],
        series=[_curve(rows, param, axes, *spec) for spec in SERIES],
        marks=_marks(sweep, param, axes),
        x_ticks=[XTick(x=axes.x(v), label=f"{v:.3f}") for v in _quarters(axes.x0, axes.span)],
        y_ticks=[
            YTick(y=axes.y(i / 4), label=f"{i / 4:.2f}", right=f"{axes.max_results * i / 4:.1f}")
            for i in range(5)
        ],
        plot_w=axes.plot_w,
        plot_h=axes.plot_h,
        current=sweep.current,
        cost_ms=sweep.cost_ms,
    )


def _numeric(value: ParamValue) -> int | float:
    """A swept value the chart plots: the chart keeps the rows whose value is a number."""
    if isinstance(value, int | float):
        return value
    raise TypeError(f"not a number: {value!r}")


def _quarters(start: float, span: float) -> list[float]:
    """The x axis' five ticks: the ends of the swept range and its quarters."""
    return [start + span * i / 4 for i in range(5)]


def _curve(
    rows: list[SweepRow], param: str, axes: Axes, key: str, attr: str, label: str, colour: str
) -> Curve:
    """One figure (`attr` of PointFigures) over the rows; the mean results go against the right axis."""
    top = axes.max_results if key == "meanResults" else 1.0
    points = [
        CurvePoint(
            x=axes.x(float(_numeric(r.params[param]))),
            y=axes.y(float(getattr(r.metrics, attr)), top),
            param=_numeric(r.params[param]),
            value=getattr(r.metrics, attr),
        )
        for r in rows
        if getattr(r.metrics, attr) is not None
    ]
    path = " ".join(f"{p.x},{p.y}" for p in points)
    return Curve(key=key, label=label, colour=colour, points=points, path=path)


def _marks(sweep: Sweep, param: str, axes: Axes) -> list[Mark]:
    """The recommended points that have a numeric value of `param`, then the current setting when it lies
    within the swept range."""
    marks = []
    rec = sweep.recommendation
    for name, label, colour, chosen in (
        ("abstention", "Recommended for abstention", "#16a34a", rec.abstention),
        ("best", "Best nDCG passing the gate", "#7c3aed", rec.best),
    ):
        value = chosen.point.get(param) if chosen is not None else None
        if chosen is not None and isinstance(value, int | float):
            marks.append(
                Mark(
                    name=name,
                    label=label,
                    colour=colour,
                    value=value,
                    x=axes.x(float(value)),
                    metrics=chosen.metrics,
                )
            )
    current = sweep.current.point.get(param)
    if isinstance(current, int | float) and axes.x0 <= current <= axes.x1:
        marks.append(
            Mark(
                name="current",
                label="Current setting",
                colour="#6b7280",
                value=current,
                x=axes.x(float(current)),
                metrics=sweep.current.metrics,
            )
        )
    return marks


def _held(rows: list[SweepRow], param: str) -> dict[str, str]:
    """The other parameters of the rows (e.g. chain.fallback.enabled=false during a threshold sweep), each
    with its values as JSON."""
    others = sorted({k for r in rows for k in r.params if k != param})
    return {k: ", ".join(sorted({json.dumps(r.params.get(k)) for r in rows})) for k in others}


# -- the page ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """What the template reads: the report, its run and cut-off label and, for a report that ran (`ok`), the
    tiles, charts and worst cases drawn from it."""

    report: Report
    run: RunInfo
    k_label: str
    ok: bool
    tiles: list[Tile] = field(default_factory=list)
    funnel: Funnel | None = None
    segments: SegmentChart | None = None
    groups: list[Group] = field(default_factory=list)
    sweep: SweepChart | None = None
    worst: list[CaseRecord] = field(default_factory=list)
    gate_rule: str = GATE_RULE
    budget_labels: Mapping[str, str] = field(default_factory=lambda: BUDGET_LABELS)


def report_page(report: Report) -> Page:
    """The page of a report; the charts only when it ran (`status` ok)."""
    if report.status != "ok":
        return Page(report=report, run=report.run, k_label=k_label(report), ok=False)
    return Page(
        report=report,
        run=report.run,
        k_label=k_label(report),
        ok=True,
        tiles=tiles(report),
        funnel=funnel(report),
        segments=segment_bars(report),
        groups=report.groups,
        sweep=sweep_chart(report.sweep),
        worst=worst_cases(report.cases),
    )


def render_html(report: Report) -> str:
    """The HTML page of a report (`status` ok or invalid), drawn from the typed report, so a report read
    back from its file (`Report.model_validate_json`) renders the same."""
    view = report_page(report)
    names = {f.name: getattr(view, f.name) for f in fields(view)}
    return _ENV.get_template("report.html.j2").render(names)
