"""The tuning report (`sieve tune`): the typed document the tune JSON and Markdown are written from.

Its grid part (points, rows, recommendation, cost, current configuration) has the records of the evaluation
report's threshold sweep (`report.model.Sweep`), its twin; with `--holdout` or `--folds` it also carries the
split and its analysis (see `tune.grid`). Keys are camelCase in the JSON, as in the report models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import JsonValue

from app.evaluation.report.model import (
    Model,
    ParamValue,
    PointFigures,
    SweepCost,
    SweepPoint,
    SweepRecommendation,
    SweepRow,
)

# figure name (one of `replay.point_figure_names()` or `grid.gain_figure_names()`) -> its value, None where it
# is undefined
Figures = dict[str, float | None]
# the two recommendations (see `tune.grid`)
Kind = Literal["best", "abstention"]


def figure(metrics: PointFigures, name: str) -> float | None:
    """The figure `name` (its JSON name, e.g. `hitRate`) of `metrics` (`PointFigures.figure`)."""
    return metrics.figure(name)


class PartScores(Model):
    """A point's figures over one part's cases and whether they pass the gate."""

    metrics: PointFigures
    passes_gate: bool


class SideScores(Model):
    """Figures on the tuning part and on the held-out part."""

    tuning: PartScores
    held_out: PartScores


class PartCounts(Model):
    """How many cases a part holds: all, scored (`case_kind` answer) and no-answer ones."""

    cases: int
    scored_cases: int
    no_answer_cases: int


class SideCounts(Model):
    tuning: PartCounts
    held_out: PartCounts


class SideFigures(Model):
    """A figure set (gains or means) on the tuning part and on the held-out part."""

    tuning: Figures
    held_out: Figures


class Carried(Model):
    """A recommendation made on the tuning part, its figures on both parts, its gains over the current
    configuration there, and its optimism = gain(tuning) - gain(held-out)."""

    point: dict[str, ParamValue]
    tuning: PartScores
    held_out: PartScores
    gain: SideFigures
    optimism: Figures


class HoldoutAnalysis(Model):
    """The JSON's `holdout`: the parts' sizes, the current configuration on each, and each recommendation
    carried over to the held-out part (None when nothing was recommended)."""

    parts: SideCounts
    current: SideScores
    best: Carried | None
    abstention: Carried | None

    def carried(self, kind: Kind) -> Carried | None:
        return self.best if kind == "best" else self.abstention


class FoldResult(Model):
    """One fold held out: a recommendation made on the other folds and scored on this one."""

    fold: int
    held_out: PartCounts
    current: SideScores
    best: Carried | None
    abstention: Carried | None

    def carried(self, kind: Kind) -> Carried | None:
        return self.best if kind == "best" else self.abstention


class HeldOut(Model):
    held_out: Figures


class KindMeans(Model):
    """The means of one kind of recommendation over the folds that made one (`folds`)."""

    folds: list[int]
    current: HeldOut
    recommended: HeldOut
    gain: SideFigures
    optimism: Figures


class FoldMeans(Model):
    current: HeldOut
    best: KindMeans | None
    abstention: KindMeans | None

    def of(self, kind: Kind) -> KindMeans | None:
        return self.best if kind == "best" else self.abstention


class AgreedPoint(Model):
    point: dict[str, ParamValue]
    folds: list[int]


class Agreement(Model):
    """Which point each fold recommended (most folds first, then grid order), the folds without one, and in
    how many folds the all-cases recommendation was made (None without one), of `of` folds."""

    points: list[AgreedPoint]
    none: list[int]
    most_often: int
    all_cases_point: int | None
    of: int


class Agreements(Model):
    best: Agreement
    abstention: Agreement

    def of(self, kind: Kind) -> Agreement:
        return self.best if kind == "best" else self.abstention


class FoldsAnalysis(Model):
    """The JSON's `folds`: each fold held out in turn, the means over folds and the agreement."""

    k: int
    per_fold: list[FoldResult]
    mean: FoldMeans
    agreement: Agreements


class HoldoutParts(Model):
    tuning: list[str]
    held_out: list[str]


class FoldParts(Model):
    folds: list[list[str]]


class HoldoutSplit(Model):
    """`--holdout FRACTION`: the case ids of the tuning and held-out parts."""

    mode: Literal["holdout"] = "holdout"
    fraction: float
    seed: int
    stratified_by: list[str]
    groups_together: bool
    parts: HoldoutParts


class FoldSplit(Model):
    """`--folds K`: the case ids of each fold."""

    mode: Literal["folds"] = "folds"
    k: int
    seed: int
    stratified_by: list[str]
    groups_together: bool
    parts: FoldParts


Split = HoldoutSplit | FoldSplit


class GridResult(Model):
    """A grid replayed: its values, one row per point, the recommendation, the cost and the current
    configuration's point and figures."""

    grid: dict[str, list[ParamValue]]
    rows: list[SweepRow]
    recommendation: SweepRecommendation
    cost_ms: SweepCost
    current: SweepPoint


class TuneRun(Model):
    """What was tuned: the golden set, K, the replay's rules (tolerance, point limit), the models, store and
    chain the candidates came from, and the self-check of the replay against the real evaluation."""

    started_at: str
    golden_set: str
    cases: int
    k: int
    as_of: str
    gain: str
    tolerance: float
    max_points: int
    points: int
    embedder: JsonValue
    reranker: str | None
    collection: str
    chunks: int
    chain: JsonValue
    self_check: str


class TuneReport(Model):
    """The tuning document: the run, the grid's result, and with a split its ids and its analysis."""

    run: TuneRun
    grid: dict[str, list[ParamValue]]
    rows: list[SweepRow]
    recommendation: SweepRecommendation
    cost_ms: SweepCost
    current: SweepPoint
    split: Split | None = None
    holdout: HoldoutAnalysis | None = None
    folds: FoldsAnalysis | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The document's JSON; `split`, `holdout` and `folds` only when they are set."""
        unset = {name for name in ("split", "holdout", "folds") if getattr(self, name) is None}
        return self.model_dump(mode="json", by_alias=True, exclude=unset)
