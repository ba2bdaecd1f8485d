"""`sieve golden ...`, `sieve label` and `sieve baseline ...`: build, label and audit the golden set, and pin
the evaluation's baseline.

Exit codes: the table in `app.exit_codes`.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_golden_commands(sub: Any) -> None:
    golden = sub.add_parser("golden", help="build, label and audit the golden set")
    gsub = golden.add_subparsers(dest="golden_command", required=True)
    _add_golden_subcommands(gsub)
    _add_top_level(sub)


def _add_golden_subcommands(gsub: Any) -> None:
    """`sieve golden sample | generate | pool | export | check`."""
    _add_sample(gsub)
    _add_check(gsub)


def _add_top_level(sub: Any) -> None:
    """`sieve label` and `sieve baseline`."""


def _add_sample(gsub: Any) -> None:
    sample = gsub.add_parser(
        "sample",
        help="draft golden cases from the query log: novel, deduplicated, stratified by knowledge tag",
        description="Reads the query log, drops invalid input, exact and near duplicates and queries the "
        "golden set (or the out file) already has, prefers queries far from every golden query, splits N "
        "over the knowledge tags in proportion, and appends N draft cases to --out (docs/query-log.md).",
    )
    sample.add_argument("--from-log", type=int, required=True, metavar="N", help="draft cases to write")
    sample.add_argument(
        "--log",
        nargs="+",
        metavar="PATH",
        help="query-log files (default: rag.querylog.path and its rotated files)",
    )
    sample.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    sample.add_argument(
        "--out",
        default="golden_set/drafts.jsonl",
        help="JSONL file the drafts are appended to (default golden_set/drafts.jsonl)",
    )
    sample.add_argument("--seed", type=int, default=42, help="order among equally novel queries (42)")
    sample.add_argument(
        "--min-length", type=int, default=3, help="shortest query kept, a CJK character counting 2 (3)"
    )
    sample.add_argument(
        "--near-duplicate-cosine", type=float, default=0.95, help="near duplicates from this cosine (0.95)"
    )
    sample.set_defaults(func=_sample)


def _sample(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from app import exit_codes
    from app.api.querylog import log_files
    from app.cli import settings_with
    from app.evaluation.build import sample
    from app.models import load_embedder
    from app.settings import nested

    settings = settings_with(nested("rag.models.trace_queries", False))
    logs = [Path(p) for p in args.log] if args.log else log_files(Path(settings.rag.querylog.path))
    embedder = None

    def embed(texts: list[str]) -> Any:
        nonlocal embedder
        if embedder is None:
            embedder = load_embedder(settings.rag.models)
        return embedder.embed_queries(texts)

    try:
        result = sample.sample_from_log(
            logs,
            Path(args.golden_set or settings.rag.evaluate.resource_location),
            Path(args.out),
            args.from_log,
            embed,
            min_length=args.min_length,
            threshold=args.near_duplicate_cosine,
            seed=args.seed,
        )  # GoldenSetError (golden set or out file) -> exit 2
    except sample.SampleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    finally:
        if embedder is not None:
            embedder.close()
    for line in result.lines():
        print(line)
    return exit_codes.OK


def _add_check(gsub: Any) -> None:
    check = gsub.add_parser(
        "check",
        help="audit the golden set against the index: duplicates, stale ids, filtered or copied "
        "documents, coverage",
        description="Lists duplicate and near-duplicate queries, stale ids (with a remap by content hash), "
        "expected documents the hard filter removes, documents with copies under other ids, documents "
        "relevant and forbidden within one group, and what no case touches (docs/golden-set-audit.md). "
        "Exit 0 when it ran (findings are information), 1 with --strict and any finding, 2 on a broken "
        "golden set.",
    )
    check.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    check.add_argument("--json", action="store_true", help="print the audit as JSON")
    check.add_argument("--strict", action="store_true", help="exit 1 when there is any finding")
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    import json
    from datetime import date

    from app import exit_codes
    from app.cli import open_sieve, settings_with
    from app.evaluation.build import audit
    from app.evaluation.golden_set import load_golden_set
    from app.evaluation.records import to_json
    from app.evaluation.runner import KnownIds, check_knowledge_tags

    settings = settings_with()
    ev = settings.rag.evaluate
    golden = load_golden_set(args.golden_set or ev.resource_location)  # GoldenSetError -> exit 2
    sieve = open_sieve(settings)
    try:
        if settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        check_knowledge_tags(golden, KnownIds.from_store(sieve.store))  # GoldenSetError -> exit 2
        source = audit.AuditSource(sieve.store, sieve.embedder, settings.rag.chain.hard_filter)
        result = audit.run_audit(
            golden,
            source,
            ev.as_of or date.today(),
            audit.previous_report_path(ev),
            ev.audit.near_duplicate_cosine,
        )
    finally:
        sieve.close()
    found = to_json(result)
    print(json.dumps(found, ensure_ascii=False, indent=2) if args.json else audit.audit_text(found), end="")
    if args.json:
        print()
    return exit_codes.GATE_FAILED if args.strict and result.total_findings else exit_codes.OK
