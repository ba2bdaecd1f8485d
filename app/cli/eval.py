"""`sieve eval`, `sieve tune`, `sieve compare` and `sieve trec-eval`: the evaluation commands.

`sieve eval --server URL` runs the evaluation on a running `sieve serve` (`POST /api/evaluations/runs`) and
prints what a local run prints (`print_evaluation` of the same `EvaluationRunResponse`).

Exit codes: the table in `app.exit_codes` (0 every gate check held; 1 a gate check failed, each named
on stderr; 2 bad input: configuration, golden set, baseline report, BEIR or TREC files; with `--server`,
see `app.cli.client`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from app import exit_codes
from app.cli.common import fail, open_sieve, settings_with
from app.evaluation.compare.overrides import THRESHOLDS, EvaluationOverrides, flag, setting_key
from app.settings import ChainSettings, Settings, nested

if TYPE_CHECKING:
    from app.evaluation.render.lines import EvaluationRunResponse
    from app.service import Sieve


def add_eval_commands(sub: Any) -> None:
    ev = sub.add_parser("eval", help="run the golden set (or a BEIR dataset) through the chain and report")
    ev.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    ev.add_argument("--top-k", type=int, help="K for the metrics (default rag.evaluate.top_k)")
    ev.add_argument("--output-dir", help="report folder (default rag.evaluate.output_dir)")
    ev.add_argument(
        "--baseline",
        metavar="previous-passing|previous|none|FILE",
        help="compare with the pinned or last passing report (previous-passing, the default), the "
        "previous -latest report, nothing, or a report JSON (rag.evaluate.baseline; docs/baselines.md)",
    )
    for name in THRESHOLDS:
        ev.add_argument(flag(name), type=float, dest=name, help=f"gate: {setting_key(name)}")
    ev.add_argument(
        "--beir", metavar="DIR", help="evaluate a BEIR directory (corpus.jsonl, queries.jsonl, qrels/)"
    )
    ev.add_argument("--split", default="test", help="BEIR qrels split (default test)")
    ev.add_argument("--collection", help="collection for the BEIR corpus (default beir-<dir name>)")
    ev.add_argument(
        "--export-trec", metavar="DIR", help="also write run.trec and qrels.trec for trec_eval/ranx"
    )
    ev.add_argument(
        "--server",
        metavar="URL",
        help="run the evaluation on a running `sieve serve` at URL with its loaded models and store "
        "(admin token; default $SIEVE_SERVER)",
    )
    ev.set_defaults(func=eval_command)
    _add_tune_command(sub)

    cmp = sub.add_parser("compare", help="compare two evaluation reports (no retrieval is run)")
    cmp.add_argument("baseline", help="the baseline report JSON")
    cmp.add_argument("current", help="the report JSON to compare with it")
    cmp.add_argument("--json", action="store_true", help="print the comparison object as JSON")
    cmp.set_defaults(func=compare_command)

    te = sub.add_parser("trec-eval", help="score a TREC run file against qrels with Sieve's metrics")
    te.add_argument("qrels")
    te.add_argument("run")
    te.add_argument("--k", default="1,5,10", help="comma-separated cut-offs (default 1,5,10)")
    te.add_argument("--per-query", action="store_true", help="print every query's figures")
    te.add_argument("--complete", action="store_true", help="like trec_eval -c: missing queries score 0")
    te.add_argument("--json", action="store_true")
    te.set_defaults(func=trec_eval_command)


def _add_tune_command(sub: Any) -> None:
    """The `tune` parser."""
    tune = sub.add_parser(
        "tune",
        help="replay chain settings over one run's candidates and recommend (no model call per point)",
        description="Each PARAM is a replayable rag.chain.* key (the rag. prefix optional); GRID is "
        "start:stop:step (inclusive) or a,b,c. Several PARAMs form their cartesian product.",
    )
    tune.add_argument("grid", nargs="+", metavar="PARAM=GRID", help="e.g. chain.bm25.dense_weight=0:1:0.05")
    tune.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    tune.add_argument("--top-k", type=int, help="K for the metrics (default rag.evaluate.top_k)")
    tune.add_argument("--max-points", type=int, default=2000, help="refuse larger grids (default 2000)")
    tune.add_argument(
        "--tolerance",
        type=float,
        default=0.005,
        help="recall and nDCG the abstention recommendation may lose against the current (default 0.005)",
    )
    tune.add_argument(
        "--holdout",
        type=float,
        metavar="FRACTION",
        help="recommend on the other cases and report the recommendation on this share of them, held out "
        "(0 < FRACTION < 1; split by rag.evaluate.seed)",
    )
    tune.add_argument(
        "--folds",
        type=int,
        metavar="K",
        help="K-fold check: per fold, recommend on the other K-1 folds and score on the fold (K >= 2)",
    )
    tune.add_argument("--json", action="store_true", help="print the tune JSON")
    tune.add_argument("--output-dir", help="folder of the tune files (default rag.evaluate.output_dir)")
    tune.set_defaults(func=tune_command)


def eval_command(args: argparse.Namespace) -> int:
    from app.cli.client import ServerError, server_url

    try:
        url = server_url(args.server)
        if url is not None:
            return _eval_on_server(url, args)
    except ServerError as exc:
        return fail(exc.message, exc.code)
    return _eval_here(args)


def _eval_here(args: argparse.Namespace) -> int:
    """`sieve eval` on this machine: the golden set (or a BEIR dataset) and the baseline read before any
    model loads, then one evaluation session over the opened Sieve."""
    from app.evaluation.compare.comparison import BaselineError
    from app.evaluation.golden.beir import load_beir_cases
    from app.evaluation.golden.cases import load_golden_set
    from app.evaluation.golden.principals import check_principals
    from app.evaluation.run.runner import check_golden_against_index
    from app.evaluation.scoring.trec import export_evaluation
    from app.evaluation.session import evaluate, resolve_baseline
    from app.service import freeze_loaded_objects

    if args.top_k is not None and not 1 <= args.top_k <= 100:
        return fail(f"--top-k must be between 1 and 100, got {args.top_k}")
    settings = settings_with(*_local_overrides(args))
    ev = settings.rag.evaluate
    if args.beir:
        golden = load_beir_cases(Path(args.beir), args.split)
    else:
        golden = load_golden_set(args.golden_set or ev.resource_location)  # GoldenSetError -> exit 2
        check_principals(golden, settings.rag.access)  # GoldenSetError -> exit 2, before any model loads
    try:
        baseline = resolve_baseline(ev)  # before anything runs: a bad baseline file costs nothing
    except BaselineError as exc:
        return fail(str(exc))

    sieve = open_sieve(settings, suggest_server=None if args.beir else "eval")  # --server takes no --beir
    try:
        if args.beir:
            report = sieve.ingest([Path(args.beir) / "corpus.jsonl"], progress=True)
            if report.errors:
                for error in report.errors[:20]:
                    print(f"error: {error}", file=sys.stderr)
                return exit_codes.BAD_INPUT
        elif settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        if getattr(args, "process_start", False):
            freeze_loaded_objects()
        target = sieve.evaluation_target()
        # GoldenSetError -> exit 2, before any case runs
        check_golden_against_index(golden, target.known, ev.evidence_coverage)
        outcome = evaluate(target, ev, golden, baseline=baseline)
    finally:
        sieve.close()
    exported: list[str] = []
    if args.export_trec and outcome.evaluation is not None:
        run_path, qrels_path = export_evaluation(outcome.evaluation, Path(args.export_trec))
        exported = [f"trec run: {run_path}", f"trec qrels: {qrels_path}"]
    return print_evaluation(outcome.view(), exported)


def _local_overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The settings `sieve eval`'s flags change: the run's overrides, the report folder and, with --beir,
    the collection of its corpus."""
    overrides = [nested(setting_key(name), value) for name, value in _overrides(args).given().items()]
    if args.output_dir:
        overrides.append(nested("rag.evaluate.output_dir", args.output_dir))
    if args.beir:
        collection = args.collection or f"beir-{Path(args.beir).resolve().name}"
        overrides.append(nested("rag.store.collection", collection))
    return overrides


def _overrides(args: argparse.Namespace) -> EvaluationOverrides:
    """The run's overrides that `sieve eval`'s flags give, by the model's field names. Not validated here:
    the settings built from them are (as the YAML would be), and a server validates the request."""
    given = {name: getattr(args, name) for name in EvaluationOverrides.model_fields}
    return EvaluationOverrides.model_construct(**{k: v for k, v in given.items() if v not in (None, "")})


# flags that name files or a dataset on this machine: a server evaluates its own golden set and store
_LOCAL_ONLY_FLAGS = {
    "golden_set": "--golden-set",
    "output_dir": "--output-dir",
    "beir": "--beir",
    "collection": "--collection",
    "export_trec": "--export-trec",
}
_SERVER_BASELINES = ("previous-passing", "previous", "none")


def _eval_on_server(url: str, args: argparse.Namespace) -> int:
    """`sieve eval --server URL`: `POST /api/evaluations/runs` with the admin token; the server runs its
    golden set through its own chain and writes the reports in its `rag.evaluate.output_dir`."""
    from app.cli.client import SieveClient, server_token
    from app.evaluation.render.lines import EvaluationRunResponse

    given = [option for name, option in _LOCAL_ONLY_FLAGS.items() if getattr(args, name)]
    if args.split != "test":
        given.append("--split")
    if given:
        return fail(
            f"{', '.join(given)} cannot be used with --server: the server evaluates its own golden set "
            "(rag.evaluate.resource_location) and writes its reports in its rag.evaluate.output_dir"
        )
    if args.top_k is not None and not 1 <= args.top_k <= 100:
        return fail(f"--top-k must be between 1 and 100, got {args.top_k}")
    if args.baseline is not None and args.baseline not in _SERVER_BASELINES:
        return fail(
            f"--baseline with --server must be one of {', '.join(_SERVER_BASELINES)} (a report file is "
            f"read on the server, from its rag.evaluate.baseline), got {args.baseline!r}"
        )
    body = _overrides(args).model_dump(by_alias=True, exclude_none=True)
    answer = SieveClient(url, server_token("admin", settings_with)).evaluate(body)
    return print_evaluation(EvaluationRunResponse.model_validate(answer))


def print_evaluation(view: EvaluationRunResponse, extra: list[str] | None = None) -> int:
    """Print an `EvaluationRunResponse` as `sieve eval` does and return its exit code: the lines and the
    report files on stdout (then `extra`), gate notes on stdout, warnings and failures on stderr; 1 when
    a gate check failed."""
    from app.evaluation.render.lines import printed_lines

    out, err = printed_lines(view, extra or [])
    for line in out:
        print(line)
    for line in err:
        print(line, file=sys.stderr)
    return exit_codes.GATE_FAILED if view.gate.failures else exit_codes.OK


def tune_command(args: argparse.Namespace) -> int:
    import time

    from app.evaluation.golden.cases import load_golden_set
    from app.evaluation.golden.principals import check_principals
    from app.evaluation.render.tune import tune_markdown, tune_text, write_tune
    from app.evaluation.session import tune
    from app.evaluation.tune.grid import GridError, parse_grid
    from app.evaluation.tune.holdout import SplitError, make_split
    from app.evaluation.tune.run import TuneOptions

    problem = _tune_flag_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    overrides = _tune_overrides(args)
    settings = settings_with(*overrides)
    ev = settings.rag.evaluate.model_copy(update={"latency_sample": 0})
    try:  # every point is checked before any model loads
        grid = parse_grid(args.grid, settings.rag.chain, args.max_points)
        golden = load_golden_set(args.golden_set or ev.resource_location)  # GoldenSetError -> exit 2
        check_principals(golden, settings.rag.access)  # GoldenSetError -> exit 2, before any model loads
        split = make_split(golden.cases, args.holdout, args.folds, ev.seed)
    except (GridError, SplitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    sieve, current = _open_for_tune(settings, overrides, grid.settings)
    try:
        t0 = time.perf_counter()
        options = TuneOptions(args.tolerance, args.max_points)
        report = tune(current.evaluation_target(), golden, grid, split, ev, options)
        replay_s = time.perf_counter() - t0
    finally:
        sieve.close()
    paths = write_tune(report, ev.output_dir, ev.report_prefix)
    if args.json:
        print(tune_text(report), end="")
    else:
        print(tune_markdown(report))
        print(
            f"{len(grid.points)} points replayed in {replay_s:.2f} s "
            f"({report.cost_ms.per_point:.1f} ms per point; one real evaluation "
            f"{report.cost_ms.real_evaluation:.0f} ms)"
        )
        for path in paths:
            print(f"tune: {path}")
    if not report.run.self_check.startswith("ok"):
        print(f"warning: {report.run.self_check}", file=sys.stderr)
    return exit_codes.OK


def _tune_flag_error(args: argparse.Namespace) -> str | None:
    """What is wrong with `sieve tune`'s flags, checked before anything is read; None when nothing."""
    import math

    from app.evaluation.tune.holdout import SplitError, check_split_flags

    try:
        check_split_flags(args.holdout, args.folds)
    except SplitError as exc:
        return str(exc)
    if args.top_k is not None and not 1 <= args.top_k <= 100:
        return f"--top-k must be between 1 and 100, got {args.top_k}"
    if args.max_points < 1:
        return f"--max-points must be >= 1, got {args.max_points}"
    if not (math.isfinite(args.tolerance) and 0 <= args.tolerance <= 1):
        return f"--tolerance must be between 0 and 1, got {args.tolerance}"
    return None


def _tune_overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    overrides = []
    if args.top_k is not None:
        overrides.append(nested("rag.evaluate.top_k", args.top_k))
    if args.output_dir:
        overrides.append(nested("rag.evaluate.output_dir", args.output_dir))
    return overrides


def _open_for_tune(
    settings: Settings, overrides: list[dict[str, Any]], points: list[ChainSettings]
) -> tuple[Sieve, Sieve]:
    """The Sieve to close and the one whose chain is the current configuration: the reranker is loaded when
    a point turns it on (the current configuration still runs without it); the configured paths ingested
    first, as `sieve eval` does."""
    opening = settings
    if any(s.rerank.enabled for s in points) and not settings.rag.chain.rerank.enabled:
        opening = settings_with(*overrides, nested("rag.chain.rerank.enabled", True))
    sieve = open_sieve(opening)
    try:
        if settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        return sieve, (sieve.with_settings(settings) if opening is not settings else sieve)
    except BaseException:
        sieve.close()
        raise


def compare_command(args: argparse.Namespace) -> int:
    from app.evaluation.compare.comparison import BaselineError, compare_reports, load_report
    from app.evaluation.render.lines import baseline_line
    from app.evaluation.render.markdown import comparison_markdown, k_label

    try:
        base = load_report(args.baseline)
        current = load_report(args.current)
    except BaselineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    ev = settings_with().rag.evaluate
    compared = compare_reports(base, current, args.baseline, seed=ev.seed, alpha=ev.alpha)
    comparison = compared.to_json()
    if args.json:
        print(json.dumps(comparison, ensure_ascii=False, indent=2))
        return exit_codes.OK
    label = k_label(current)
    print(baseline_line(compared, label))
    print()
    print("\n".join(comparison_markdown(compared, None, label)))
    return exit_codes.OK


def trec_eval_command(args: argparse.Namespace) -> int:
    from app.evaluation.scoring import trec

    try:
        ks = [int(k) for k in args.k.split(",") if k.strip()]
        if not ks or min(ks) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --k must be comma-separated integers >= 1, got {args.k!r}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    result = trec.evaluate_run(
        trec.read_qrels(args.qrels), trec.read_run(args.run), ks, complete=args.complete
    )
    if args.json:
        out = {
            "aggregate": result["aggregate"],
            "perQuery": result["perQuery"],
            "queries": result["queries"],
            "convention": result["convention"],
        }
        print(json.dumps(out, indent=2))
        return exit_codes.OK
    aggregate = cast(dict[str, float | None], result["aggregate"])
    per_query = cast(dict[str, dict[str, float]], result["perQuery"])
    keys = list(aggregate)
    if args.per_query:
        for qid, values in per_query.items():
            for key in keys:
                print(f"{key:<16}{qid:<12}{values[key]:.4f}")
    for key in keys:
        value = aggregate[key]
        print(f"{key:<16}{'all':<12}{'n/a' if value is None else f'{value:.4f}'}")
    print(f"{'queries':<16}{'all':<12}{result['queries']}")
    return exit_codes.OK
