"""`sieve golden ...`, `sieve label` and `sieve baseline ...`: build, label and audit the golden set, and pin
the evaluation's baseline.

Exit codes: the table in `app.exit_codes`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.evaluation.golden.authoring.generate import GenerateOptions, Passage, QuestionGenerator
    from app.evaluation.golden.authoring.llm import ChatClient
    from app.settings import GenerateSettings


def add_golden_commands(sub: Any) -> None:
    golden = sub.add_parser("golden", help="build, label and audit the golden set")
    gsub = golden.add_subparsers(dest="golden_command", required=True)
    _add_golden_subcommands(gsub)
    _add_top_level(sub)


def _add_golden_subcommands(gsub: Any) -> None:
    """`sieve golden sample | generate | pool | export | check | anchor`."""
    _add_sample(gsub)
    _add_generate(gsub)
    _add_check(gsub)
    _add_anchor(gsub)
    _add_pool(gsub)
    _add_export(gsub)


def _add_top_level(sub: Any) -> None:
    """`sieve label` and `sieve baseline`."""
    _add_baseline(sub)
    _add_label(sub)


def _add_generate(gsub: Any) -> None:
    gen = gsub.add_parser(
        "generate",
        help="make a question per passage of the ingested store (golden cases with origin: generated)",
        description="Picks N passages stratified by knowledge tag and document, makes a question per passage "
        "(offline templates or an OpenAI-compatible LLM), keeps those whose passage BM25 or dense search "
        "finds again in its top 20, and appends them to --out (docs/generation.md).",
    )
    gen.add_argument("--chunks", type=int, required=True, metavar="N", help="passages to pick")
    gen.add_argument(
        "--generator", choices=["offline", "llm"], help="default rag.generate.generator (offline)"
    )
    gen.add_argument(
        "--out",
        default="golden_set/generated.jsonl",
        help="JSONL file the cases are appended to (default golden_set/generated.jsonl)",
    )
    gen.add_argument("--seed", type=int, help="default rag.generate.seed (42)")
    gen.add_argument("--per-chunk", type=int, default=1, help="questions per passage (default 1)")
    gen.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    import sys
    from datetime import date
    from pathlib import Path

    from app import exit_codes
    from app.cli.common import open_sieve, settings_with
    from app.evaluation.golden.authoring import generate as gen
    from app.evaluation.golden.authoring.llm import ChatClient, ChatEndpoint, LlmError
    from app.files import change_line
    from app.settings import nested

    overrides = [nested("rag.generate.generator", args.generator)] if args.generator else []
    if args.seed is not None:
        overrides.append(nested("rag.generate.seed", args.seed))
    settings = settings_with(*overrides)
    cfg = settings.rag.generate
    out = Path(args.out)
    try:
        options = _generate_options(args, cfg)
        gen.check_out_path(out)
        endpoint = ChatEndpoint.from_settings(cfg.llm) if cfg.generator == "llm" else None
    except (gen.GenerateError, LlmError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    existing = gen.existing_case_ids(out)  # an invalid out file: GoldenSetError, exit 2
    sieve = open_sieve(settings)
    client = ChatClient(endpoint) if endpoint is not None else None
    try:
        if settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        passages = gen.store_passages(sieve.store)
        result = gen.generate(
            passages,
            _question_generator(client, passages, sieve.analyzer.tokens, cfg),
            gen.StoreSearcher(sieve.lexical, sieve.embedder, sieve.store),
            sieve.analyzer.tokens,
            options,
            gen.hard_filter_rule(settings.rag.chain.hard_filter, settings.rag.evaluate.as_of or date.today()),
            existing,
        )
    except LlmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.UNAVAILABLE
    finally:
        if client is not None:
            client.close()
        sieve.close()
    gen.append_cases(out, result.cases)
    for line in result.lines():
        print(line)
    after = len(existing) + len(result.cases)
    print(change_line(out, bool(result.cases), len(existing), after, "case"))
    return exit_codes.OK


def _generate_options(args: argparse.Namespace, cfg: GenerateSettings) -> GenerateOptions:
    """The options of `sieve golden generate` from its flags and `rag.generate` (GenerateError when they do
    not fit together)."""
    from app.evaluation.golden.authoring.generate import GenerateOptions

    return GenerateOptions(
        chunks=args.chunks,
        per_chunk=args.per_chunk,
        seed=cfg.seed,
        min_passage_chars=cfg.min_passage_chars,
        round_trip_k=cfg.round_trip_k,
        round_trip=GenerateOptions.round_trip_for(cfg.round_trip, cfg.generator),
    )


def _question_generator(
    client: ChatClient | None,
    passages: list[Passage],
    tokens: Callable[[str], list[str]],
    cfg: GenerateSettings,
) -> QuestionGenerator:
    """The LLM's questions when there is a chat client, else the offline templates (their key terms
    weighted by the idf of the passages' own tokens)."""
    from app.evaluation.golden.authoring import generate as gen

    if client is not None:
        return gen.LlmGenerator(client)
    idf = gen.CorpusIdf.of(tokens(p.indexed_text) for p in passages)
    return gen.OfflineGenerator(tokens, idf, cfg.seed, cfg.key_terms)


def _add_anchor(gsub: Any) -> None:
    anchor = gsub.add_parser(
        "anchor",
        help="rewrite chunk-id evidence and chunk judgments as quotes, using the current index",
        description="Each evidenceChunkIds entry, anyOf chunk id and chunk judgment the index holds "
        "becomes a quote of that chunk's text ({docId, quote}), which resolves on any chunking; stale "
        "and ambiguous ids and expectedChunkIds are kept and listed (docs/golden-set.md). Writes --out "
        "(default <name>.anchored.json beside the golden set); an existing file is replaced only with "
        "--force, and the golden set itself only with --in-place.",
    )
    anchor.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    where = anchor.add_mutually_exclusive_group()
    where.add_argument("--out", help="file to write (default: <name>.anchored<suffix> beside the golden set)")
    where.add_argument("--in-place", action="store_true", help="rewrite the golden set file itself")
    anchor.add_argument("--force", action="store_true", help="replace --out when it exists")
    anchor.set_defaults(func=_anchor)


def _anchor(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from app import exit_codes
    from app.cli.common import open_sieve, settings_with
    from app.evaluation.golden import anchor
    from app.evaluation.golden.cases import load_golden_set
    from app.files import atomic_write_text

    settings = settings_with()
    source = Path(args.golden_set or settings.rag.evaluate.resource_location)
    golden = load_golden_set(source)  # GoldenSetError -> exit 2
    out = source if args.in_place else Path(args.out) if args.out else anchor.default_out(source)
    if out.exists() and not (args.force or args.in_place):
        print(f"error: {out} exists; pass --force to replace it (or --out FILE)", file=sys.stderr)
        return exit_codes.BAD_INPUT
    top, cases, form = anchor.read_raw(source)
    sieve = open_sieve(settings)
    try:
        if settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        chunks, unique = _anchor_sources(sieve, golden)
    finally:
        sieve.close()
    report = anchor.AnchorReport()
    anchored = [anchor.anchor_case(c, chunks, unique, report) for c in cases]
    atomic_write_text(out, anchor.render_raw(top, anchored, form))
    for line in report.lines():
        print(line)
    print(f"wrote {out} ({len(anchored)} cases)")
    return exit_codes.OK


def _anchor_sources(sieve: Any, golden: Any) -> tuple[Any, Any]:
    """(chunk id -> (doc id, normalised text) for the chunk ids `golden` names that the index holds, and
    whether a quote occurs once in its document's text on this index)."""
    from app.evaluation.run.runner import KnownIds
    from app.ingest.ids import looks_like_chunk_id
    from app.ingest.spans import normalise, occurrences

    known = KnownIds.from_store(sieve.store, sieve.record)
    named = {
        i
        for c in golden.cases
        for i in [
            *c.evidence_chunk_ids,
            *c.judgments,
            *(x for g in c.any_of for x in g if isinstance(x, str)),
        ]
        if looks_like_chunk_id(i) and i in known.chunk
    }
    stored = sieve.store.get(sorted(named), include_embeddings=False)
    # the chunk's own text with its whitespace runs made one space: readable (full-width punctuation kept),
    # and compared normalised like every quote
    chunks = {c.chunk_id: (str(c.metadata.get("doc_id", "")), " ".join(c.text.split())) for c in stored}
    texts = known.texts([d for d, _ in chunks.values()]) if known.texts else {}

    def unique(doc_id: str, quote: str) -> bool:
        return len(occurrences(texts.get(doc_id, ""), normalise(quote), limit=2)) == 1

    return chunks, unique


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
    from app.cli.common import open_sieve, settings_with
    from app.evaluation.golden.audit import source
    from app.evaluation.golden.cases import load_golden_set
    from app.evaluation.golden.principals import check_principals
    from app.evaluation.render.audit import audit_json, audit_text
    from app.evaluation.run.runner import KnownIds, check_golden_against_index

    settings = settings_with()
    ev = settings.rag.evaluate
    golden = load_golden_set(args.golden_set or ev.resource_location)  # GoldenSetError -> exit 2
    check_principals(golden, settings.rag.access)  # GoldenSetError -> exit 2
    sieve = open_sieve(settings)
    try:
        if settings.rag.ingest.on_startup and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        known = KnownIds.from_store(sieve.store, sieve.record)
        check_golden_against_index(golden, known, ev.evidence_coverage)  # GoldenSetError -> exit 2
        audit_source = source.AuditSource(sieve.store, sieve.embedder, settings.rag.chain.hard_filter)
        result = source.run_audit(
            golden,
            audit_source,
            ev.as_of or date.today(),
            source.previous_report_path(ev),
            ev.audit.near_duplicate_cosine,
        )
    finally:
        sieve.close()
    text = json.dumps(audit_json(result), ensure_ascii=False, indent=2) if args.json else None
    print(text if text is not None else audit_text(result), end="")
    if args.json:
        print()
    return exit_codes.GATE_FAILED if args.strict and result.total_findings else exit_codes.OK


def _add_baseline(sub: Any) -> None:
    baseline = sub.add_parser(
        "baseline",
        help="pin, accept, unpin or show the report the evaluation compares with",
        description="With rag.evaluate.baseline: previous-passing (the default) a run is compared with the "
        "pinned report, else the last report whose gate passed on a valid golden set (docs/baselines.md).",
    )
    bsub = baseline.add_subparsers(dest="baseline_command", required=True)
    pin = bsub.add_parser("pin", help="check FILE is a usable report and pin a copy of it as the baseline")
    pin.add_argument("file", metavar="FILE", help="an evaluation report JSON")
    accept = bsub.add_parser(
        "accept",
        help="make a run the last passing baseline on purpose (a lower level accepted), default the latest",
        description="A run replaces the last passing baseline by itself only when it passes and is not worse "
        "(rag.evaluate.baseline_tolerance). `accept` makes FILE (default: <prefix>-latest.json) the last "
        "passing baseline whatever its gate said and however it compares; a pinned report still comes first.",
    )
    accept.add_argument(
        "file", metavar="FILE", nargs="?", help="an evaluation report JSON (default: the latest)"
    )
    unpin = bsub.add_parser("unpin", help="remove the pinned report (the last passing one is used again)")
    show = bsub.add_parser("show", help="which report the next run would be compared with, and why")
    for parser in (pin, accept, unpin, show):
        parser.add_argument("--output-dir", help="report folder (default rag.evaluate.output_dir)")
    accept.set_defaults(func=_baseline_accept)
    pin.set_defaults(func=_baseline_pin)
    unpin.set_defaults(func=_baseline_unpin)
    show.set_defaults(func=_baseline_show)


def _evaluate_settings(args: argparse.Namespace) -> Any:
    from app.cli.common import settings_with
    from app.settings import nested

    overrides = [nested("rag.evaluate.output_dir", args.output_dir)] if args.output_dir else []
    return settings_with(*overrides).rag.evaluate


def _baseline_pin(args: argparse.Namespace) -> int:
    from app import exit_codes
    from app.evaluation.compare import baselines
    from app.evaluation.compare.baselines import report_line

    ev = _evaluate_settings(args)
    path, report = baselines.pin(args.file, ev)  # BaselineError -> exit 2, naming the file
    print(f"pinned {args.file} as {report_line(path)}")
    if not report.gate.passed:
        print("note: that report's gate FAILED; it is the baseline all the same, as pinned")
    if ev.baseline != baselines.PREVIOUS_PASSING:
        print(f"note: rag.evaluate.baseline is {ev.baseline}: the pin is used only with previous-passing")
    return exit_codes.OK


def _baseline_accept(args: argparse.Namespace) -> int:
    from app import exit_codes
    from app.evaluation.compare import baselines
    from app.evaluation.compare.baselines import report_line

    ev = _evaluate_settings(args)
    path, report, source = baselines.accept(args.file, ev)  # BaselineError -> exit 2, naming the file
    print(f"accepted {source} as the last passing baseline: {report_line(path)}")
    if not report.gate.passed:
        print("note: that report's gate FAILED; it is the baseline all the same, as accepted")
    if baselines.pinned_report_path(ev).exists():
        print(f"note: {baselines.pinned_report_path(ev)} is pinned and comes first (sieve baseline unpin)")
    if ev.baseline != baselines.PREVIOUS_PASSING:
        print(
            f"note: rag.evaluate.baseline is {ev.baseline}: the last passing report is used only with "
            "previous-passing"
        )
    return exit_codes.OK


def _baseline_unpin(args: argparse.Namespace) -> int:
    from app import exit_codes
    from app.evaluation.compare import baselines

    removed = baselines.unpin(_evaluate_settings(args))
    print(f"unpinned: removed {removed}" if removed else "nothing was pinned")
    return exit_codes.OK


def _baseline_show(args: argparse.Namespace) -> int:
    from app import exit_codes
    from app.evaluation.compare import baselines

    for line in baselines.show(_evaluate_settings(args)):  # BaselineError -> exit 2
        print(line)
    return exit_codes.OK


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
        "--near-duplicate-cosine",
        type=float,
        help="near duplicates from this cosine (default rag.evaluate.audit.near_duplicate_cosine, 0.95)",
    )
    sample.set_defaults(func=_sample)


def _sample(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from app import exit_codes
    from app.cli.common import settings_with
    from app.evaluation.golden.authoring import sample
    from app.models import load_embedder
    from app.querylog_files import log_files
    from app.settings import nested

    settings = settings_with(nested("rag.models.trace_queries", False))
    logs = [Path(p) for p in args.log] if args.log else log_files(Path(settings.rag.querylog.path))
    if not logs:
        return _no_query_log(settings.rag.querylog)
    near_duplicate = args.near_duplicate_cosine
    if near_duplicate is None:
        near_duplicate = settings.rag.evaluate.audit.near_duplicate_cosine
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
            threshold=near_duplicate,
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


# the recorded query log of the sample knowledge base (docs/query-log.md)
SAMPLE_QUERY_LOG = "golden_set/query-log.sample.jsonl"


def _no_query_log(querylog: Any) -> int:
    """No --log and no file at rag.querylog.path: say where it looked, how a log comes to be, and the
    sample log to try the command on."""
    from pathlib import Path

    from app.cli.common import fail

    recording = "" if querylog.enabled else "; the server writes it with rag.querylog.enabled: true"
    sample = f", e.g. --log {SAMPLE_QUERY_LOG} (a recorded log)" if Path(SAMPLE_QUERY_LOG).exists() else ""
    return fail(f"no query log at {querylog.path} (rag.querylog.path{recording}): pass --log PATH{sample}")


# -- labelling: `sieve label`, `sieve golden pool`, `sieve golden export` (docs/labelling.md) ----------------

LABEL_PORT = 8765


def _add_label(sub: Any) -> None:
    label = sub.add_parser(
        "label",
        help="serve the labelling page: judge pooled candidates of draft and partly judged cases",
        description="Serves the labelling page (docs/labelling.md) and prints its URL, which carries a "
        "one-time token: every write needs it. Judgments are appended to --judgments; `sieve golden "
        "export` merges them into the golden set.",
    )
    label.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    label.add_argument(
        "--port", type=int, default=LABEL_PORT, help=f"port (default {LABEL_PORT}; 0 = any free port)"
    )
    _add_label_files(label)
    label.add_argument("--who", help="the rater name the page suggests (default: your login name)")
    label.set_defaults(func=_label)


def _add_label_files(parser: Any) -> None:
    parser.add_argument("--golden-set", help="golden set file (default rag.evaluate.resource_location)")
    parser.add_argument("--drafts", help="draft cases, JSONL (default rag.label.drafts; may be missing)")
    parser.add_argument("--judgments", help="judgments file (default rag.label.judgments)")


def _label(args: argparse.Namespace) -> int:
    import getpass
    import secrets
    import sys

    from app import exit_codes
    from app.cli.common import settings_with
    from app.evaluation.golden.authoring.judgments import JudgmentsError
    from app.evaluation.golden.authoring.pool import QueueError
    from app.evaluation.golden.cases import GoldenSetError
    from app.files import change_line
    from app.label_desk import LabelDesk, LabelFiles
    from app.settings import nested

    if not 0 <= args.port <= 65535:
        print(f"error: --port must be between 0 and 65535, got {args.port}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    token = secrets.token_urlsafe(32)
    settings = settings_with(nested("rag.server.admin_token", token))
    try:
        who = args.who or getpass.getuser()
    except (KeyError, OSError):
        who = None
    files = LabelFiles.from_settings(
        settings, golden_set=args.golden_set, drafts=args.drafts, judgments=args.judgments, who=who
    )
    desk = LabelDesk(files)
    try:  # bad files fail here, before the models load
        desk.cases()
        judged_before = len(desk.log.read()[0])
        desk.queued()
    except (GoldenSetError, JudgmentsError, QueueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    print(f"golden set {files.golden_set}; drafts {files.drafts}; judgments appended to {files.judgments}")
    code = _serve_label(settings, desk, args.host, args.port, token)
    try:
        judged = len(desk.log.read()[0])
    except JudgmentsError:  # edited by hand meanwhile: `sieve golden export` will name the line
        return code
    print(change_line(files.judgments, judged != judged_before, judged_before, judged, "judgment"))
    return code


def _serve_label(settings: Any, desk: Any, host: str, port: int, token: str) -> int:
    """Run the labelling app until Ctrl-C or SIGTERM; print the page's URL (with the token in its fragment,
    which the browser never sends to a server or a log) once the port is bound."""
    import signal

    import uvicorn

    from app import exit_codes
    from app.main import create_label_app

    exit_code = {"code": 0}
    server: uvicorn.Server | None = None

    def on_fatal(code: int) -> None:
        exit_code["code"] = code
        if server is not None:
            server.should_exit = True

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()[1] if self.servers else port
                shown = f"[{host}]" if ":" in host else host
                print(f"labelling page: http://{shown}:{bound}/label#token={token}", flush=True)
                if host not in ("127.0.0.1", "localhost", "::1"):
                    print(
                        f"note: bound to {host}: anyone who can reach it and has the URL can write judgments"
                    )

    app = create_label_app(settings, desk, on_fatal=on_fatal)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", log_config=None))
    # uvicorn re-raises the SIGTERM that stopped it; a shutdown on request is a success (as `sieve serve`)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started and not exit_code["code"]:
        return exit_codes.UNAVAILABLE  # the port could not be bound (uvicorn logged why)
    return exit_code["code"]


def _add_pool(gsub: Any) -> None:
    pool = gsub.add_parser(
        "pool",
        help="queue the unjudged top-K documents of a report or comparison for the labelling page",
        description="Reads a report JSON (sieve eval) or a comparison JSON (sieve compare --json) and "
        "replaces the label queue (--queue, default rag.label.queue) with the unjudged top-K ids of each "
        "case (of a comparison: the new unjudged documents of its fixed, broken and worsened cases). The "
        "labelling page shows the queued cases first.",
    )
    pool.add_argument("--report", required=True, metavar="FILE", help="report or comparison JSON")
    pool.add_argument("--top-k", type=int, help="at most this many of each case's top K (default: its K)")
    pool.add_argument("--queue", help="queue file (default rag.label.queue)")
    pool.set_defaults(func=_pool)


def _pool(args: argparse.Namespace) -> int:
    import sys

    from app import exit_codes
    from app.cli.common import settings_with
    from app.evaluation.golden.authoring.pool import QueueError, queue_report_file

    queue = args.queue or settings_with().rag.label.queue
    try:
        entries = queue_report_file(args.report, queue, args.top_k)
    except QueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    ids = sum(len(e.ids) for e in entries)
    print(f"queued {ids} unjudged id(s) of {len(entries)} case(s) from {args.report} into {queue}")
    return exit_codes.OK


def _add_export(gsub: Any) -> None:
    export = gsub.add_parser(
        "export",
        help="merge the labelling page's judgments into the golden set",
        description="Merges --judgments into the golden set: grades into each case's judgments (chunk ids), "
        "forbidden into forbiddenDocIds, no answer into expectNoAnswer; a draft case with a grade > 0 or "
        "no answer is promoted into the golden set. A rater's latest judgment wins. Conflicts (raters "
        "disagreeing, forbidden vs relevant, or against the case) are listed and not applied. The result "
        "is validated before it replaces the file. Exit codes: 0 merged; 1 merged, but conflicts were "
        "left out (listed on stderr); 2 bad input.",
    )
    _add_label_files(export)
    export.add_argument(
        "--out",
        help="write the merged golden set here (default: rewrite the golden set in place, atomically)",
    )
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    import sys

    from app import exit_codes
    from app.cli.common import settings_with
    from app.evaluation.golden.authoring.judgments import JudgmentsError, export_files

    settings = settings_with()
    golden = args.golden_set or settings.rag.evaluate.resource_location
    judgments = args.judgments or settings.rag.label.judgments
    try:
        outcome = export_files(golden, args.drafts or settings.rag.label.drafts, judgments, args.out)
    except JudgmentsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    result = outcome.result
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"merged {judgments}: {result.applied} judgment(s) applied, {len(result.promoted)} draft(s) "
        f"promoted{': ' + ', '.join(result.promoted) if result.promoted else ''}, "
        f"{len(result.conflicts)} conflict(s)"
    )
    print(outcome.file_line())
    for conflict in result.conflicts:
        print(f"conflict (not applied): {conflict.message()}", file=sys.stderr)
    return exit_codes.GATE_FAILED if result.conflicts else exit_codes.OK
