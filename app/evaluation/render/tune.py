"""The tuning report (`sieve tune`) and the evaluation report's threshold-sweep section, as Markdown, and the
tuning files (`<prefix>-tune-<stamp>.json/.md`, `<prefix>-tune-latest.json/.md`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.evaluation.report.model import PointFigures, Sweep, SweepPoint, SweepRow
from app.evaluation.scoring.measures import fmt as _f
from app.evaluation.tune.grid import GAIN_METRICS, MIN_DENSE, fmt_value
from app.evaluation.tune.holdout import HELD_OUT, TUNING
from app.evaluation.tune.replay import POINT_METRICS
from app.files import atomic_write_text, file_stamp

_METRIC_HEADERS = (
    "Recall",
    "HitRate",
    "MRR",
    "nDCG",
    "Correct abst.",
    "False answer",
    "Forbidden",
    "Mean results",
)


def _table(keys: list[str], rows: list[dict[str, Any]]) -> list[str]:
    head = [k.removeprefix("chain.") for k in keys] + list(_METRIC_HEADERS) + ["Gate", "Pareto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["metrics"]
        cells = [fmt_value(r["params"][k]) for k in keys]
        cells += [_f(m[name]) for name in POINT_METRICS[:6]]
        cells += [str(m["forbiddenHits"]), _f(m["meanResults"], 2)]
        cells += ["pass" if r["passesGate"] else "FAIL", "★" if r["pareto"] else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _point_text(point: dict[str, Any]) -> str:
    return ", ".join(f"`{k.removeprefix('chain.')}={fmt_value(v)}`" for k, v in point.items())


def _describe(rec: dict[str, Any] | None, current: dict[str, Any]) -> str:
    if rec is None:
        return "none"
    m = rec["metrics"]
    point = _point_text(rec["point"])
    return (
        f"{point}: nDCG {_f(current['ndcg'])} -> {_f(m['ndcg'])}, recall {_f(current['recall'])} -> "
        f"{_f(m['recall'])}, correct abstention {m['correctAbstentions']}/{m['noAnswerCases']} "
        f"(now {current['correctAbstentions']}/{current['noAnswerCases']}), mean results "
        f"{_f(current['meanResults'], 2)} -> {_f(m['meanResults'], 2)}"
    )


def _sweep_point_text(rec: SweepPoint | None, current: PointFigures) -> str:
    if rec is None:
        return "none"
    m = rec.metrics
    return (
        f"{_point_text(rec.point)}: nDCG {_f(current.ndcg)} -> {_f(m.ndcg)}, recall {_f(current.recall)} -> "
        f"{_f(m.recall)}, correct abstention {m.correct_abstentions}/{m.no_answer_cases} "
        f"(now {current.correct_abstentions}/{current.no_answer_cases}), mean results "
        f"{_f(current.mean_results, 2)} -> {_f(m.mean_results, 2)}"
    )


def _sweep_table(param: str, rows: list[SweepRow]) -> list[str]:
    """`_table`'s columns for the sweep's typed rows."""
    head = [param.removeprefix("chain."), *_METRIC_HEADERS, "Gate", "Pareto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.metrics
        cells = [fmt_value(r.params[param])]
        cells += [
            _f(v) for v in (m.recall, m.hit_rate, m.mrr, m.ndcg, m.correct_abstention, m.false_answer_rate)
        ]
        cells += [str(m.forbidden_hits), _f(m.mean_results, 2)]
        cells += ["pass" if r.passes_gate else "FAIL", "★" if r.pareto else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


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
        f"- Recommended abstention threshold: {_sweep_point_text(sweep.recommendation.abstention, current)}",
        f"- Best nDCG passing the gate: {_sweep_point_text(sweep.recommendation.best, current)}",
        "",
    ]
    lines += _sweep_table(MIN_DENSE, sweep.rows)
    return lines + [""]


_FIGURE_ROWS = (
    ("recall", "Recall"),
    ("hitRate", "HitRate"),
    ("mrr", "MRR"),
    ("ndcg", "nDCG"),
    ("correctAbstention", "Correct abst."),
    ("falseAnswerRate", "False answer"),
    ("meanResults", "Mean results"),
    ("forbiddenHits", "Forbidden"),
)


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{round(value, 3) + 0.0:+.3f}"  # + 0.0: no "-0.000"


def _figure(name: str, metrics: dict[str, Any]) -> str:
    value = metrics[name]
    if name == "forbiddenHits":
        return str(value)
    return _f(value, 2 if name == "meanResults" else 3)


def _part_text(counts: dict[str, int]) -> str:
    return f"{counts['cases']} cases ({counts['scoredCases']} scored, {counts['noAnswerCases']} no-answer)"


def _holdout_table(current: dict[str, Any], rec: dict[str, Any]) -> list[str]:
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
    for name, label in _FIGURE_ROWS:
        differenced = name in GAIN_METRICS
        cells = [label]
        for side in (TUNING, HELD_OUT):
            cells += [_figure(name, current[side]["metrics"]), _figure(name, rec[side]["metrics"])]
            cells.append(_signed(rec["gain"][side][name]) if differenced else "")
        cells.append(_signed(rec["optimism"][name]) if differenced else "")
        lines.append("| " + " | ".join(cells) + " |")
    gate = ["Gate"]
    for side in (TUNING, HELD_OUT):
        gate += [_gate(current[side]), _gate(rec[side]), ""]
    lines.append("| " + " | ".join(gate + [""]) + " |")
    return lines


def _gate(scores: dict[str, Any]) -> str:
    return "pass" if scores["passesGate"] else "FAIL"


_KINDS = (
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


def _holdout_markdown(doc: dict[str, Any]) -> list[str]:
    split, holdout = doc["split"], doc["holdout"]
    parts = holdout["parts"]
    lines = [
        f"## Holdout: recommended on {parts[TUNING]['cases']} cases, checked on "
        f"{parts[HELD_OUT]['cases']} held out",
        "",
        f"Split with seed {split['seed']} (`rag.evaluate.seed`), holdout fraction {split['fraction']}: "
        f"tuning {_part_text(parts[TUNING])}, held out {_part_text(parts[HELD_OUT])}; stratified by "
        "knowledge tag and case kind, a group's paraphrases on one side (the case ids are in the JSON's "
        "`split.parts`). The points and the recommendation above use the tuning part only.",
        "",
        _GAIN_DEFINITION,
        "",
    ]
    for kind, title, _ in _KINDS:
        rec = holdout[kind]
        if rec is None:
            lines += [f"### {title}: none on the tuning part", ""]
            continue
        lines += [f"### {title}: {_point_text(rec['point'])}", ""]
        lines += _holdout_table(holdout["current"], rec) + [""]
    return lines


def _arrow(current: dict[str, Any], rec: dict[str, Any], name: str) -> str:
    return f"{_f(current['metrics'][name])} → {_f(rec['metrics'][name])}"


def _folds_markdown(doc: dict[str, Any]) -> list[str]:
    split, folds = doc["split"], doc["folds"]
    k = folds["k"]
    sizes = ", ".join(str(f[HELD_OUT]["cases"]) for f in folds["perFold"])
    lines = [
        f"## Cross-validation: {k} folds",
        "",
        f"Folds with seed {split['seed']} (`rag.evaluate.seed`), of {sizes} cases, stratified by knowledge "
        "tag and case kind, a group's paraphrases in one fold (the case ids are in the JSON's "
        f"`split.parts`). For each fold the same rule recommends on the other {k - 1} folds (tuning) and the "
        "choice is scored on the fold (held-out). The points and the recommendation above use every case.",
        "",
        _GAIN_DEFINITION + " Mean = over the folds where the figure is defined.",
        "",
    ]
    for kind, title, (first, second) in _KINDS:
        labels = dict(_FIGURE_ROWS)
        lines += [f"### {title}", ""]
        head = [
            "Fold",
            "Held-out cases",
            "Recommended",
            f"{labels[first]} tuning (current → recommended)",
            f"{labels[first]} held-out",
            f"Optimism {labels[first]}",
            f"{labels[second]} held-out",
            f"Optimism {labels[second]}",
        ]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for fold in folds["perFold"]:
            rec, current = fold[kind], fold["current"]
            cells = [str(fold["fold"]), _part_text(fold[HELD_OUT])]
            if rec is None:
                cells += ["none"] + [""] * 5
            else:
                cells += [
                    _point_text(rec["point"]),
                    _arrow(current[TUNING], rec[TUNING], first),
                    _arrow(current[HELD_OUT], rec[HELD_OUT], first),
                    _signed(rec["optimism"][first]),
                    _arrow(current[HELD_OUT], rec[HELD_OUT], second),
                    _signed(rec["optimism"][second]),
                ]
            lines.append("| " + " | ".join(cells) + " |")
        mean = folds["mean"][kind]
        agreement = folds["agreement"][kind]
        lines.append("")
        if mean is None:
            lines += ["No fold had a recommendation.", ""]
            continue
        lines += [f"Recommended points: {_agreement_text(agreement)}.", ""]
        lines += _mean_table(mean) + [""]
    return lines


def _folds_text(folds: list[int]) -> str:
    return f"fold{'s' if len(folds) > 1 else ''} {', '.join(str(f) for f in folds)}"


def _agreement_text(agreement: dict[str, Any]) -> str:
    of = agreement["of"]
    parts = [
        f"{_point_text(p['point'])} in {len(p['folds'])} of {of} folds ({_folds_text(p['folds'])})"
        for p in agreement["points"]
    ]
    if agreement["none"]:
        parts.append(f"none in {_folds_text(agreement['none'])}")
    text = "; ".join(parts)
    if agreement["allCasesPoint"] is not None:
        text += f"; the all-cases recommendation in {agreement['allCasesPoint']} of {agreement['of']} folds"
    return text


def _mean_table(mean: dict[str, Any]) -> list[str]:
    head = [
        f"Mean over folds {', '.join(str(f) for f in mean['folds'])}",
        "Current (held-out)",
        "Recommended (held-out)",
        "Gain (held-out)",
        "Gain (tuning)",
        "Optimism",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, label in _FIGURE_ROWS:
        differenced = name in GAIN_METRICS
        digits = 2 if name in ("meanResults", "forbiddenHits") else 3
        cells = [
            label,
            _f(mean["current"][HELD_OUT][name], digits),
            _f(mean["recommended"][HELD_OUT][name], digits),
        ]
        cells += [
            _signed(mean["gain"][HELD_OUT][name]) if differenced else "",
            _signed(mean["gain"][TUNING][name]) if differenced else "",
            _signed(mean["optimism"][name]) if differenced else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tune_markdown(doc: dict[str, Any]) -> str:
    run, cost = doc["run"], doc["costMs"]
    current = doc["current"]["metrics"]
    keys = list(doc["grid"])
    split = doc.get("split")
    scope = ""
    if split is not None and split["mode"] == "holdout":
        scope = f" (on the tuning part: {doc['holdout']['parts'][TUNING]['cases']} of {run['cases']} cases)"
    lines = [
        f"# Sieve tune — {run['startedAt']}",
        "",
        f"Golden set `{run['goldenSet']}` ({run['cases']} cases), K={run['k']}, as of {run['asOf']}, "
        f"nDCG gain {run.get('gain') or 'linear'}; "
        f"{len(doc['rows'])} points over " + ", ".join(f"`{k}`" for k in keys) + ".",
        "",
        f"Cost: candidates {cost['candidates']:.0f} ms once (one real evaluation of the current "
        f"configuration: {cost['realEvaluation']:.0f} ms), then {cost['perPoint']:.1f} ms per point.",
        "",
        f"Check: {run['selfCheck']}",
        "",
        f"## Recommendation{scope}",
        "",
        f"- Current configuration ({_point_text(doc['current']['point'])}):"
        f" nDCG {_f(current['ndcg'])}, recall {_f(current['recall'])}, correct abstention "
        f"{current['correctAbstentions']}/{current['noAnswerCases']}",
        f"- Best (highest nDCG passing the gate): {_describe(doc['recommendation']['best'], current)}",
        f"- Abstention (most correct abstentions, recall and nDCG within {run['tolerance']} of the current): "
        f"{_describe(doc['recommendation']['abstention'], current)}",
        "",
    ]
    if split is not None:
        lines += _holdout_markdown(doc) if split["mode"] == "holdout" else _folds_markdown(doc)
    lines += [
        f"## Points{scope}",
        "",
        "Gate: the configured level and safety checks (latency and regressions are not replayed). "
        "★ = on the Pareto front of nDCG against correct abstention.",
        "",
    ]
    lines += _table(keys, doc["rows"])
    return "\n".join(lines) + "\n"


def write_tune(doc: dict[str, Any], output_dir: str, prefix: str, stamp: str | None = None) -> list[Path]:
    """`<prefix>-tune-<stamp>.json/.md` and `<prefix>-tune-latest.json/.md`, each written atomically."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or file_stamp()
    written = []
    for suffix, text in (
        ("json", json.dumps(doc, ensure_ascii=False, indent=2) + "\n"),
        ("md", tune_markdown(doc)),
    ):
        for name in (f"{prefix}-tune-{stamp}.{suffix}", f"{prefix}-tune-latest.{suffix}"):
            path = out / name
            atomic_write_text(path, text)
            written.append(path)
    return written
