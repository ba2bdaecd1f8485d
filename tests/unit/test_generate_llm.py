"""The llm generator's client against a real HTTP server on 127.0.0.1 (a thread of this process) that answers
like an OpenAI-compatible endpoint: canned completions, and the failures a user meets (refused key, no answer
in time, a body that is not JSON, no question in it, a server error, nothing listening)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.evaluation.golden.authoring.llm import (
    ChatClient,
    ChatEndpoint,
    LlmError,
    clean_question,
    question_messages,
)
from app.settings import LlmSettings
from tests.fixtures.fake_llm import FakeServer, fake_llm


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_llm() as fake:
        yield fake


def endpoint(server: FakeServer, mode: str, **kw: Any) -> ChatEndpoint:
    return ChatEndpoint(base_url=server.url(mode), model="qwen-test", **kw)


def test_a_completion_is_read_and_the_request_is_openai_shaped(server: FakeServer) -> None:
    server.requests.clear()
    with ChatClient(endpoint(server, "ok", api_key="sk-test", temperature=0.2, max_tokens=64)) as client:
        reply = client.complete(question_messages("每月10日发放工资。", "zh"))
    assert reply == "How do I get my salary?"
    (request,) = server.requests
    assert request["path"] == "/ok/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    body = request["body"]
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("qwen-test", 0.2, 64)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "每月10日发放工资。" in body["messages"][1]["content"]
    assert "不要照抄" in body["messages"][1]["content"]  # the Chinese prompt for a Chinese passage


def test_a_trailing_slash_in_base_url_and_no_key_sends_no_authorization(server: FakeServer) -> None:
    server.requests.clear()
    e = ChatEndpoint(base_url=server.url("ok") + "/", model="m")
    with ChatClient(e) as client:
        client.complete(question_messages("Payday is the 10th.", "en"))
    (request,) = server.requests
    assert request["path"] == "/ok/v1/chat/completions"
    assert "Authorization" not in request["headers"]
    assert "do not copy the passage's wording" in request["body"]["messages"][1]["content"]


def test_401_names_the_environment_variable(server: FakeServer) -> None:
    with ChatClient(endpoint(server, "unauthorized", api_key="wrong", api_key_env="MY_KEY")) as client:
        with pytest.raises(LlmError) as err:
            client.complete(question_messages("x", "en"))
    message = str(err.value)
    assert "HTTP 401" in message and "the key was refused" in message and "MY_KEY" in message
    assert server.url("unauthorized") in message


def test_no_answer_within_the_timeout(server: FakeServer) -> None:
    with ChatClient(endpoint(server, "slow", timeout=0.3)) as client:
        with pytest.raises(LlmError, match=r"no answer within 0\.3 s \(rag\.generate\.llm\.timeout\)"):
            client.complete(question_messages("x", "en"))


def test_a_body_that_is_not_json(server: FakeServer) -> None:
    with ChatClient(endpoint(server, "notjson")) as client:
        with pytest.raises(LlmError, match=r"the answer is not JSON: '<html>gateway</html>'"):
            client.complete(question_messages("x", "en"))


def test_json_without_a_question(server: FakeServer) -> None:
    with ChatClient(endpoint(server, "nocontent")) as client:
        with pytest.raises(LlmError, match=r"no choices\[0\]\.message\.content"):
            client.complete(question_messages("x", "en"))


def test_a_server_error_shows_its_status_and_body(server: FakeServer) -> None:
    with ChatClient(endpoint(server, "error")) as client:
        with pytest.raises(LlmError, match=r"HTTP 500: .*model not loaded"):
            client.complete(question_messages("x", "en"))


def test_nothing_listening(free_port) -> None:
    e = ChatEndpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout=5)
    with ChatClient(e) as client:
        with pytest.raises(LlmError, match="cannot reach the LLM endpoint"):
            client.complete(question_messages("x", "en"))


def test_endpoint_from_settings_reads_the_key_from_the_named_variable(monkeypatch) -> None:
    monkeypatch.setenv("OTHER_KEY", "sk-from-env")
    e = ChatEndpoint.from_settings(
        LlmSettings(base_url="http://127.0.0.1:11434/v1", model="qwen2.5", api_key_env="OTHER_KEY")
    )
    assert (e.url, e.model, e.api_key) == (
        "http://127.0.0.1:11434/v1/chat/completions",
        "qwen2.5",
        "sk-from-env",
    )
    monkeypatch.delenv("OTHER_KEY")
    assert (
        ChatEndpoint.from_settings(
            LlmSettings(base_url="http://h/v1", model="m", api_key_env="OTHER_KEY")
        ).api_key
        is None
    )


def test_endpoint_from_settings_needs_base_url_and_model() -> None:
    with pytest.raises(LlmError, match=r"rag\.generate\.llm\.base_url and rag\.generate\.llm\.model"):
        ChatEndpoint.from_settings(LlmSettings())


@pytest.mark.parametrize(
    ("reply", "question"),
    [
        ("How do I get paid?", "How do I get paid?"),
        ('"How do I get paid?"\n\nThis asks about payday.', "How do I get paid?"),
        ("Question: When is payday?", "When is payday?"),
        ("问题：工资几号发？", "工资几号发？"),
        ("1. 工资几号发？", "工资几号发？"),
        ("「工资几号发？」", "工资几号发？"),
        ("<think>The passage is about pay.\nSo...</think>\nWhen is payday?", "When is payday?"),
        ("   \n", ""),
    ],
)
def test_clean_question(reply: str, question: str) -> None:
    assert clean_question(reply) == question
