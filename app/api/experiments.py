"""`POST /api/experiments` (what `sieve experiment --server` calls): the request, checked before it runs,
and the work of its job: the experiment (app/experiment/) on this server's store, models and golden set, its
reports in the server's `<rag.evaluate.output_dir>/experiments/<name or timestamp>`. The job's report is the
experiment JSON and the files written; the serving collection and the baseline are never touched."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from app import pidlock
from app.evaluation.golden.cases import GoldenSet
from app.experiment.report import experiment_json, write_experiment
from app.experiment.run import default_output_dir, experiment_lock, run_experiment
from app.experiment.spec import ExperimentSpec
from app.settings import Settings, config_source

if TYPE_CHECKING:
    from app.api.jobs import Job
    from app.service import Sieve

log = logging.getLogger(__name__)

MAX_EXPERIMENT_CHARS = 100_000


class ExperimentRequest(BaseModel):
    """An experiment file's text and whether to evaluate every variant again."""

    model_config = ConfigDict(extra="forbid")

    experiment: str = Field(
        min_length=1,
        max_length=MAX_EXPERIMENT_CHARS,
        description="the experiment file (YAML): `variants: {NAME: {dotted.settings.key: value}}` and/or "
        "`axes`, `design`, `name` (docs/cli.md, `sieve experiment`)",
    )
    rerun: bool = Field(
        False, description="evaluate every variant again, even when a stored evaluation holds"
    )


class ExperimentBusy(RuntimeError):
    """Another experiment holds this store's experiment lock."""


def experiment_work(
    settings: Settings, sieve: Sieve, spec: ExperimentSpec, golden: GoldenSet, rerun: bool
) -> Callable[[Job], dict[str, Any]]:
    """The work of an `experiment` job: under the experiment lock, run it and write its reports; the job's
    report is {"experiment": the experiment JSON, "files": the paths written}."""

    def work(job: Job) -> dict[str, Any]:
        lock_path = experiment_lock(settings)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = pidlock.acquire(lock_path)
        except pidlock.LockHeldError as held:
            raise ExperimentBusy(f"another experiment (pid {held.holder}) is running ({lock_path})") from None
        try:
            out = default_output_dir(settings, spec.name)
            run = run_experiment(spec, sieve, golden, out, "log", rerun=rerun)
            data = experiment_json(run, settings)
            paths = write_experiment(data, out, config_source())
        finally:
            pidlock.release(fd)
        log.info("job %s: experiment written to %s", job.id, out)
        return {"experiment": data, "files": [str(p) for p in paths]}

    return work
