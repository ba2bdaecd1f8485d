"""Access scopes through the real HTTP server (`python -m app serve`, the packaged e5) on a real `chroma run`
server, with the exact search and the post-filter off, so every scoped query is Chroma's own `where` with
`$contains` over HTTP.

Fail closed, one rule a test: no token, an unknown token and `rag.server.api_token` are 401s; a principal
without groups reads `public` only; a document without an access list is the admin's only; writes need the
admin token; the write API keeps `tenant` and `access` (a lone string one entry, never split) and refuses
what is not a name with a 422 naming the field. Then a Hypothesis property: random documents written
through the API, random principals, random queries; nothing the principal may not read (by `may_read` over
the metadata written) is ever returned, attached or listed as removed, and a principal gets an answer
exactly when it may read some document."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.access.scope import Principal, may_read
from app.ingest.chunker import chunk_document
from app.ingest.types import Document
from app.settings import IngestSettings
from tests.conftest import find_free_port
from tests.fixtures.processes import stop_process
from tests.fixtures.sieve_serve import EXIT_TIMEOUT_S, clean_env, spawn_serve, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
ADMIN_TOKEN = "access-server-admin-token-01"
API_TOKEN = "access-server-shared-token-01"

# Every principal the property draws from: each tenant (or none) x each set of groups x a user or none.
TENANTS = [None, "acme", "globex"]
GROUPS = [(), ("hr",), ("sales",), ("hr", "sales")]
USERS = [None, "ann"]
PRINCIPALS = {
    f"p{i}": Principal(f"p{i}", tenant=t, groups=g, user=u)
    for i, (t, g, u) in enumerate(itertools.product(TENANTS, GROUPS, USERS))
}
PRINCIPALS["comma"] = Principal("comma", tenant="acme", groups=("hr,sales",))


def token_of(name: str) -> str:
    return f"token-of-{name}-0123456789"


def config(tmp: Path, chroma: tuple[str, int]) -> dict[str, Any]:
    host, port = chroma
    principals = {
        name: {
            "token_sha256": hashlib.sha256(token_of(name).encode()).hexdigest(),
            "tenant": p.tenant,
            "groups": list(p.groups),
            "user": p.user,
        }
        for name, p in PRINCIPALS.items()
    }
    return {
        "rag": {
            "store": {
                "mode": "http",
                "host": host,
                "port": port,
                "collection": f"access-{uuid.uuid4().hex[:10]}",
                "exact_search_max_chunks": 0,
            },
            "models": {"cache_dir": str(MODELS_CACHE)},
            "lexical": {"path": str(tmp / "lexical")},
            "ingest": {"paths": [], "on_startup": False},
            "evaluate": {"enabled": False, "output_dir": str(tmp / "eval")},
            "retrieval": {"tag_post_filter_max": 0},
            "chain": {"rerank": {"enabled": False}},
            "server": {"admin_token": ADMIN_TOKEN, "api_token": API_TOKEN, "jobs_dir": str(tmp / "jobs")},
            "querylog": {"enabled": True, "path": str(tmp / "querylog" / "queries.jsonl")},
            "access": {"enabled": True, "principals": principals},
        }
    }


@dataclass
class Server:
    url: str
    client: httpx.Client
    start: Callable[[], subprocess.Popen]  # starts the server process on its port, once ready
    proc: subprocess.Popen
    # every document written, by id: its tenant and access as sent (None: not sent)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the chunk ids of every document written, to the id of their document
    chunk_doc: dict[str, str] = field(default_factory=dict)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)  # the last body written, by id

    def write(self, docs: list[dict[str, Any]], token: str = ADMIN_TOKEN) -> httpx.Response:
        answer = self.client.post(
            "/api/documents", json={"documents": docs}, headers={"Authorization": f"Bearer {token}"}
        )
        if answer.status_code == 200:
            for doc in docs:
                access = doc.get("access")
                self.written[doc["id"]] = {
                    "tenant": doc.get("tenant"),
                    # a lone string is one entry; an empty list, none
                    "access": ([access] if isinstance(access, str) else access) or None,
                }
                self.chunk_doc.update(dict.fromkeys(chunk_ids(doc), doc["id"]))
                self.sent[doc["id"]] = doc
        return answer

    def retrieve(self, query: str, token: str | None, top_k: int = 10, **body: Any) -> httpx.Response:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return self.client.post(
            "/api/retrieve", json={"query": query, "topK": top_k, **body}, headers=headers
        )

    def restart(self) -> None:
        stop_process(self.proc, EXIT_TIMEOUT_S)
        assert self.proc.returncode == 0, self.proc.returncode
        self.proc = self.start()

    def doc_ids(self, query: str, principal: str, top_k: int = 10) -> set[str]:
        answer = self.retrieve(query, token_of(principal), top_k)
        assert answer.status_code == 200, answer.text
        return {d["docId"] for d in answer.json()["documents"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, chroma_server: tuple[str, int]) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("access-server")
    config_path = tmp / "application.yml"
    config_path.write_text(yaml.safe_dump(config(tmp, chroma_server)), encoding="utf-8")
    port = find_free_port()
    log_path = tmp / "serve.log"
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen:
        proc = spawn_serve(clean_env(SIEVE_CONFIG=str(config_path)), port, log_path)
        try:
            wait_ready(proc, url, log_path)
        except BaseException:
            stop_process(proc, EXIT_TIMEOUT_S)
            raise
        return proc

    with httpx.Client(base_url=url, timeout=60) as client:
        server = Server(url, client, start, start())
        try:
            yield server
        finally:
            stop_process(server.proc, EXIT_TIMEOUT_S)


def doc(doc_id: str, text: str, **fields: Any) -> dict[str, Any]:
    return {"id": doc_id, "title": doc_id, "text": text, **fields}


# -- fail closed ---------------------------------------------------------------------------------------------


def test_no_token_is_a_401(server: Server) -> None:
    answer = server.retrieve("salary", None)
    assert answer.status_code == 401
    assert "access scopes are on (rag.access.enabled)" in answer.json()["error"]


def test_an_unknown_token_is_a_401(server: Server) -> None:
    answer = server.retrieve("salary", "not-anyones-token-0123456789")
    assert answer.status_code == 401
    assert "this token is not one of them" in answer.json()["error"]


def test_the_shared_api_token_is_a_401_with_access_scopes_on(server: Server) -> None:
    answer = server.retrieve("salary", API_TOKEN)
    assert answer.status_code == 401
    assert "this token is not one of them" in answer.json()["error"]


def named(tenant: str | None, groups: tuple[str, ...], user: str | None = None) -> str:
    """The name of the configured principal with this scope."""
    return next(n for n, p in PRINCIPALS.items() if (p.tenant, p.groups, p.user) == (tenant, groups, user))


def test_a_principal_without_groups_reads_public_only(server: Server) -> None:
    # distinct texts: the diversity stage drops near copies (max_cosine)
    assert (
        server.write(
            [
                doc("nogroup-public", "The parking garage opens at seven.", tenant="acme", access=["public"]),
                doc(
                    "nogroup-hr",
                    "HR staff may park on level two of the garage, next to the lifts.",
                    tenant="acme",
                    access=["group:hr"],
                ),
                doc(
                    "nogroup-ann",
                    "Ann's reserved garage space is number 14, by the bicycle racks.",
                    tenant="acme",
                    access=["user:ann"],
                ),
            ]
        ).status_code
        == 200
    )
    query = "When does the parking garage open?"
    seen = server.doc_ids(query, named("acme", ()))
    assert "nogroup-public" in seen
    assert not seen & {"nogroup-hr", "nogroup-ann"}
    assert {"nogroup-public", "nogroup-hr", "nogroup-ann"} <= server.doc_ids(
        query, named("acme", ("hr",), "ann")
    )


def test_a_document_without_access_is_read_by_the_admin_only(server: Server) -> None:
    minutes = "Quarterly board minutes: the submarine sandwich budget was approved unanimously."
    lunch = "The board's submarine sandwich lunch is ordered from the bakery on Fridays."
    written = server.write([doc("no-scope-minutes", minutes), doc("tenant-only", lunch, tenant="acme")])
    assert written.status_code == 200, written.text
    query = "submarine sandwich budget board minutes"
    answer = server.retrieve(query, ADMIN_TOKEN)
    assert {"no-scope-minutes", "tenant-only"} <= {d["docId"] for d in answer.json()["documents"]}
    for name in PRINCIPALS:
        assert not server.doc_ids(query, name) & {"no-scope-minutes", "tenant-only"}, name


def test_a_write_with_a_principals_token_is_refused(server: Server) -> None:
    # a principal's token is known but not allowed (403, naming whom it reads as); the shared reader token
    # is no principal at all (401)
    for token, status, says in (
        (token_of("p0"), 403, "this token reads as principal 'p0'; this endpoint needs the admin token"),
        (API_TOKEN, 401, "missing or wrong admin token"),
    ):
        answer = server.write([doc("by-a-reader", "a reader may not write", access=["public"])], token=token)
        assert answer.status_code == status
        assert says in answer.json()["error"]
    assert "by-a-reader" not in server.doc_ids("a reader may not write", "p0")


def test_the_write_api_keeps_tenant_and_access_and_a_lone_string_is_one_entry(server: Server) -> None:
    written = server.write(
        [
            doc(
                "hangar-joined",
                "The zeppelin hangar keys are kept in the red cabinet.",
                tenant="acme",
                access="group:hr,group:sales",
            ),
            doc(
                "hangar-hr",
                "HR signs out the zeppelin hangar keys from reception each morning.",
                tenant="acme",
                access="group:hr",
            ),
        ]
    )
    assert written.status_code == 200, written.text
    query = "Where are the zeppelin hangar keys?"
    both = named("acme", ("hr", "sales"))
    assert server.doc_ids(query, both) & {"hangar-joined", "hangar-hr"} == {"hangar-hr"}
    assert server.doc_ids(query, "comma") & {"hangar-joined", "hangar-hr"} == set()
    admin = server.retrieve(query, ADMIN_TOKEN).json()
    assert {"hangar-joined", "hangar-hr"} <= {d["docId"] for d in admin["documents"]}


@pytest.mark.parametrize(
    ("fields", "field_name", "message"),
    [
        ({"access": ["public", 3]}, "documents.0.access", "'access' entry 1 must be a string, got int"),
        ({"access": 7}, "documents.0.access", "'access' must be a list of strings, got int"),
        ({"access": [" public"]}, "documents.0.access", "'access' entry 0 ' public' has spaces around it"),
        ({"tenant": 5}, "documents.0.tenant", "'tenant' must be a string, got int"),
        ({"tenant": ""}, "documents.0.tenant", "'tenant' is empty"),
    ],
)
def test_a_write_with_a_bad_scope_is_a_422_naming_the_field(
    server: Server, fields: dict[str, Any], field_name: str, message: str
) -> None:
    answer = server.write([doc("bad-scope", "never stored", **fields)])
    assert answer.status_code == 422
    body = answer.json()
    assert body["error"] == f"documents[0] (id bad-scope): {message}"
    assert [f["field"] for f in body["fields"]] == [field_name]


def test_the_debug_answer_and_the_query_log_name_the_principal(server: Server) -> None:
    hr = named("acme", ("hr",))
    query = "debug scope check query about the parking garage"
    answer = server.retrieve(query, token_of(hr), debug=True)
    assert answer.json()["scope"] == {
        "name": hr,
        "admin": False,
        "tenant": "acme",
        "readers": ["group:hr", "public"],
    }
    assert "scope" not in server.retrieve(query, token_of(hr)).json()
    assert server.retrieve(query, ADMIN_TOKEN, debug=True).json()["scope"] == {
        "name": "admin",
        "admin": True,
        "tenant": None,
        "readers": [],
    }
    log = server.client.get("/api/querylog", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    mine = [e["principal"] for e in log["entries"] if e["query"] == query]
    assert sorted(mine) == sorted([hr, hr, "admin"])


def test_a_document_written_again_with_a_narrower_scope_is_no_longer_read_by_those_it_left_out(
    server: Server,
) -> None:
    text = "The lighthouse tour leaves the harbour at nine every Saturday."
    query = "When does the lighthouse tour leave?"
    sales, hr = named("acme", ("sales",)), named("acme", ("hr",))
    assert server.write([doc("lighthouse", text, tenant="acme", access=["public"])]).status_code == 200
    assert "lighthouse" in server.doc_ids(query, sales) & server.doc_ids(query, hr)
    # the same text: only the metadata changes (the store's chunks, the BM25 labels, the chunk cache)
    assert server.write([doc("lighthouse", text, tenant="acme", access=["group:hr"])]).status_code == 200
    assert "lighthouse" not in server.doc_ids(query, sales)
    assert "lighthouse" in server.doc_ids(query, hr)
    assert server.write([doc("lighthouse", text, tenant="globex", access=["group:hr"])]).status_code == 200
    assert "lighthouse" not in server.doc_ids(query, hr)
    assert "lighthouse" in server.doc_ids(query, named("globex", ("hr",)))


# -- the property: nothing out of scope, ever -------------------------------------------------------------

WORDS = "salary bonus parking canteen holiday travel expense laptop password vpn".split()
ENTRIES = ["public", "group:hr", "group:sales", "user:ann", "user:bob", "group:hr,group:sales"]
INGEST = IngestSettings()  # the server's chunking: its chunk ids are computed here from the text alone
numbers = itertools.count()

scopes = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.sampled_from(["acme", "globex"]),
        "access": st.one_of(st.sampled_from(ENTRIES), st.lists(st.sampled_from(ENTRIES), max_size=3)),
    },
)
# up to ~1,100 characters: some documents have two or three chunks, which the diversity stage attaches
documents = st.tuples(st.lists(st.sampled_from(WORDS), min_size=3, max_size=160), scopes)
# an earlier document (by its position among them) written again with the same text and another scope
rescoped = st.lists(st.tuples(st.integers(0, 10_000), scopes), max_size=2)
queries = st.tuples(
    st.sampled_from(sorted(PRINCIPALS)), st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)
)


def chunk_ids(sent: dict[str, Any]) -> list[str]:
    document = Document(sent["id"], sent["text"], sent["title"], {}, origin="api")
    return [c.chunk_id for c in chunk_document(document, INGEST.chunk_size, INGEST.chunk_overlap)]


def named_chunks(body: dict[str, Any]) -> set[str]:
    """Every chunk id an answer names: its documents, their attached chunks, the removed items."""
    ids = {d["chunkId"] for d in body["documents"]}
    ids |= {a["chunkId"] for d in body["documents"] for a in d["attached"]}
    ids |= {item["chunkId"] for stage in body["stages"] for item in stage["removedItems"]}
    return ids


def scope_of(written: dict[str, Any]) -> dict[str, Any]:
    """The metadata `may_read` reads: the fields sent, those sent as null left out."""
    return {k: v for k, v in written.items() if v is not None}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(documents, min_size=1, max_size=4),
    rescoped,
    st.lists(queries, min_size=1, max_size=3),
)
def test_nothing_out_of_scope_is_ever_returned_or_attached(
    server: Server,
    new_docs: list[tuple[list[str], dict[str, Any]]],
    again: list[tuple[int, dict[str, Any]]],
    asked: list[tuple[str, list[str]]],
) -> None:
    earlier = sorted(i for i in server.sent if i.startswith("prop-"))
    batch = {}
    for position, fields in again if earlier else []:
        before = server.sent[earlier[position % len(earlier)]]
        batch[before["id"]] = doc(before["id"], before["text"], **fields)
    for words, fields in new_docs:
        number = next(numbers)
        batch[f"prop-{number}"] = doc(f"prop-{number}", " ".join(words) + f" (document {number})", **fields)
    written = server.write(list(batch.values()))
    assert written.status_code == 200, written.text
    for name, words in asked:
        principal = PRINCIPALS[name]
        answer = server.retrieve(" ".join(words), token_of(name), top_k=5, debug=True)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        for chunk in named_chunks(body):
            doc_id = server.chunk_doc[chunk]
            assert may_read(principal, scope_of(server.written[doc_id])), (name, doc_id)
        readable = [i for i, m in server.written.items() if may_read(principal, scope_of(m))]
        assert bool(body["documents"]) == bool(readable), (name, readable)


def test_after_a_restart_every_scope_still_holds(server: Server) -> None:
    """Last: the server restarts on its store, its document record and its persisted BM25 index (the labels),
    and every principal still reads exactly in its scope."""
    server.restart()
    query = "When does the lighthouse tour leave?"
    assert "lighthouse" not in server.doc_ids(query, named("acme", ("hr",)))  # its last scope: globex hr
    assert "lighthouse" in server.doc_ids(query, named("globex", ("hr",)))
    for name, principal in PRINCIPALS.items():
        for words in (["salary", "bonus"], ["parking", "garage"], ["zeppelin", "hangar", "keys"]):
            answer = server.retrieve(" ".join(words), token_of(name), top_k=5, debug=True)
            assert answer.status_code == 200, answer.text
            for chunk in named_chunks(answer.json()):
                assert may_read(principal, scope_of(server.written[server.chunk_doc[chunk]])), (name, chunk)
