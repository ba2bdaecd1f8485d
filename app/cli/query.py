"""`sieve query`: ask the chain and show what each stage did.

`sieve query --server URL` asks a running `sieve serve` (`app.cli.client`) and prints the same table or
JSON as a query run here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app import exit_codes
from app.access.scope import Principal
from app.cli.client import ServerError, SieveClient, server_token, server_url
from app.cli.common import fail, open_sieve, settings_with
from app.settings import AccessSettings, SettingsError

# characters of a chunk's text shown after its title in the human table
SNIPPET_CHARS = 60


def add_query_command(sub: Any) -> None:
    query = sub.add_parser("query", help="retrieve through the chain and show what each stage did")
    query.add_argument("text")
    query.add_argument("--top-k", type=int)
    query.add_argument("--knowledge-tag")
    query.add_argument("--json", action="store_true", help="print the same object as POST /api/retrieve")
    query.add_argument("--debug", action="store_true", help="list every removed chunk with its reason")
    query.add_argument(
        "--as",
        dest="principal",
        metavar="NAME",
        help="retrieve in the scope of this evaluation principal (rag.access.eval_principals); with --server "
        "the token decides whose scope",
    )
    query.add_argument(
        "--server",
        metavar="URL",
        help="ask a running `sieve serve` at URL instead of loading the models here (default $SIEVE_SERVER)",
    )
    query.set_defaults(func=query_command)


def query_command(args: argparse.Namespace) -> int:
    from app.retrieve_response import RetrieveResponse, retrieve_response

    text = args.text
    if not text.strip():
        return fail("query must not be blank")
    if args.top_k is not None and not 1 <= args.top_k <= 100:
        return fail(f"--top-k must be between 1 and 100, got {args.top_k}")
    try:
        url = server_url(args.server)
        if url is not None:
            if args.principal is not None:
                return fail(
                    "--as runs a query here as an evaluation principal; with --server the token decides"
                )
            response = RetrieveResponse.model_validate(_ask_server(url, args))
        else:
            response = retrieve_response(_retrieve_here(args), debug=args.debug)
    except ServerError as exc:
        return fail(exc.message, exc.code)
    if args.json:
        print(json.dumps(response.model_dump(mode="json"), ensure_ascii=False, indent=2))
    else:
        print(render_result(response))
    return exit_codes.OK


def _retrieve_here(args: argparse.Namespace) -> Any:
    settings = settings_with()
    top_k = settings.rag.retrieval.top_k if args.top_k is None else args.top_k
    principal = _principal(settings.rag.access, args.principal)
    sieve = open_sieve(settings, suggest_server="query")
    try:
        if settings.rag.ingest.on_startup and sieve.store.count() == 0 and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        return sieve.retrieve(args.text, top_k, args.knowledge_tag, principal)
    finally:
        sieve.close()


def _principal(access: AccessSettings, name: str | None) -> Principal | None:
    """The evaluation principal `--as NAME` names (None without --as); SettingsError for an unknown name."""
    if name is None:
        return None
    from app.evaluation.golden.principals import principal_named

    found = principal_named(name, access)
    if found is None:
        known = ", ".join(sorted(access.eval_principals)) or "none"
        raise SettingsError(f"--as {name!r}: not one of rag.access.eval_principals (defined: {known})")
    return found


def _ask_server(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The server's `POST /api/retrieve` answer; the top-k default is the server's `rag.retrieval.top_k`."""
    body: dict[str, Any] = {"query": args.text, "debug": args.debug}
    if args.top_k is not None:
        body["topK"] = args.top_k
    if args.knowledge_tag is not None:
        body["knowledgeTag"] = args.knowledge_tag
    token = server_token("reader", settings_with)
    return SieveClient(url, token).retrieve(body)


def _scope_line(scope: Any) -> str:
    if scope.admin:
        return f"scope: {scope.name} (admin: every document)"
    tenant = f"tenant {scope.tenant}" if scope.tenant is not None else "no tenant"
    return f"scope: {scope.name} ({tenant}; reads as {', '.join(scope.readers)})"


def render_result(r: Any) -> str:
    """The human table of a `RetrieveResponse`: one row per document (full doc id and source; only the
    text is cut, to its first `SNIPPET_CHARS` characters), its attached chunks, then every stage."""
    origins = ", ".join(f"{k} {v}" for k, v in r.candidateOrigins.items())
    id_width = max([len("docId"), *(len(d.docId) for d in r.documents)])
    source_width = max([len("source"), *(len(d.source) for d in r.documents)])
    lines = [
        f"query: {r.query}",
        f"{r.finalCount} of {r.originalCount} candidates ({origins}); fallback used: "
        f"{'yes' if r.fallbackUsed else 'no'}; {r.latencyMs:.0f} ms",
        *([_scope_line(r.scope)] if getattr(r, "scope", None) is not None else []),
        "",
        f"{'#':>2}  {'docId':<{id_width}} {'source':<{source_width}} {'dense':>6} {'bm25':>7} {'fused':>7} "
        f"{'rerank':>7}  title / text",
    ]
    for d in r.documents:
        s = d.scores
        lines.append(
            f"{d.rank:>2}  {d.docId:<{id_width}} {d.source:<{source_width}} {_num(s.dense, 3):>6} "
            f"{_num(s.bm25, 2):>7} {_num(s.fused, 4):>7} {_num(s.rerank, 2):>7}  "
            f"{d.title}: {_snippet(d.text)}"
        )
        for a in d.attached:
            heading = a.headingPath.split(" > ")[-1]
            lines.append(f"{'':>4}+ attached {a.chunkId} [{heading}]: {_snippet(a.text)}")
    if not r.documents:
        lines.append("    (no documents)")
    lines += ["", "stages:"]
    for st in r.stages:
        if st.skipped:
            status = st.skipped
        else:
            status = f"{st.inputCount:>3} -> {st.outputCount:<3} removed {st.removed}"
            if st.added:
                status += f", added {st.added}"
        lines.append(f"  {st.name:<21} {status:<40} {st.latencyMs:7.1f} ms")
        for item in st.removedItems or []:
            lines.append(f"      - {item.doc_id} ({item.chunk_id}): {item.reason}")
        for group in st.withheld or []:
            lines.append(f"      - {group.count} hidden from readers: {group.reason}")
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _snippet(text: str) -> str:
    """The first `SNIPPET_CHARS` characters of `text` with its whitespace runs folded to one space."""
    return " ".join(text.split())[:SNIPPET_CHARS]
