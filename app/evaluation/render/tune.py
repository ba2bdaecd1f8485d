"""The tuning report (`sieve tune`) and the evaluation report's threshold-sweep section, as Markdown, and the
tuning files (`<prefix>-tune-<stamp>.json/.md`, `<prefix>-tune-latest.json/.md`).

Its tables show the registry's tune measures (`measures.TUNE`), one column or row each in registry order,
then a point's own counts (`FORBIDDEN`, `MEAN_RESULTS`); no table here names a measure of its own accord."""

from __future__ import annotations

import json
from pathlib import Path

from app.evaluation.report.model import PointFigures, Sweep, SweepPoint, SweepRow
from app.evaluation.scoring import measures
from app.evaluation.scoring.measures import fmt as _f
from app.evaluation.tune.grid import MIN_DENSE, fmt_value, gain_figure_names
from app.evaluation.tune.model import (
    Agreement,
    Carried,
    FoldsAnalysis,
    FoldSplit,
    HoldoutAnalysis,
    HoldoutSplit,
    Kind,
    KindMeans,
    ParamValue,
    PartCounts,
    PartScores,
    SideScores,
    TuneReport,
    figure,
)
from app.files import atomic_write_text, file_stamp

# A point's own counts, shown after the measures: (JSON name, header, digits); 0 digits: a whole count.
FORBIDDEN = ("forbiddenHits", "Forbidden", 0)
MEAN_RESULTS = ("meanResults", "Mean results", 2)


def measure_columns() -> list[tuple[str, str, int]]:
    """The registry's tune measures (`measures.TUNE`, read at call time), (JSON name, header, digits) each,
    in registry order."""
    return [(key, measures.measure(key).header(), measures.measure(key).digits) for key in measures.TUNE]


def figure_columns() -> list[tuple[str, str, int]]:
    """The tune table's figures: the tune measures, then the counts. The report's HTML sweep table shows the
    same."""
    return [*measure_columns(), FORBIDDEN, MEAN_RESULTS]


def _table(keys: list[str], rows: list[SweepRow]) -> list[str]:
    """One row per replayed point: its values of `keys`, its figures, the gate's verdict and the front."""
    columns = figure_columns()
    head = (
        [k.removeprefix("chain.") for k in keys] + [header for _, header, _ in columns] + ["Gate", "Pareto"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [fmt_value(r.params[k]) for k in keys]
        cells += [_f(figure(r.metrics, name), digits) for name, _, digits in columns]
        cells += ["pass" if r.passes_gate else "FAIL", "★" if r.pareto else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _point_text(point: dict[str, ParamValue]) -> str:
    return ", ".join(f"`{k.removeprefix('chain.')}={fmt_value(v)}`" for k, v in point.items())


def _describe(rec: SweepPoint | None, current: PointFigures) -> str:
    """A recommended point against the current configuration's figures ("none" without one)."""
    if rec is None:
        return "none"
    m = rec.metrics
    return (
        f"{_point_text(rec.point)}: nDCG {_f(current.ndcg)} -> {_f(m.ndcg)}, recall {_f(current.recall)} -> "
        f"{_f(m.recall)}, correct abstention {m.correct_abstentions}/{m.no_answer_cases} "
        f"(now {current.correct_abstentions}/{current.no_answer_cases}), mean results "
        f"{_f(current.mean_results, 2)} -> {_f(m.mean_results, 2)}"
    )


def sweep_markdown(sweep: Sweep | None) -> list[str]:
    """The report's "Threshold sweep" section from its `sweep` (empty when the sweep is off)."""
    if sweep is None:
        return []
    current = sweep.current.metrics
    cost = sweep.cost_ms
    lines = [
        "## Threshold sweep",
        "",
        f"`similarity_threshold.min_dense` replayed over {len(sweep.rows)} values spanning the "
        "candidates' dense scores, with the fallback off (with it on, no threshold can make the chain "
        "abstain), from the "
        "candidates of this run: no model or store call, the same stages and metrics as this report. "
        f"Replay cost {cost.per_point:.1f} ms per point "
        f"(this evaluation: {cost.real_evaluation:.0f} ms).",
        "",
        f"- Current configuration: nDCG {_f(current.ndcg)}, recall {_f(current.recall)}, correct "
        f"abstention {current.correct_abstentions}/{current.no_answer_cases}",
        f"- Recommended abstention threshold: {_describe(sweep.recommendation.abstention, current)}",
        f"- Best nDCG passing the gate: {_describe(sweep.recommendation.best, current)}",
        "",
    ]
    lines += _table([MIN_DENSE], sweep.rows)
    return lines + [""]


def _figure_rows() -> list[tuple[str, str, int]]:
    """The holdout and fold tables' rows: the tune measures, then the mean results and the forbidden hits."""
    return [*measure_columns(), MEAN_RESULTS, FORBIDDEN]


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{round(value, 3) + 0.0:+.3f}"  # + 0.0: no "-0.000"


def _header(name: str) -> str:
    """The header of the figure `name` in the tune tables."""
    return next(header for key, header, _ in _figure_rows() if key == name)


def _part_text(counts: PartCounts) -> str:
    return f"{counts.cases} cases ({counts.scored_cases} scored, {counts.no_answer_cases} no-answer)"


def _holdout_table(current: SideScores, rec: Carried) -> list[str]:
    head = [
        "Figure",
        "Current (tuning)",
        "Recommended (tuning)",
        "Gain (tuning)",
        "Current (held-out)",
        "Recommended (held-out)",
        "Gain (held-out)",
        "Optimism",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    sides = (
        (current.tuning, rec.tuning, rec.gain.tuning),
        (current.held_out, rec.held_out, rec.gain.held_out),
    )
    gains = gain_figure_names()
    for name, label, digits in _figure_rows():
        differenced = name in gains
        cells = [label]
        for now, then, gain in sides:
            cells += [_f(figure(now.metrics, name), digits), _f(figure(then.metrics, name), digits)]
            cells.append(_signed(gain[name]) if differenced else "")
        cells.append(_signed(rec.optimism[name]) if differenced else "")
        lines.append("| " + " | ".join(cells) + " |")
    gate = ["Gate"]
    for now, then, _ in sides:
        gate += [_gate(now), _gate(then), ""]
    lines.append("| " + " | ".join(gate + [""]) + " |")
    return lines


def _gate(scores: PartScores) -> str:
    return "pass" if scores.passes_gate else "FAIL"


_KINDS: tuple[tuple[Kind, str, tuple[str, str]], ...] = (
    ("best", "Best (highest nDCG passing the gate)", ("ndcg", "recall")),
    (
        "abstention",
        "Abstention (most correct abstentions within the tolerance)",
        ("correctAbstention", "recall"),
    ),
)
_GAIN_DEFINITION = (
    "Gain = the recommended point's figure minus the current configuration's, both over the same part's "
    "cases; optimism = gain on the tuning part minus gain on the held-out part (> 0: the cases it was "
    "tuned on flatter the choice by that much, < 0 for the false-answer rate, where lower is better; "
    "about 0: the gain carries over to unseen cases)."
)


def _holdout_markdown(split: HoldoutSplit, holdout: HoldoutAnalysis) -> list[str]:
    parts = holdout.parts
    lines = [
        f"## Holdout: recommended on {parts.tuning.cases} cases, checked on {parts.held_out.cases} held out",
        "",
        f"Split with seed {split.seed} (`rag.evaluate.seed`), holdout fraction {split.fraction}: "
        f"tuning {_part_text(parts.tuning)}, held out {_part_text(parts.held_out)}; stratified by "
        "knowledge tag and case kind, a group's paraphrases on one side (the case ids are in the JSON's "
        "`split.parts`). The points and the recommendation above use the tuning part only.",
        "",
        _GAIN_DEFINITION,
        "",
    ]
    for kind, title, _ in _KINDS:
        rec = holdout.carried(kind)
        if rec is None:
            lines += [f"### {title}: none on the tuning part", ""]
            continue
        lines += [f"### {title}: {_point_text(rec.point)}", ""]
        lines += _holdout_table(holdout.current, rec) + [""]
    return lines


def _arrow(current: PartScores, rec: PartScores, name: str) -> str:
    return f"{_f(figure(current.metrics, name))} → {_f(figure(rec.metrics, name))}"


def _folds_markdown(split: FoldSplit, folds: FoldsAnalysis) -> list[str]:
    k = folds.k
    sizes = ", ".join(str(f.held_out.cases) for f in folds.per_fold)
    lines = [
        f"## Cross-validation: {k} folds",
        "",
        f"Folds with seed {split.seed} (`rag.evaluate.seed`), of {sizes} cases, stratified by knowledge "
        "tag and case kind, a group's paraphrases in one fold (the case ids are in the JSON's "
        f"`split.parts`). For each fold the same rule recommends on the other {k - 1} folds (tuning) and the "
        "choice is scored on the fold (held-out). The points and the recommendation above use every case.",
        "",
        _GAIN_DEFINITION + " Mean = over the folds where the figure is defined.",
        "",
    ]
    for kind, title, names in _KINDS:
        lines += _fold_kind_markdown(folds, kind, title, names)
    return lines


def _fold_kind_markdown(folds: FoldsAnalysis, kind: Kind, title: str, names: tuple[str, str]) -> list[str]:
    """One kind of recommendation fold by fold, the folds' agreement and the means over folds."""
    first, second = names
    lines = [f"### {title}", ""]
    head = [
        "Fold",
        "Held-out cases",
        "Recommended",
        f"{_header(first)} tuning (current → recommended)",
        f"{_header(first)} held-out",
        f"Optimism {_header(first)}",
        f"{_header(second)} held-out",
        f"Optimism {_header(second)}",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fold in folds.per_fold:
        rec, current = fold.carried(kind), fold.current
        cells = [str(fold.fold), _part_text(fold.held_out)]
        if rec is None:
            cells += ["none"] + [""] * 5
        else:
            cells += [
                _point_text(rec.point),
                _arrow(current.tuning, rec.tuning, first),
                _arrow(current.held_out, rec.held_out, first),
                _signed(rec.optimism[first]),
                _arrow(current.held_out, rec.held_out, second),
                _signed(rec.optimism[second]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    mean, agreement = folds.mean.of(kind), folds.agreement.of(kind)
    lines.append("")
    if mean is None:
        return lines + ["No fold had a recommendation.", ""]
    lines += [f"Recommended points: {_agreement_text(agreement)}.", ""]
    return lines + _mean_table(mean) + [""]


def _folds_text(folds: list[int]) -> str:
    return f"fold{'s' if len(folds) > 1 else ''} {', '.join(str(f) for f in folds)}"


def _agreement_text(agreement: Agreement) -> str:
    of = agreement.of
    parts = [
        f"{_point_text(p.point)} in {len(p.folds)} of {of} folds ({_folds_text(p.folds)})"
        for p in agreement.points
    ]
    if agreement.none:
        parts.append(f"none in {_folds_text(agreement.none)}")
    text = "; ".join(parts)
    if agreement.all_cases_point is not None:
        text += f"; the all-cases recommendation in {agreement.all_cases_point} of {agreement.of} folds"
    return text


def _mean_table(mean: KindMeans) -> list[str]:
    head = [
        f"Mean over folds {', '.join(str(f) for f in mean.folds)}",
        "Current (held-out)",
        "Recommended (held-out)",
        "Gain (held-out)",
        "Gain (tuning)",
        "Optimism",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    gains = gain_figure_names()
    for name, label, digits in _figure_rows():
        differenced = name in gains
        digits = max(digits, 2)  # a mean of counts over folds has decimals
        cells = [
            label,
            _f(mean.current.held_out[name], digits),
            _f(mean.recommended.held_out[name], digits),
        ]
        cells += [
            _signed(mean.gain.held_out[name]) if differenced else "",
            _signed(mean.gain.tuning[name]) if differenced else "",
            _signed(mean.optimism[name]) if differenced else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tune_markdown(report: TuneReport) -> str:
    run, cost, split = report.run, report.cost_ms, report.split
    current = report.current.metrics
    keys = list(report.grid)
    scope = ""
    if report.holdout is not None:
        scope = f" (on the tuning part: {report.holdout.parts.tuning.cases} of {run.cases} cases)"
    lines = [
        f"# Sieve tune — {run.started_at}",
        "",
        f"Golden set `{run.golden_set}` ({run.cases} cases), K={run.k}, as of {run.as_of}, "
        f"nDCG gain {run.gain or 'linear'}; "
        f"{len(report.rows)} points over " + ", ".join(f"`{k}`" for k in keys) + ".",
        "",
        f"Cost: candidates {cost.candidates:.0f} ms once (one real evaluation of the current "
        f"configuration: {cost.real_evaluation:.0f} ms), then {cost.per_point:.1f} ms per point.",
        "",
        f"Check: {run.self_check}",
        "",
        f"## Recommendation{scope}",
        "",
        f"- Current configuration ({_point_text(report.current.point)}):"
        f" nDCG {_f(current.ndcg)}, recall {_f(current.recall)}, correct abstention "
        f"{current.correct_abstentions}/{current.no_answer_cases}",
        f"- Best (highest nDCG passing the gate): {_describe(report.recommendation.best, current)}",
        f"- Abstention (most correct abstentions, recall and nDCG within {run.tolerance} of the current): "
        f"{_describe(report.recommendation.abstention, current)}",
        "",
    ]
    if isinstance(split, HoldoutSplit) and report.holdout is not None:
        lines += _holdout_markdown(split, report.holdout)
    elif isinstance(split, FoldSplit) and report.folds is not None:
        lines += _folds_markdown(split, report.folds)
    lines += [
        f"## Points{scope}",
        "",
        "Gate: the configured level and safety checks (latency and regressions are not replayed). "
        "★ = on the Pareto front of nDCG against correct abstention.",
        "",
    ]
    lines += _table(keys, report.rows)
    return "\n".join(lines) + "\n"


def tune_text(report: TuneReport) -> str:
    """The tune JSON file's text: indented by 2, non-ASCII as is, ending in a newline."""
    return json.dumps(report.to_json(), ensure_ascii=False, indent=2) + "\n"


def write_tune(report: TuneReport, output_dir: str, prefix: str, stamp: str | None = None) -> list[Path]:
    """`<prefix>-tune-<stamp>.json/.md` and `<prefix>-tune-latest.json/.md`, each written atomically."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or file_stamp()
    written = []
    for suffix, text in (("json", tune_text(report)), ("md", tune_markdown(report))):
        for name in (f"{prefix}-tune-{stamp}.{suffix}", f"{prefix}-tune-latest.{suffix}"):
            path = out / name
            atomic_write_text(path, text)
            written.append(path)
    return written
