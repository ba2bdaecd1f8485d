"""`sieve tune` and the startup threshold sweep: a grid of chain settings replayed over one recording.

A grid is `PARAM=GRID ...`: PARAM a `rag.chain.*` key (the `rag.` prefix optional) that the replay can
change without new candidates (`REPLAYABLE`), GRID either `start:stop:step` (inclusive, computed in decimal
so `0:1:0.05` is exactly 21 values) or `a,b,c` (`null` for None; each value is validated by the settings
model, so it takes the setting's type). Several PARAMs form their cartesian product.

Per point: the figures of `replay.point_metrics`, whether it passes the configured gate (levels and
safety; latency and regressions are not replayed), and whether it is on the Pareto front of nDCG against
correct abstention. Recommendation: `best` = the highest nDCG among points that pass the gate;
`abstention` = among points that pass the gate and lose at most `tolerance` of the current configuration's
recall and nDCG, the one with the most correct abstentions (at least one); ties go to the higher nDCG, then
recall, then the earlier point of the grid.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.evaluation.replay import (
    POINT_METRICS,
    Recording,
    pareto_front,
    passes_gate,
    point_metrics,
    replay,
)
from app.evaluation.report import _atomic_write, report_stamp, summarize
from app.evaluation.runner import Evaluation
from app.settings import ChainSettings, EvaluateThresholds

DEFAULT_MAX_POINTS = 2000
DEFAULT_TOLERANCE = 0.005
MIN_DENSE = "chain.similarity_threshold.min_dense"
FALLBACK = "chain.fallback.enabled"
PER_TAG = "chain.similarity_threshold.per_knowledge_tag."
REPLAYABLE = (
    "chain.similarity_threshold.enabled",
    MIN_DENSE,
    PER_TAG + "<tag>",
    "chain.hard_filter.enabled",
    "chain.bm25.enabled",
    "chain.bm25.fusion",
    "chain.bm25.dense_weight",
    "chain.bm25.bm25_weight",
    "chain.bm25.rrf_k",
    "chain.bm25.min_score",
    "chain.rerank.enabled",
    "chain.rerank.top_n",
    "chain.rerank.min_score",
    "chain.diversity.enabled",
    "chain.diversity.max_cosine",
    "chain.diversity.max_per_document",
    "chain.diversity.max_per_source",
    "chain.diversity.mmr",
    "chain.diversity.mmr_lambda",
    FALLBACK,
    "chain.fallback.min_results",
)
SWEEP_POINTS = 21


class GridError(ValueError):
    """A grid that cannot be replayed; the message names the parameter and value."""


@dataclass(frozen=True)
class Grid:
    keys: list[str]
    values: dict[str, list[Any]]
    points: list[dict[str, Any]]
    settings: list[ChainSettings]


def replayable_list() -> str:
    return ", ".join(k.removeprefix("chain.") for k in REPLAYABLE)


def normalise_key(raw: str) -> str:
    """`rag.chain.bm25.rrf_k` or `chain.bm25.rrf_k` -> `chain.bm25.rrf_k`, when it is replayable."""
    key = raw.strip()
    key = key.removeprefix("rag.")
    if not key.startswith("chain."):
        raise GridError(f"{raw}: not a rag.chain.* key; replayable: {replayable_list()}")
    if key in REPLAYABLE or (key.startswith(PER_TAG) and len(key) > len(PER_TAG)):
        return key
    parts = key.split(".")
    known = (
        len(parts) == 3
        and parts[1] in ChainSettings.model_fields
        and parts[2] in ChainSettings.model_fields[parts[1]].annotation.model_fields  # type: ignore[union-attr]
    )
    why = (
        "it changes the candidates or what the stages were given, so it needs a real evaluation"
        if known
        else "no such setting"
    )
    raise GridError(f"{raw}: not replayable ({why}); replayable: {replayable_list()}")


def parse_spec(key: str, spec: str) -> list[Any]:
    """The raw values of one GRID: `start:stop:step` (inclusive, decimal arithmetic) or `a,b,c`."""
    spec = spec.strip()
    if not spec:
        raise GridError(f"{key}: empty grid (expected start:stop:step or a,b,c)")
    if ":" in spec and "," not in spec:
        parts = spec.split(":")
        if len(parts) != 3:
            raise GridError(f"{key}={spec}: a range is start:stop:step, got {len(parts)} part(s)")
        try:
            start, stop, step = (Decimal(p.strip()) for p in parts)
        except InvalidOperation:
            raise GridError(f"{key}={spec}: start, stop and step must be numbers") from None
        if not all(x.is_finite() for x in (start, stop, step)):
            raise GridError(f"{key}={spec}: start, stop and step must be finite")
        if step <= 0:
            raise GridError(f"{key}={spec}: step must be > 0")
        if stop < start:
            raise GridError(f"{key}={spec}: stop must be >= start")
        count = int((stop - start) / step) + 1
        if count > 100_000:
            raise GridError(f"{key}={spec}: {count} values, too many")
        integral = all("." not in p and "e" not in p.lower() for p in parts)
        values = [start + i * step for i in range(count)]
        return [int(v) if integral else float(v) for v in values]
    tokens = [t.strip() for t in spec.split(",")]
    if any(not t for t in tokens):
        raise GridError(f"{key}={spec}: empty value in the list")
    return [None if t.lower() in ("null", "none") else t for t in tokens]


def _with(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(base))  # a deep copy of plain JSON data
    parts = key.split(".")[1:]  # without "chain"
    if key.startswith(PER_TAG):
        out["similarity_threshold"]["per_knowledge_tag"][key[len(PER_TAG) :]] = value
        return out
    node = out
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return out


def _get(chain: ChainSettings, key: str) -> Any:
    if key.startswith(PER_TAG):
        return chain.similarity_threshold.per_knowledge_tag.get(key[len(PER_TAG) :])
    node: Any = chain
    for part in key.split(".")[1:]:
        node = getattr(node, part)
    return node


def _show(value: Any) -> str:
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _validate(base: dict[str, Any], assignments: dict[str, Any]) -> ChainSettings:
    data = base
    for key, value in assignments.items():
        data = _with(data, key, value)
    try:
        return ChainSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'chain'}: {e['msg']}" for e in exc.errors()
        )
        shown = ", ".join(f"{k}={_show(v)}" for k, v in assignments.items())
        raise GridError(f"{shown}: {problems}") from None


def parse_grid(specs: list[str], current: ChainSettings, max_points: int = DEFAULT_MAX_POINTS) -> Grid:
    """Every point of `PARAM=GRID ...`, each validated by the settings model on top of `current`."""
    if not specs:
        raise GridError(f"give at least one PARAM=GRID; replayable: {replayable_list()}")
    base = current.model_dump(mode="json")
    values: dict[str, list[Any]] = {}
    for spec in specs:
        if "=" not in spec:
            raise GridError(f"{spec}: expected PARAM=GRID, e.g. chain.bm25.dense_weight=0:1:0.05")
        raw_key, grid = spec.split("=", 1)
        key = normalise_key(raw_key)
        if key in values:
            raise GridError(f"{key}: given twice")
        typed: list[Any] = []
        for raw in parse_spec(key, grid):
            value = _get(_validate(base, {key: raw}), key)  # the setting's own type, or a clear error
            if value not in typed:
                typed.append(value)
        values[key] = typed
    keys = list(values)
    total = math.prod(len(v) for v in values.values())
    if total > max_points:
        sizes = " x ".join(str(len(values[k])) for k in keys)
        raise GridError(
            f"the grid has {total} points ({sizes}), more than --max-points {max_points}; "
            f"use coarser steps or fewer parameters (or raise --max-points)"
        )
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values[k] for k in keys))]
    settings = [_validate(base, point) for point in points]
    return Grid(keys, values, points, settings)


@dataclass
class TuneResult:
    grid: dict[str, list[Any]]
    rows: list[dict[str, Any]]
    current: dict[str, Any]
    recommendation: dict[str, Any]
    cost_ms: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "grid": self.grid,
            "rows": self.rows,
            "recommendation": self.recommendation,
            "costMs": self.cost_ms,
            "current": self.current,
        }


def _figures(evaluation: Evaluation, thresholds: EvaluateThresholds) -> tuple[dict[str, Any], bool]:
    """A point's row figures and its gate verdict, from one summary of its evaluation."""
    summary = summarize(evaluation)
    return point_metrics(evaluation, summary), passes_gate(evaluation, thresholds, summary)


def run_grid(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    thresholds: EvaluateThresholds,
    tolerance: float = DEFAULT_TOLERANCE,
) -> TuneResult:
    """Replay every point of `grid` and the current configuration; rank and recommend.

    The cyclic garbage collector is paused meanwhile: a replay allocates many short-lived objects, none in
    a cycle (reference counting frees them), and each collection would walk the whole heap (a loaded model's
    objects included) for nothing."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        figures, passes = _figures(replay(recording, current, trace=False), thresholds)
        current_row = {
            "point": {k: _get(current, k) for k in grid.keys},
            "metrics": figures,
            "passesGate": passes,
        }
        rows = []
        started = time.perf_counter()  # a point's cost: its replay, its summary and its gate check
        for point, settings in zip(grid.points, grid.settings, strict=True):
            figures, passes = _figures(replay(recording, settings, trace=False), thresholds)
            rows.append({"params": point, "metrics": figures, "passesGate": passes, "pareto": False})
        per_point_ms = (time.perf_counter() - started) * 1000 / len(rows) if rows else 0.0
    finally:
        if collecting:
            gc.enable()
    for row, on_front in zip(rows, pareto_front([r["metrics"] for r in rows]), strict=True):
        row["pareto"] = on_front
    return TuneResult(
        grid={k: list(v) for k, v in grid.values.items()},
        rows=rows,
        current={"point": current_row["point"], "metrics": current_row["metrics"]},
        recommendation=recommend(rows, current_row["metrics"], tolerance),
        cost_ms={
            "candidates": round(recording.candidates_ms, 3),
            "perPoint": round(per_point_ms, 3),
            "realEvaluation": round(recording.evaluation_ms, 3),
        },
    )


def _num(value: Any) -> float:
    return float(value) if value is not None else float("-inf")


def recommend(rows: list[dict[str, Any]], current: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """`best` and `abstention` (see the module docstring); each None when no point qualifies."""
    passing = [(i, r) for i, r in enumerate(rows) if r["passesGate"] and r["metrics"]["ndcg"] is not None]
    best = None
    if passing:
        _, row = min(passing, key=lambda p: (-_num(p[1]["metrics"]["ndcg"]), p[0]))
        best = {"point": row["params"], "metrics": row["metrics"]}

    def close(m: dict[str, Any], name: str) -> bool:
        if current[name] is None:
            return True
        return m[name] is not None and m[name] >= current[name] - tolerance - 1e-12

    candidates = [
        (i, r)
        for i, r in enumerate(rows)
        if r["passesGate"]
        and r["metrics"]["correctAbstentions"] > 0
        and close(r["metrics"], "recall")
        and close(r["metrics"], "ndcg")
    ]
    abstention = None
    if candidates:
        _, row = min(
            candidates,
            key=lambda p: (
                -p[1]["metrics"]["correctAbstentions"],
                -_num(p[1]["metrics"]["ndcg"]),
                -_num(p[1]["metrics"]["recall"]),
                p[0],
            ),
        )
        abstention = {"point": row["params"], "metrics": row["metrics"]}
    return {"best": best, "abstention": abstention}


# -- the startup sweep ----------------------------------------------------------------------------------


def sweep_values(dense_scores: list[float], points: int = SWEEP_POINTS) -> list[float]:
    """`points` thresholds evenly spanning the observed dense scores, min to max, rounded to 4 decimals
    (so fewer when the scores hardly spread)."""
    if not dense_scores:
        return []
    low, high = min(dense_scores), max(dense_scores)
    out: list[float] = []
    for i in range(points):
        value = round(low + (high - low) * i / (points - 1), 4)
        value = min(1.0, max(-1.0, value))
        if value not in out:
            out.append(value)
    return out


def threshold_sweep(
    recording: Recording, current: ChainSettings, thresholds: EvaluateThresholds, tolerance: float
) -> dict[str, Any] | None:
    """The report's `sweep`: min_dense over the observed dense scores, with the fallback off (with it on,
    a threshold can never make the chain abstain: the fallback refills the best raw candidate)."""
    values = sweep_values(recording.dense_scores)
    if not values:
        return None
    base = current.model_dump(mode="json")
    points = [{MIN_DENSE: v, FALLBACK: False} for v in values]
    grid = Grid(
        [MIN_DENSE, FALLBACK],
        {MIN_DENSE: values, FALLBACK: [False]},
        points,
        [_validate(base, p) for p in points],
    )
    result = run_grid(recording, grid, current, thresholds, tolerance)
    return {"param": MIN_DENSE, **result.to_json()}


def fmt_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"
    return str(value)


def _f(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def sweep_line(sweep: dict[str, Any] | None) -> str | None:
    """The log line: `sweep min_dense: 0.84 abstains on 2/4 no-answer cases, recall 1.000 -> 1.000
    (fallback off)`."""
    if not sweep:
        return None
    current = sweep["current"]["metrics"]
    rec = sweep["recommendation"]["abstention"]
    if current["noAnswerCases"] == 0:
        return "sweep min_dense: no no-answer cases in the golden set, no abstention threshold to recommend"
    if rec is None:
        return (
            "sweep min_dense: no threshold abstains without losing more than the tolerance of recall or "
            "nDCG (fallback off)"
        )
    m = rec["metrics"]
    return (
        f"sweep min_dense: {fmt_value(rec['point'][MIN_DENSE])} abstains on "
        f"{m['correctAbstentions']}/{m['noAnswerCases']} no-answer cases, "
        f"recall {_f(current['recall'])} -> {_f(m['recall'])} (fallback off)"
    )


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


def sweep_markdown(report: dict[str, Any]) -> list[str]:
    """The report's "Threshold sweep" section (empty when the sweep is off)."""
    sweep = report.get("sweep")
    if not sweep:
        return []
    current = sweep["current"]["metrics"]
    cost = sweep["costMs"]
    lines = [
        "## Threshold sweep",
        "",
        f"`similarity_threshold.min_dense` replayed over {len(sweep['rows'])} values spanning the "
        "candidates' dense scores, with the fallback off (with it on, no threshold can make the chain "
        "abstain), from the "
        "candidates of this run: no model or store call, the same stages and metrics as this report. "
        f"Replay cost {cost['perPoint']:.1f} ms per point "
        f"(this evaluation: {cost['realEvaluation']:.0f} ms).",
        "",
        f"- Current configuration: nDCG {_f(current['ndcg'])}, recall {_f(current['recall'])}, correct "
        f"abstention {current['correctAbstentions']}/{current['noAnswerCases']}",
        f"- Recommended abstention threshold: {_describe(sweep['recommendation']['abstention'], current)}",
        f"- Best nDCG passing the gate: {_describe(sweep['recommendation']['best'], current)}",
        "",
    ]
    lines += _table([MIN_DENSE], sweep["rows"])
    return lines + [""]


def tune_markdown(doc: dict[str, Any]) -> str:
    run, cost = doc["run"], doc["costMs"]
    current = doc["current"]["metrics"]
    keys = list(doc["grid"])
    lines = [
        f"# Sieve tune — {run['startedAt']}",
        "",
        f"Golden set `{run['goldenSet']}` ({run['cases']} cases), K={run['k']}, as of {run['asOf']}; "
        f"{len(doc['rows'])} points over " + ", ".join(f"`{k}`" for k in keys) + ".",
        "",
        f"Cost: candidates {cost['candidates']:.0f} ms once (one real evaluation of the current "
        f"configuration: {cost['realEvaluation']:.0f} ms), then {cost['perPoint']:.1f} ms per point.",
        "",
        f"Check: {run['selfCheck']}",
        "",
        "## Recommendation",
        "",
        f"- Current configuration ({_point_text(doc['current']['point'])}):"
        f" nDCG {_f(current['ndcg'])}, recall {_f(current['recall'])}, correct abstention "
        f"{current['correctAbstentions']}/{current['noAnswerCases']}",
        f"- Best (highest nDCG passing the gate): {_describe(doc['recommendation']['best'], current)}",
        f"- Abstention (most correct abstentions, recall and nDCG within {run['tolerance']} of the current): "
        f"{_describe(doc['recommendation']['abstention'], current)}",
        "",
        "## Points",
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
    stamp = stamp or report_stamp()
    written = []
    for suffix, text in (
        ("json", json.dumps(doc, ensure_ascii=False, indent=2) + "\n"),
        ("md", tune_markdown(doc)),
    ):
        for name in (f"{prefix}-tune-{stamp}.{suffix}", f"{prefix}-tune-latest.{suffix}"):
            path = out / name
            _atomic_write(path, text)
            written.append(path)
    return written
