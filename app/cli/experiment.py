"""`sieve experiment FILE`: the variants of an experiment file side by side on this store (app/experiment/),
and `sieve experiment --clean`, which drops the variant collections.

Everything in the file is checked before any model loads; the base collection, the document record and the
baseline files of `rag.evaluate.output_dir` are never written. Two experiments on one store are refused (a
lock file: `<rag.store.path>/experiment.lock` embedded, `<rag.experiment.cache_dir>/experiment-<host>-<port>
.lock` on a Chroma server).

`--server URL` sends the file to a running `sieve serve` (`POST /api/experiments`), which runs it as a job on
its store and models; the command waits for the job and prints what a local run prints.

Exit codes (`app.exit_codes`): 0 done; 2 bad input (the experiment file, a settings value, the golden set,
the store budget, a token the server refuses); 3 the store is held by another process or cannot be opened,
the server cannot be reached, or its job failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app import exit_codes
from app.cli.common import _Invocation, fail, settings_with
from app.settings import Settings, config_source


def add_experiment_command(sub: Any) -> None:
    ex = sub.add_parser(
        "experiment",
        help="run variants of the settings side by side (own collections, never switched in) and compare",
        description="FILE (YAML) holds `variants: {NAME: {dotted.settings.key: value}}` and/or `axes: "
        "{key: [values]}` with `design: grid|one-at-a-time`; the base is the current configuration. "
        "See docs/cli.md.",
    )
    ex.add_argument("file", nargs="?", help="the experiment file (YAML)")
    ex.add_argument(
        "--output-dir",
        help="report folder (default <rag.evaluate.output_dir>/experiments/<name or timestamp>)",
    )
    ex.add_argument("--clean", action="store_true", help="drop this store's experiment collections and exit")
    ex.add_argument(
        "--rerun",
        action="store_true",
        help="evaluate every variant again, even when a stored evaluation of it still holds (latency)",
    )
    ex.add_argument(
        "--server",
        metavar="URL",
        help="run the experiment on a running `sieve serve` at URL, as a job on its store, models and golden "
        "set (admin token; default $SIEVE_SERVER)",
    )
    ex.set_defaults(func=experiment_command)


def experiment_command(args: argparse.Namespace) -> int:
    from app.cli.client import ServerError, server_url

    try:
        url = server_url(args.server)
        if url is not None:
            return _on_server(url, args)
    except ServerError as exc:
        return fail(exc.message, exc.code)
    return _here(args)


def _here(args: argparse.Namespace) -> int:
    """`sieve experiment` on this machine: the file checked, the locks taken, then the run."""
    from app import pidlock
    from app.evaluation.golden.cases import load_golden_set
    from app.experiment.run import default_output_dir, experiment_lock
    from app.experiment.spec import ExperimentFileError, load_spec

    settings = settings_with()
    if args.clean == bool(args.file):
        return fail("give an experiment FILE, or --clean (not both)")
    try:
        spec = None if args.clean else load_spec(args.file, settings, _Invocation.config_path)
    except ExperimentFileError as exc:
        return fail(str(exc))
    golden = None if spec is None else load_golden_set(settings.rag.evaluate.resource_location)
    lock_path = experiment_lock(settings)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = pidlock.acquire(lock_path)
    except pidlock.LockHeldError as held:
        return fail(f"another experiment (pid {held.holder}) is running on this store ({lock_path})")
    try:
        if spec is None:
            return _held(settings, lambda: _clean(settings))
        out = Path(args.output_dir) if args.output_dir else default_output_dir(settings, spec.name)
        return _held(settings, lambda: _run(spec, golden, settings, out, args.rerun))
    finally:
        pidlock.release(fd)


def _held(settings: Settings, work: Any) -> int:
    """`work()`, or the exit code of an embedded store another process holds (said on stderr, with the
    `--server` to ask instead when that process is `sieve serve`)."""
    from app.cli.common import held_store_message
    from app.store import StoreLockedError

    try:
        return int(work())
    except StoreLockedError as exc:
        message = held_store_message(exc.path, exc.holder, exc.address, settings.rag.server, "experiment")
        return fail(message, exit_codes.UNAVAILABLE)


def _clean(settings: Settings) -> int:
    from app.cli.common import open_sieve
    from app.experiment.index import is_experiment_collection

    sieve = open_sieve(settings)
    try:
        base = settings.rag.store.collection
        dropped = [n for n, m in sieve.store.collections().items() if is_experiment_collection(base, n, m)]
        for name in dropped:
            sieve.store.drop(name)
    finally:
        sieve.close()
    print(f"dropped {len(dropped)} experiment collection(s){': ' + ', '.join(dropped) if dropped else ''}")
    return exit_codes.OK


def _run(spec: Any, golden: Any, settings: Settings, out: Path, rerun: bool) -> int:
    from app.experiment.render import verdict_lines
    from app.experiment.report import experiment_json, write_experiment
    from app.experiment.run import ExperimentError
    from app.experiment.stored import reuse_only

    for note in spec.notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        run = None if rerun else reuse_only(spec, settings, golden, out)
        run = run or _full_run(spec, golden, settings, out, rerun)
    except ExperimentError as exc:
        return fail(str(exc))
    data = experiment_json(run, settings)
    paths = write_experiment(data, out, config_source(_Invocation.config_path))
    print_table(data)
    for line in verdict_lines(data):
        print(line)
    for path in paths:
        print(f"experiment: {path}")
    return exit_codes.OK


def _full_run(spec: Any, golden: Any, settings: Settings, out: Path, rerun: bool) -> Any:
    """The experiment with the models loaded: what changed built and evaluated, the rest reused."""
    from app.cli.common import open_sieve
    from app.evaluation.run.runner import check_knowledge_tags
    from app.experiment.run import run_experiment

    sieve = open_sieve(settings)
    try:
        check_knowledge_tags(golden, sieve.evaluation_target().known)  # GoldenSetError -> exit 2
        progress = "bar" if sys.stderr.isatty() else "log"
        return run_experiment(spec, sieve, golden, out, progress, rerun=rerun)
    finally:
        sieve.close()


POLL_S = 1.0
FINISHED = ("done", "failed", "interrupted", "unreadable")


def _on_server(url: str, args: argparse.Namespace) -> int:
    """`sieve experiment FILE --server URL`: `POST /api/experiments` with the file's text (the server checks
    it), then `GET /api/jobs/{id}` until the job ends; prints what a local run prints. The reports are the
    server's, in its `rag.evaluate.output_dir/experiments/`."""
    import time

    from app.cli.client import SieveClient, server_token
    from app.experiment.render import verdict_lines

    if args.clean or args.output_dir or not args.file:
        return fail(
            "with --server give an experiment FILE only: the server writes its reports in its "
            "rag.evaluate.output_dir/experiments/ (--output-dir, --clean: run them on the server's machine)"
        )
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return fail(f"{args.file}: cannot read the experiment file: {exc}")
    client = SieveClient(url, server_token("admin", settings_with))
    job_id = str(client.start_experiment({"experiment": text, "rerun": args.rerun})["job"])
    print(f"experiment: job {job_id} on {url} (GET /api/jobs/{job_id})", file=sys.stderr)
    while (job := client.job(job_id))["state"] not in FINISHED:
        time.sleep(POLL_S)
    if job["state"] != "done":
        return fail(
            f"the experiment job {job_id} ended {job['state']}: {job.get('error')}", exit_codes.UNAVAILABLE
        )
    data = job["report"]["experiment"]
    print_table(data)
    for line in verdict_lines(data):
        print(line)
    for path in job["report"]["files"]:
        print(f"experiment (on the server): {path}")
    return exit_codes.OK


def print_table(data: dict[str, Any]) -> None:
    from app.experiment.render import HEADER, table_rows

    header = [h.format(measure=data["measure"]) for h in HEADER]
    rows = [header, *table_rows(data)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
