"""`--server URL` in `sieve query` and `sieve eval`: the URL and the token it sends, the one-line errors and
exit codes for every way a request can fail, and the flags a server run refuses, all without a server
(httpx's MockTransport stands in for it; a closed port for one that is not there)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from app.cli import main
from app.cli.client import ServerError, SieveClient, server_token, server_url
from tests.conftest import find_free_port

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8080"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RAG__") or name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(REPO)


# -- the URL and the token ---------------------------------------------------------------------------------


def test_the_flag_beats_the_environment_and_a_trailing_slash_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_url(None) is None
    monkeypatch.setenv("SIEVE_SERVER", "http://sieve.internal:9000/")
    assert server_url(None) == "http://sieve.internal:9000"
    assert server_url("https://127.0.0.1:8443/") == "https://127.0.0.1:8443"


@pytest.mark.parametrize(
    ("flag", "env", "message"),
    [
        ("127.0.0.1:8080", None, "--server: expected a URL like http://127.0.0.1:8080, got '127.0.0.1:8080'"),
        ("ftp://host", None, "--server: expected a URL like http://127.0.0.1:8080, got 'ftp://host'"),
        (
            "http://host:99999",
            None,
            "--server: expected a URL like http://127.0.0.1:8080, got 'http://host:99999'",
        ),
        (None, "localhost", "$SIEVE_SERVER: expected a URL like http://127.0.0.1:8080, got 'localhost'"),
    ],
)
def test_a_url_that_is_not_http_is_bad_input_naming_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, flag: str | None, env: str | None, message: str
) -> None:
    if env is not None:
        monkeypatch.setenv("SIEVE_SERVER", env)
    with pytest.raises(ServerError) as caught:
        server_url(flag)
    assert (caught.value.message, caught.value.code) == (message, 2)


def _settings(api: str | None, admin: str | None) -> SimpleNamespace:
    return SimpleNamespace(rag=SimpleNamespace(server=SimpleNamespace(api_token=api, admin_token=admin)))


def test_the_token_is_sieve_token_else_the_one_the_request_needs_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    both = _settings("reader-token-0123456", "admin-token-0123456")
    assert server_token("reader", lambda: both) == "reader-token-0123456"
    assert server_token("admin", lambda: both) == "admin-token-0123456"
    assert server_token("reader", lambda: _settings(None, "admin-token-0123456")) == "admin-token-0123456"
    assert server_token("reader", lambda: _settings(None, None)) is None

    def not_read() -> SimpleNamespace:
        raise AssertionError("the settings are read although $SIEVE_TOKEN is set")

    monkeypatch.setenv("SIEVE_TOKEN", "from-the-environment-42")
    assert server_token("admin", not_read) == "from-the-environment-42"


# -- answers and refusals ----------------------------------------------------------------------------------


def _client(
    status: int, body: object, seen: list[httpx.Request] | None = None, **headers: str
) -> SieveClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers={"content-type": "text/html", **headers})
        return httpx.Response(status, json=body, headers=headers)

    return SieveClient(URL, "t0ken-0123456789abc", transport=httpx.MockTransport(answer))


def test_a_request_carries_the_bearer_token_and_its_body_and_returns_the_answer() -> None:
    seen: list[httpx.Request] = []
    assert _client(200, {"query": "q"}, seen).retrieve({"query": "q", "topK": 3}) == {"query": "q"}
    assert seen[0].url == f"{URL}/api/retrieve"
    assert seen[0].headers["authorization"] == "Bearer t0ken-0123456789abc"
    assert json.loads(seen[0].content) == {"query": "q", "topK": 3}
    _client(200, {}, seen).evaluate({"topK": 5})
    assert seen[1].url == f"{URL}/api/evaluations/runs"


@pytest.mark.parametrize(
    ("status", "body", "message", "code"),
    [
        (
            401,
            {"error": "missing or wrong admin token: send 'Authorization: Bearer <rag.server.admin_token>'"},
            f"the server at {URL} refused the token (401): missing or wrong admin token: send "
            "'Authorization: Bearer <rag.server.admin_token>'; set $SIEVE_TOKEN to the server's token",
            2,
        ),
        (
            403,
            {"error": "this endpoint is off: set rag.server.admin_token"},
            f"the server at {URL} refused the request (403): "
            "this endpoint is off: set rag.server.admin_token",
            2,
        ),
        (
            422,
            {
                "error": "query: 9000 characters, more than rag.retrieval.max_query_chars=2000",
                "fields": [
                    {
                        "field": "query",
                        "message": "query: 9000 characters, more than rag.retrieval.max_query_chars=2000",
                    }
                ],
                "count": 1,
            },
            "query: 9000 characters, more than rag.retrieval.max_query_chars=2000",
            2,
        ),
        (
            503,
            {"error": "not ready: loading models and opening the store"},
            f"the server at {URL} cannot do it now (503): not ready: loading models and opening the store",
            3,
        ),
        (
            409,
            {"error": "an evaluation or ingest is already running"},
            f"the server at {URL} cannot do it now (409): an evaluation or ingest is already running",
            3,
        ),
        (
            200,
            "<html>not sieve</html>",
            f"the server at {URL} did not answer /api/retrieve as a Sieve server (HTTP 200, text/html)",
            3,
        ),
        (
            404,
            {"detail": "Not Found"},
            f"the server at {URL} did not answer /api/retrieve as a Sieve server "
            "(HTTP 404, application/json)",
            3,
        ),
    ],
    ids=["401", "403", "422", "503", "409", "html", "not-sieve-404"],
)
def test_every_refusal_is_one_line_and_an_exit_code(
    status: int, body: object, message: str, code: int
) -> None:
    with pytest.raises(ServerError) as caught:
        _client(status, body).retrieve({"query": "q"})
    assert (caught.value.message, caught.value.code) == (message, code)


# -- the commands ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["query", "工资什么时候发"], ["eval"]], ids=["query", "eval"])
def test_a_server_that_is_not_there_is_exit_3_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    assert main([*argv, "--server", url]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: cannot reach the server at {url}: ")
    assert err.rstrip().endswith("(is `sieve serve` running there?)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["eval", "--golden-set", "g.json", "--export-trec", "out"],
            "error: --golden-set, --export-trec cannot be used with --server: the server evaluates its "
            "own golden set (rag.evaluate.resource_location) and writes its reports in its "
            "rag.evaluate.output_dir",
        ),
        (
            ["eval", "--baseline", "reports/old.json"],
            "error: --baseline with --server must be one of previous-passing, previous, none (a report file "
            "is read on the server, from its rag.evaluate.baseline), got 'reports/old.json'",
        ),
        (["eval", "--top-k", "0"], "error: --top-k must be between 1 and 100, got 0"),
        (["query", "工资", "--top-k", "101"], "error: --top-k must be between 1 and 100, got 101"),
        (["query", "  "], "error: query must not be blank"),
    ],
    ids=["local-files", "baseline-file", "eval-top-k", "query-top-k", "blank-query"],
)
def test_bad_input_with_a_server_is_exit_2_before_any_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.setenv("SIEVE_SERVER", f"http://127.0.0.1:{find_free_port()}")  # a request would be exit 3
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message + "\n")


def test_a_request_without_a_token_says_the_server_needs_one() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert "authorization" not in request.headers
        return httpx.Response(401, json={"error": "missing or wrong token"})

    client = SieveClient(URL, None, transport=httpx.MockTransport(answer))
    with pytest.raises(ServerError) as caught:
        client.retrieve({"query": "q"})
    assert caught.value.message == (
        f"the server at {URL} needs a token (401): missing or wrong token; "
        "set $SIEVE_TOKEN to the server's token"
    )
