"""The tuning report from a recorded evaluation: a `Recorded` in, the `TuneReport` out.

The evaluation session (`app.evaluation.session.tune`) runs the real evaluation of the current
configuration (the only part that calls the models and the store) and records its candidates
(`replay.record`): a `Recorded`. `tune` replays the grid over them (with a split when one is given) and
builds the report, with the self-check: the replayed current configuration against the real evaluation,
figure for figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.evaluation.report.model import PointFigures, ServiceDescription
from app.evaluation.run.runner import Evaluation
from app.evaluation.tune.grid import Grid, run_split
from app.evaluation.tune.model import FoldsAnalysis, HoldoutAnalysis, Split, TuneReport, TuneRun, figure
from app.evaluation.tune.replay import Recording, point_figure_names, point_metrics
from app.settings import ChainSettings, EvaluateSettings


@dataclass(frozen=True)
class Recorded:
    """What a tuning replays: the real evaluation of the current configuration, its recording, when it
    started, and the models, store and chain it ran on (`Sieve.describe`)."""

    evaluation: Evaluation
    recording: Recording
    started_at: str
    described: ServiceDescription


@dataclass(frozen=True)
class TuneOptions:
    """The command's choices: the recommendation's tolerance and the grid's point limit (for the record)."""

    tolerance: float
    max_points: int


def self_check(replayed: PointFigures, evaluation: Evaluation) -> str:
    """The replayed current configuration against the real evaluation it was recorded from."""
    real = point_metrics(evaluation)
    off = []
    for name in point_figure_names():
        got, want = figure(replayed, name), figure(real, name)
        if (got is None) != (want is None) or (
            got is not None and want is not None and abs(got - want) > 1e-9
        ):
            off.append(f"{name} replay {got} != evaluation {want}")
    if off:
        return "MISMATCH (a replay bug; please report): " + "; ".join(off)
    return "ok: the replayed current configuration equals the real evaluation on every metric"


def _run(
    target: Recorded, grid: Grid, settings: EvaluateSettings, options: TuneOptions, check: str
) -> TuneRun:
    recording, described = target.recording, target.described
    return TuneRun.model_validate(
        {
            "startedAt": target.started_at,
            "goldenSet": recording.golden.path,
            "cases": len(recording.golden.cases),
            "k": settings.top_k,
            "asOf": recording.as_of.isoformat(),
            "gain": recording.gain,
            "tolerance": options.tolerance,
            "maxPoints": options.max_points,
            "points": len(grid.points),
            "embedder": described.embedder,
            "reranker": described.reranker,
            "collection": described.collection,
            "chunks": described.chunks,
            "chain": described.chain,
            "selfCheck": check,
        }
    )


def tune(
    target: Recorded,
    grid: Grid,
    split: Split | None,
    current: ChainSettings,
    settings: EvaluateSettings,
    options: TuneOptions,
) -> TuneReport:
    """Replay `grid` and the `current` chain settings over `target`'s recording, on the parts of `split`
    when given (`grid.run_split`), and the tuning report of it."""
    outcome = run_split(target.recording, grid, current, settings.thresholds, options.tolerance, split)
    result, analysis = outcome.result, outcome.analysis
    run = _run(target, grid, settings, options, self_check(outcome.all_current, target.evaluation))
    return TuneReport(
        run=run,
        grid=result.grid,
        rows=result.rows,
        recommendation=result.recommendation,
        cost_ms=result.cost_ms,
        current=result.current,
        split=split,
        holdout=analysis if isinstance(analysis, HoldoutAnalysis) else None,
        folds=analysis if isinstance(analysis, FoldsAnalysis) else None,
    )
