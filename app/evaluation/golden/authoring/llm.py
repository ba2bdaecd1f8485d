"""A question per passage from any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp's server,
OpenAI itself): `POST {base_url}/chat/completions` with `{"model", "messages", "temperature",
"max_tokens"}`, the question read from `choices[0].message.content`.

The key is read from the environment variable named by `rag.generate.llm.api_key_env` and sent as
`Authorization: Bearer <key>`; with the variable unset or empty no header is sent (local servers need none).
Every failure is one `LlmError` whose message names the URL and what went wrong: unreachable, no answer
within the timeout, a refused key (401/403), another HTTP status, a body that is not JSON or has no
question in it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import httpx

from app.settings import LlmSettings

# One prompt per passage language (app.evaluation.golden.language.query_language of the passage text).
PROMPTS = {
    "zh": (
        "你在为一个文档检索系统编写评测问题。",
        "下面是公司知识库中的一段文字。请写一个用户可能会问、并且这段文字能够回答的问题。"
        "用用户自己的话提问，不要照抄这段文字的措辞。只输出这一个问题，不要解释，不要加引号。\n\n"
        "文字：\n{passage}",
    ),
    "en": (
        "You write evaluation questions for a document search system.",
        "Below is a passage from a company knowledge base. Write one question a user would ask that this "
        "passage answers. Ask it in the user's own words; do not copy the passage's wording. Reply with "
        "the question only: no explanation, no quotes.\n\nPassage:\n{passage}",
    ),
}

_LABEL = re.compile(r"^\s*(?:(?:question|q)\s*[:：]|问题\s*[:：]|\d+\s*[.、)]|[-*•])\s*", re.IGNORECASE)
_QUOTES = "\"'“”‘’「」『』`"
# a reasoning model's thoughts before its answer (Qwen3, DeepSeek-R1 served by vLLM or Ollama)
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


class LlmError(RuntimeError):
    """The endpoint could not give a question; the message names the URL and the cause."""


@dataclass(frozen=True)
class ChatEndpoint:
    """Where and how to ask. `api_key` None or "" sends no Authorization header; `api_key_env` is only
    named in messages."""

    base_url: str
    model: str
    api_key: str | None = None
    api_key_env: str = "SIEVE_LLM_API_KEY"
    timeout: float = 60.0
    temperature: float = 0.7
    max_tokens: int = 256

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    @classmethod
    def from_settings(cls, settings: LlmSettings) -> ChatEndpoint:
        """The endpoint of `rag.generate.llm`, the key read from the environment variable it names.
        Raises `LlmError` when base_url or model is not set."""
        missing = [name for name in ("base_url", "model") if not getattr(settings, name)]
        if missing:
            raise LlmError(
                "the llm generator needs "
                + " and ".join(f"rag.generate.llm.{name}" for name in missing)
                + " (e.g. RAG__GENERATE__LLM__BASE_URL=http://127.0.0.1:11434/v1, "
                "RAG__GENERATE__LLM__MODEL=qwen2.5:7b-instruct; docs/generation.md)"
            )
        return cls(
            base_url=str(settings.base_url),
            model=str(settings.model),
            api_key=os.environ.get(settings.api_key_env) or None,
            api_key_env=settings.api_key_env,
            timeout=settings.timeout,
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
        )


class ChatClient:
    """One chat completion per call, over one HTTP connection pool (`close` it, or use it as a context
    manager)."""

    def __init__(self, endpoint: ChatEndpoint, transport: httpx.BaseTransport | None = None):
        self.endpoint = endpoint
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self._http = httpx.Client(headers=headers, timeout=endpoint.timeout, transport=transport)

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant's reply (`choices[0].message.content`) to `messages`."""
        e = self.endpoint
        body = {
            "model": e.model,
            "messages": messages,
            "temperature": e.temperature,
            "max_tokens": e.max_tokens,
        }
        try:
            response = self._http.post(e.url, json=body)
        except httpx.TimeoutException:
            raise LlmError(f"{e.url}: no answer within {e.timeout:g} s (rag.generate.llm.timeout)") from None
        except httpx.HTTPError as exc:
            raise LlmError(f"{e.url}: cannot reach the LLM endpoint: {exc}") from None
        if response.status_code in (401, 403):
            which = "no key was sent" if not e.api_key else "the key was refused"
            raise LlmError(
                f"{e.url}: HTTP {response.status_code}: {which}; set the environment variable "
                f"{e.api_key_env} (rag.generate.llm.api_key_env) to a valid key"
            )
        if response.status_code >= 400:
            raise LlmError(f"{e.url}: HTTP {response.status_code}: {_excerpt(response.text)}")
        try:
            answer = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise LlmError(f"{e.url}: the answer is not JSON: {_excerpt(response.text)}") from None
        content = _content(answer)
        if content is None:
            raise LlmError(
                f"{e.url}: the answer has no choices[0].message.content: {_excerpt(response.text)}"
            )
        return content


def question_messages(passage: str, language: str) -> list[dict[str, str]]:
    """The chat messages asking for one question about `passage`, in `language` ("zh" or "en")."""
    system, user = PROMPTS["zh" if language == "zh" else "en"]
    return [{"role": "system", "content": system}, {"role": "user", "content": user.format(passage=passage)}]


def clean_question(reply: str) -> str:
    """The question in a model's reply: without a `<think>...</think>` block, its first non-blank line,
    without a leading label ("Question:", "问题：", "1.", "-") or surrounding quotes; "" when nothing is
    left."""
    reply = _THINKING.sub("", reply)
    line = next((ln for ln in reply.splitlines() if ln.strip()), "")
    line = _LABEL.sub("", line).strip()
    return line.strip(_QUOTES).strip()


def _content(answer: Any) -> str | None:
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
