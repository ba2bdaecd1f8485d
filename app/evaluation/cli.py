"""`sieve eval` and `sieve trec-eval`.

Exit codes: 0 every threshold holds; 1 a threshold failed (named on stderr); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.evaluation import trec
from app.evaluation.golden_set import GoldenCase, GoldenSet, GoldenSetError, load_golden_set
from app.settings import load_settings, merge, nested

EXIT_OK, EXIT_GATE, EXIT_INPUT = 0, 1, 2

_THRESHOLD_FLAGS = {
    "min_recall": "--min-recall",
    "min_hit_rate": "--min-hit-rate",
    "min_mrr": "--min-mrr",
    "min_ndcg": "--min-ndcg",
    "max_duplicate_rate": "--max-duplicate-rate",
    "max_p95_ms": "--max-p95-ms",
}


def add_eval_commands(sub: Any) -> None:
    ev = sub.add_parser("eval", help="run the golden set (or a BEIR dataset) through the chain and report")
    ev.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    ev.add_argument("--top-k", type=int, help="K for the metrics (default rag.evaluate.top_k)")
    ev.add_argument("--output-dir", help="report folder (default rag.evaluate.output_dir)")
    for name, flag in _THRESHOLD_FLAGS.items():
        ev.add_argument(flag, type=float, dest=name, help=f"gate: rag.evaluate.thresholds.{name}")
    ev.add_argument(
        "--beir", metavar="DIR", help="evaluate a BEIR directory (corpus.jsonl, queries.jsonl, qrels/)"
    )
    ev.add_argument("--split", default="test", help="BEIR qrels split (default test)")
    ev.add_argument("--collection", help="collection for the BEIR corpus (default beir-<dir name>)")
    ev.add_argument(
        "--export-trec", metavar="DIR", help="also write run.trec and qrels.trec for trec_eval/ranx"
    )
    ev.set_defaults(func=eval_command)

    te = sub.add_parser("trec-eval", help="score a TREC run file against qrels with Sieve's metrics")
    te.add_argument("qrels")
    te.add_argument("run")
    te.add_argument("--k", default="1,5,10", help="comma-separated cut-offs (default 1,5,10)")
    te.add_argument("--per-query", action="store_true", help="print every query's figures")
    te.add_argument("--complete", action="store_true", help="like trec_eval -c: missing queries score 0")
    te.add_argument("--json", action="store_true")
    te.set_defaults(func=trec_eval_command)


def eval_command(args: argparse.Namespace) -> int:
    from app.cli import open_sieve
    from app.evaluation.runner import KnownIds, evaluate
    from app.evaluation.startup import finish_evaluation, run_description

    overrides: list[dict[str, Any]] = []
    if args.top_k is not None:
        if not 1 <= args.top_k <= 100:
            print(f"error: --top-k must be between 1 and 100, got {args.top_k}", file=sys.stderr)
            return EXIT_INPUT
        overrides.append(nested("rag.evaluate.top_k", args.top_k))
    if args.output_dir:
        overrides.append(nested("rag.evaluate.output_dir", args.output_dir))
    for name in _THRESHOLD_FLAGS:
        value = getattr(args, name)
        if value is not None:
            overrides.append(nested(f"rag.evaluate.thresholds.{name}", value))
    if args.beir:
        beir = Path(args.beir)
        collection = args.collection or f"beir-{beir.resolve().name}"
        overrides.append(nested("rag.store.collection", collection))
        golden = load_beir_cases(beir, args.split)
    else:
        path = args.golden_set or load_settings().rag.evaluate.resource_location
        golden = load_golden_set(path)  # GoldenSetError -> exit 2 in app.cli.main
    settings = load_settings(merge(*overrides))

    sieve = open_sieve(settings)
    try:
        if args.beir:
            report = sieve.ingest([Path(args.beir) / "corpus.jsonl"], progress=True)
            if report.errors:
                for error in report.errors[:20]:
                    print(f"error: {error}", file=sys.stderr)
                return EXIT_INPUT
        elif settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        known = KnownIds.from_store(sieve.store)
        evaluation = evaluate(sieve.chain, golden, settings.rag.evaluate.top_k, known)
        outcome = finish_evaluation(evaluation, settings.rag.evaluate, run_description(sieve))
    finally:
        sieve.close()

    from app.evaluation.startup import summary_line

    print(summary_line(outcome.report or {}))
    for path in outcome.paths:
        print(f"report: {path}")
    if args.export_trec:
        run_path, qrels_path = export_trec(evaluation, Path(args.export_trec))
        print(f"trec run: {run_path}\ntrec qrels: {qrels_path}")
    failures = outcome.gate_failures
    for failure in failures:
        print(f"gate failed: {failure}", file=sys.stderr)
    return EXIT_GATE if failures else EXIT_OK


def load_beir_cases(directory: Path, split: str) -> GoldenSet:
    """BEIR queries + qrels/<split>.tsv as golden cases (graded relevance from the qrels scores)."""
    queries_path = directory / "queries.jsonl"
    qrels_path = directory / "qrels" / f"{split}.tsv"
    for required in (directory / "corpus.jsonl", queries_path, qrels_path):
        if not required.exists():
            raise FileNotFoundError(
                f"{required}: missing (a BEIR directory has corpus.jsonl, queries.jsonl, qrels/)"
            )
    qrels: dict[str, dict[str, float]] = {}
    for number, line in enumerate(qrels_path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if number == 1 and fields[0] == "query-id":
            continue
        if not line.strip():
            continue
        if len(fields) != 3:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'"]
            )
        try:
            grade = float(fields[2])
        except ValueError:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}:{number}: score {fields[2]!r} is not a number"]
            ) from None
        qrels.setdefault(fields[0], {})[fields[1]] = grade
    texts: dict[str, str] = {}
    for number, line in enumerate(queries_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            texts[str(item["_id"])] = str(item["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise GoldenSetError(str(queries_path), [f"{queries_path}:{number}: {exc}"]) from None
    cases = []
    for qid in sorted(qrels, key=_natural):
        if qid not in texts:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}: query {qid!r} has no text in {queries_path}"]
            )
        relevance = {doc: grade for doc, grade in qrels[qid].items()}
        if not any(g > 0 for g in relevance.values()):
            continue
        cases.append(GoldenCase.model_validate({"id": qid, "query": texts[qid], "relevance": relevance}))
    return GoldenSet(
        dataset_version=f"beir:{directory.resolve().name}:{split}", cases=cases, path=str(qrels_path)
    )


def export_trec(evaluation: Any, directory: Path) -> tuple[Path, Path]:
    """Write the evaluation's run (documents as ranked, first occurrence of each id) and qrels."""
    from app.evaluation.runner import match_key

    directory.mkdir(parents=True, exist_ok=True)
    run: dict[str, list[tuple[str, float]]] = {}
    qrels: dict[str, dict[str, float]] = {}
    for c in evaluation.cases:
        if c.result is None or c.metrics is None:
            continue
        ranked = list(dict.fromkeys(match_key(d, c.key) for d in c.result.documents[: c.k]))
        run[c.case.id] = trec.scores_from_ranking(ranked)
        qrels[c.case.id] = {doc: int(round(g)) for doc, g in c.relevance.items()}
    run_path, qrels_path = directory / "run.trec", directory / "qrels.trec"
    trec.write_run(run_path, run, tag="sieve")
    trec.write_qrels(qrels_path, qrels)
    return run_path, qrels_path


def trec_eval_command(args: argparse.Namespace) -> int:
    try:
        ks = [int(k) for k in args.k.split(",") if k.strip()]
        if not ks or min(ks) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --k must be comma-separated integers >= 1, got {args.k!r}", file=sys.stderr)
        return EXIT_INPUT
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
        return EXIT_OK
    keys = list(result["aggregate"])  # type: ignore[arg-type]
    if args.per_query:
        for qid, values in result["perQuery"].items():  # type: ignore[union-attr]
            for key in keys:
                print(f"{key:<16}{qid:<12}{values[key]:.4f}")
    for key in keys:
        value = result["aggregate"][key]  # type: ignore[index]
        print(f"{key:<16}{'all':<12}{'n/a' if value is None else f'{value:.4f}'}")
    print(f"{'queries':<16}{'all':<12}{result['queries']}")
    return EXIT_OK


def _natural(qid: str) -> tuple[int, Any]:
    return (0, int(qid)) if qid.isdigit() else (1, qid)
