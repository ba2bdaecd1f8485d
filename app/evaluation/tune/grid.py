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

Holdout and folds (`sieve tune --holdout FRACTION | --folds K`), so that choosing and judging on the same
cases shows. The cases are split by `app.evaluation.tune.holdout` (deterministic for `rag.evaluate.seed`,
stratified by knowledge tag and case kind, a group's paraphrases on one side; see `assign_parts`). With a
holdout the grid's rows, the current configuration and the recommendation are those of the tuning part alone
(the same rule); then, for the current configuration C and each recommended point R, on each part P:

  figure(X, P)  = the point figure of `replay.point_metrics` over P's cases only
  gain(P)       = figure(R, P) - figure(C, P)               (each of `gain_figure_names()`)
  optimism      = gain(tuning) - gain(held-out)

Optimism > 0: the tuning cases flatter the choice by that much (what was tuned on is also what a gate on
the same cases would see); about 0: the gain carries over to cases the choice never saw; < 0: the held-out
cases gained more. With K folds the rows and recommendation are those of every case (what one would adopt),
and for each fold i the rule recommends on the other K-1 folds and the same figures are taken with P = those
folds (tuning) and fold i (held-out). Mean over folds of a figure = its sum over the folds where it is defined
(a fold without no-answer cases has no correctAbstention; a fold without a recommendation has no R) divided
by their number; agreement = for each recommended point, the folds that recommended it.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from statistics import fmean

from pydantic import JsonValue, ValidationError

from app.evaluation.golden.cases import GoldenCase
from app.evaluation.report.model import (
    PointFigures,
    Sweep,
    SweepCost,
    SweepPoint,
    SweepRecommendation,
    SweepRow,
)
from app.evaluation.run.build import summary_record
from app.evaluation.run.runner import Evaluation, cyclic_gc_paused
from app.evaluation.scoring import measures
from app.evaluation.tune.holdout import HELD_OUT, TUNING, case_kind
from app.evaluation.tune.model import (
    AgreedPoint,
    Agreement,
    Agreements,
    Carried,
    Figures,
    FoldMeans,
    FoldResult,
    FoldsAnalysis,
    GridResult,
    HeldOut,
    HoldoutAnalysis,
    HoldoutSplit,
    Kind,
    KindMeans,
    ParamValue,
    PartCounts,
    PartScores,
    SideCounts,
    SideFigures,
    SideScores,
    Split,
    figure,
)
from app.evaluation.tune.replay import (
    Recording,
    pareto_front,
    passes_gate,
    point_figure_names,
    point_metrics,
    replay,
)
from app.settings import ChainSettings, EvaluateThresholds

DEFAULT_MAX_POINTS = 2000
DEFAULT_TOLERANCE = 0.005
MIN_DENSE = "chain.similarity_threshold.min_dense"
FALLBACK = "chain.fallback.enabled"
PER_TAG = "chain.similarity_threshold.per_knowledge_tag."
# the chain settings as JSON (`ChainSettings.model_dump(mode="json")`): stage -> setting -> value
ChainJson = dict[str, JsonValue]
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
ALL = "all"


class GridError(ValueError):
    """A grid that cannot be replayed; the message names the parameter and value."""


@dataclass(frozen=True)
class Grid:
    keys: list[str]
    values: dict[str, list[ParamValue]]
    points: list[dict[str, ParamValue]]
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


def parse_spec(key: str, spec: str) -> list[ParamValue]:
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


def _with(base: ChainJson, key: str, value: ParamValue) -> ChainJson:
    """A copy of the chain settings JSON `base` with `key` set to `value`."""
    out: ChainJson = json.loads(json.dumps(base))  # a deep copy of plain JSON data
    parts = key.split(".")[1:]  # without "chain"
    if key.startswith(PER_TAG):
        parts = ["similarity_threshold", "per_knowledge_tag", key[len(PER_TAG) :]]
    node = out
    for part in parts[:-1]:
        child = node[part]
        if not isinstance(child, dict):
            raise GridError(f"{key}: not a single value")
        node = child
    node[parts[-1]] = value
    return out


def _get(chain: ChainSettings, key: str) -> ParamValue:
    """The value of the replayable setting `key` in `chain`."""
    if key.startswith(PER_TAG):
        return chain.similarity_threshold.per_knowledge_tag.get(key[len(PER_TAG) :])
    node: object = chain
    for part in key.split(".")[1:]:
        node = getattr(node, part)
    if node is None or isinstance(node, bool | int | float | str):
        return node
    raise GridError(f"{key}: not a single value")


def _show(value: ParamValue) -> str:
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _validate(base: ChainJson, assignments: dict[str, ParamValue]) -> ChainSettings:
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
    values: dict[str, list[ParamValue]] = {}
    for spec in specs:
        if "=" not in spec:
            raise GridError(f"{spec}: expected PARAM=GRID, e.g. chain.bm25.dense_weight=0:1:0.05")
        raw_key, grid = spec.split("=", 1)
        key = normalise_key(raw_key)
        if key in values:
            raise GridError(f"{key}: given twice")
        typed: list[ParamValue] = []
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


def _figures(evaluation: Evaluation, thresholds: EvaluateThresholds) -> PartScores:
    """A point's row figures and its gate verdict, from one summary of its evaluation."""
    summary = summary_record(evaluation)
    return PartScores(
        metrics=point_metrics(evaluation, summary),
        passes_gate=passes_gate(evaluation, thresholds, summary),
    )


Parts = dict[str, frozenset[str] | None]  # a part's name -> its case ids (None: every case)
Scores = dict[str, PartScores]  # a part's name -> one point's figures over it


def _score_points(
    recording: Recording,
    settings: list[ChainSettings],
    parts: Parts,
    thresholds: EvaluateThresholds,
) -> tuple[list[Scores], float]:
    """Replay each of `settings` once over every recorded case; for each named part the figures and gate
    verdict of that part's cases alone, per settings, and the ms each settings cost (its replay, summaries
    and gate checks).

    The cyclic garbage collector is paused meanwhile (`cyclic_gc_paused`)."""
    with cyclic_gc_paused():
        started = time.perf_counter()
        out = []
        for point in settings:
            evaluation = replay(recording, point, trace=False)
            scores = {}
            for name, ids in parts.items():
                part = (
                    evaluation
                    if ids is None
                    else replace(evaluation, cases=[c for c in evaluation.cases if c.case.id in ids])
                )
                scores[name] = _figures(part, thresholds)
            out.append(scores)
        per_point_ms = (time.perf_counter() - started) * 1000 / len(settings) if settings else 0.0
    return out, per_point_ms


def _tune_result(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    current_scores: PartScores,
    point_scores: list[PartScores],
    tolerance: float,
    per_point_ms: float,
) -> GridResult:
    front = pareto_front([s.metrics for s in point_scores])
    rows = [
        SweepRow(params=point, metrics=s.metrics, passes_gate=s.passes_gate, pareto=on_front)
        for point, s, on_front in zip(grid.points, point_scores, front, strict=True)
    ]
    return GridResult(
        grid={k: list(v) for k, v in grid.values.items()},
        rows=rows,
        current=SweepPoint(point={k: _get(current, k) for k in grid.keys}, metrics=current_scores.metrics),
        recommendation=recommend(rows, current_scores.metrics, tolerance),
        cost_ms=SweepCost(
            candidates=round(recording.candidates_ms, 3),
            per_point=round(per_point_ms, 3),
            real_evaluation=round(recording.evaluation_ms, 3),
        ),
    )


def run_grid(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    thresholds: EvaluateThresholds,
    tolerance: float = DEFAULT_TOLERANCE,
) -> GridResult:
    """Replay every point of `grid` and the current configuration over every case; rank and recommend."""
    every: Parts = {ALL: None}
    (current_scores,), _ = _score_points(recording, [current], every, thresholds)
    scores, per_point_ms = _score_points(recording, grid.settings, every, thresholds)
    return _tune_result(
        recording, grid, current, current_scores[ALL], [s[ALL] for s in scores], tolerance, per_point_ms
    )


def _num(value: float | None) -> float:
    return float(value) if value is not None else float("-inf")


def _close(m: PointFigures, current: PointFigures, name: str, tolerance: float) -> bool:
    """`m`'s figure `name` is at most `tolerance` below the current one (or the current one is undefined)."""
    now, then = figure(current, name), figure(m, name)
    if now is None:
        return True
    return then is not None and then >= now - tolerance - 1e-12


def recommend(rows: list[SweepRow], current: PointFigures, tolerance: float) -> SweepRecommendation:
    """`best` and `abstention` (see the module docstring); each None when no point qualifies."""
    passing = [(i, r) for i, r in enumerate(rows) if r.passes_gate and r.metrics.ndcg is not None]
    best = None
    if passing:
        _, row = min(passing, key=lambda p: (-_num(p[1].metrics.ndcg), p[0]))
        best = SweepPoint(point=row.params, metrics=row.metrics)
    candidates = [
        (i, r)
        for i, r in enumerate(rows)
        if r.passes_gate
        and r.metrics.correct_abstentions > 0
        and _close(r.metrics, current, "recall", tolerance)
        and _close(r.metrics, current, "ndcg", tolerance)
    ]
    abstention = None
    if candidates:
        _, row = min(
            candidates,
            key=lambda p: (
                -p[1].metrics.correct_abstentions,
                -_num(p[1].metrics.ndcg),
                -_num(p[1].metrics.recall),
                p[0],
            ),
        )
        abstention = SweepPoint(point=row.params, metrics=row.metrics)
    return SweepRecommendation(best=best, abstention=abstention)


# -- holdout and folds ----------------------------------------------------------------------------------


def gain_figure_names() -> tuple[str, ...]:
    """The figures whose gain and optimism are reported: the registry's point measures (`measures.POINT`,
    read at call time) and meanResults, each a mean over a part's cases, so a part of any size gives a
    comparable value (forbiddenHits, a count, is shown but not differenced)."""
    return (*measures.POINT, "meanResults")


def _difference(minuend: Figures, subtrahend: Figures) -> Figures:
    """minuend - subtrahend for each of `gain_figure_names()` (None where either is undefined)."""
    out: Figures = {}
    for m in gain_figure_names():
        a, b = minuend[m], subtrahend[m]
        out[m] = None if a is None or b is None else a - b
    return out


def _gain(minuend: PointFigures, subtrahend: PointFigures) -> Figures:
    """minuend - subtrahend for each of `gain_figure_names()` (None where either is undefined)."""
    names = gain_figure_names()
    return _difference({m: figure(minuend, m) for m in names}, {m: figure(subtrahend, m) for m in names})


def _carried(
    rec: SweepPoint | None,
    grid: Grid,
    point_scores: list[Scores],
    current_scores: Scores,
    tuning: str,
    held_out: str,
) -> Carried | None:
    """A recommendation made on part `tuning`, with its figures on both parts, its gains there over the
    current configuration and its optimism (see the module docstring); None when nothing was recommended."""
    if rec is None:
        return None
    scores = point_scores[grid.points.index(rec.point)]
    gain = SideFigures(
        tuning=_gain(scores[tuning].metrics, current_scores[tuning].metrics),
        held_out=_gain(scores[held_out].metrics, current_scores[held_out].metrics),
    )
    return Carried(
        point=rec.point,
        tuning=scores[tuning],
        held_out=scores[held_out],
        gain=gain,
        optimism=_difference(gain.tuning, gain.held_out),
    )


def _part_counts(cases: Sequence[GoldenCase], ids: Sequence[str]) -> PartCounts:
    members = set(ids)
    kinds = Counter(case_kind(c) for c in cases if c.id in members)
    return PartCounts(cases=len(ids), scored_cases=kinds["answer"], no_answer_cases=kinds["noAnswer"])


@dataclass
class SplitResult:
    result: GridResult  # rows and recommendation: on the tuning part (holdout) or every case (folds)
    analysis: HoldoutAnalysis | FoldsAnalysis | None  # the JSON's "holdout" or "folds"
    all_current: PointFigures  # the current configuration's figures over every case (the self-check)


def run_holdout(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    thresholds: EvaluateThresholds,
    tolerance: float,
    parts: list[list[str]],
) -> SplitResult:
    """Recommend on `parts[0]` (tuning) alone; the current configuration and each recommendation on both
    parts, with gains and optimism."""
    cases = recording.golden.cases
    named: Parts = {TUNING: frozenset(parts[0]), HELD_OUT: frozenset(parts[1])}
    (current_scores,), _ = _score_points(recording, [current], {ALL: None, **named}, thresholds)
    scores, per_point_ms = _score_points(recording, grid.settings, named, thresholds)
    result = _tune_result(
        recording, grid, current, current_scores[TUNING], [s[TUNING] for s in scores], tolerance, per_point_ms
    )
    rec = result.recommendation
    analysis = HoldoutAnalysis(
        parts=SideCounts(tuning=_part_counts(cases, parts[0]), held_out=_part_counts(cases, parts[1])),
        current=SideScores(tuning=current_scores[TUNING], held_out=current_scores[HELD_OUT]),
        best=_carried(rec.best, grid, scores, current_scores, TUNING, HELD_OUT),
        abstention=_carried(rec.abstention, grid, scores, current_scores, TUNING, HELD_OUT),
    )
    return SplitResult(result, analysis, current_scores[ALL].metrics)


def _mean_over(values: list[Figures], names: Sequence[str]) -> Figures:
    """Each figure's mean over the figure sets where it is defined (None where it is nowhere)."""
    out: Figures = {}
    for m in names:
        defined = [x for x in (v[m] for v in values) if x is not None]
        out[m] = fmean(defined) if defined else None
    return out


def _named(metrics: PointFigures, names: Sequence[str]) -> Figures:
    return {m: figure(metrics, m) for m in names}


def _agreement(entries: list[Carried | None], grid: Grid, everyone: SweepPoint | None) -> Agreement:
    """Which point each fold recommended: the points with their folds (most folds first, then grid order),
    the folds without a recommendation, and in how many folds the all-cases recommendation was made."""
    folds_of: dict[int, list[int]] = {}
    for fold, entry in enumerate(entries, start=1):
        if entry is not None:
            folds_of.setdefault(grid.points.index(entry.point), []).append(fold)
    ranked = sorted(folds_of, key=lambda i: (-len(folds_of[i]), i))
    return Agreement(
        points=[AgreedPoint(point=grid.points[i], folds=folds_of[i]) for i in ranked],
        none=[fold for fold, entry in enumerate(entries, start=1) if entry is None],
        most_often=len(folds_of[ranked[0]]) if ranked else 0,
        all_cases_point=(
            len(folds_of.get(grid.points.index(everyone.point), [])) if everyone is not None else None
        ),
        of=len(entries),
    )


def _kind_means(per_fold: list[FoldResult], kind: Kind) -> KindMeans | None:
    """The means of recommendation `kind` over the folds that made one (None when none did)."""
    made = [(f, rec) for f in per_fold if (rec := f.carried(kind)) is not None]
    if not made:
        return None
    points, gains = point_figure_names(), gain_figure_names()
    return KindMeans(
        folds=[f.fold for f, _ in made],
        current=HeldOut(
            held_out=_mean_over([_named(f.current.held_out.metrics, points) for f, _ in made], points)
        ),
        recommended=HeldOut(
            held_out=_mean_over([_named(r.held_out.metrics, points) for _, r in made], points)
        ),
        gain=SideFigures(
            tuning=_mean_over([r.gain.tuning for _, r in made], gains),
            held_out=_mean_over([r.gain.held_out for _, r in made], gains),
        ),
        optimism=_mean_over([r.optimism for _, r in made], gains),
    )


def _fold_result(
    i: int,
    fold: list[str],
    cases: Sequence[GoldenCase],
    grid: Grid,
    scores: list[Scores],
    current_scores: Scores,
    tolerance: float,
) -> FoldResult:
    """Fold i held out: the rule recommends on the other folds (part `tune{i}`), scored on it (`fold{i}`)."""
    tuning, held = f"tune{i}", f"fold{i}"
    rows = [
        SweepRow(params=p, metrics=s[tuning].metrics, passes_gate=s[tuning].passes_gate, pareto=False)
        for p, s in zip(grid.points, scores, strict=True)
    ]
    rec = recommend(rows, current_scores[tuning].metrics, tolerance)
    return FoldResult(
        fold=i + 1,
        held_out=_part_counts(cases, fold),
        current=SideScores(tuning=current_scores[tuning], held_out=current_scores[held]),
        best=_carried(rec.best, grid, scores, current_scores, tuning, held),
        abstention=_carried(rec.abstention, grid, scores, current_scores, tuning, held),
    )


def run_folds(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    thresholds: EvaluateThresholds,
    tolerance: float,
    folds: list[list[str]],
) -> SplitResult:
    """The grid over every case (its rows and recommendation, as without folds), and per fold i a
    recommendation made on the other folds and scored on fold i; the means over folds and the agreement."""
    cases = recording.golden.cases
    every = frozenset(c.id for c in cases)
    named: Parts = {ALL: None}
    for i, fold in enumerate(folds):
        named[f"tune{i}"] = every - frozenset(fold)
        named[f"fold{i}"] = frozenset(fold)
    (current_scores,), _ = _score_points(recording, [current], named, thresholds)
    scores, per_point_ms = _score_points(recording, grid.settings, named, thresholds)
    result = _tune_result(
        recording, grid, current, current_scores[ALL], [s[ALL] for s in scores], tolerance, per_point_ms
    )
    per_fold = [
        _fold_result(i, fold, cases, grid, scores, current_scores, tolerance) for i, fold in enumerate(folds)
    ]
    points = point_figure_names()
    current_held = [_named(f.current.held_out.metrics, points) for f in per_fold]
    rec = result.recommendation
    analysis = FoldsAnalysis(
        k=len(folds),
        per_fold=per_fold,
        mean=FoldMeans(
            current=HeldOut(held_out=_mean_over(current_held, points)),
            best=_kind_means(per_fold, "best"),
            abstention=_kind_means(per_fold, "abstention"),
        ),
        agreement=Agreements(
            best=_agreement([f.best for f in per_fold], grid, rec.best),
            abstention=_agreement([f.abstention for f in per_fold], grid, rec.abstention),
        ),
    )
    return SplitResult(result, analysis, current_scores[ALL].metrics)


def run_split(
    recording: Recording,
    grid: Grid,
    current: ChainSettings,
    thresholds: EvaluateThresholds,
    tolerance: float,
    split: Split | None,
) -> SplitResult:
    """`run_grid`, `run_holdout` or `run_folds`, as `split` (from `make_split`) says."""
    if split is None:
        result = run_grid(recording, grid, current, thresholds, tolerance)
        return SplitResult(result, None, result.current.metrics)
    if isinstance(split, HoldoutSplit):
        parts = [split.parts.tuning, split.parts.held_out]
        return run_holdout(recording, grid, current, thresholds, tolerance, parts)
    return run_folds(recording, grid, current, thresholds, tolerance, split.parts.folds)


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
) -> Sweep | None:
    """The report's `sweep`: min_dense over the observed dense scores, with the fallback off (with it on,
    a threshold can never make the chain abstain: the fallback refills the best raw candidate)."""
    values: list[ParamValue] = list(sweep_values(recording.dense_scores))
    if not values:
        return None
    base = current.model_dump(mode="json")
    points: list[dict[str, ParamValue]] = [{MIN_DENSE: v, FALLBACK: False} for v in values]
    grid = Grid(
        [MIN_DENSE, FALLBACK],
        {MIN_DENSE: values, FALLBACK: [False]},
        points,
        [_validate(base, p) for p in points],
    )
    result = run_grid(recording, grid, current, thresholds, tolerance)
    return Sweep(
        param=MIN_DENSE,
        grid=result.grid,
        rows=result.rows,
        recommendation=result.recommendation,
        cost_ms=result.cost_ms,
        current=result.current,
    )


def fmt_value(value: ParamValue) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"
    return str(value)
