"""The access settings (`rag.access`, `rag.ingest.access_defaults`), the principals found by their token's
SHA-256 (`PrincipalBook`), and the query log's `principal`."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.access.scope import ADMIN, Principal
from app.api.principals import PrincipalBook
from app.api.querylog import query_record
from app.evaluation.golden.principals import eval_principals
from app.retrieval.types import RetrievalResult, RetrievalTrace
from app.settings import AccessSettings, SettingsError, load_settings

SHA_A = "a" * 64


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.mark.parametrize(
    ("rag", "message"),
    [
        (
            {"access": {"principals": {"a": {"token_sha256": SHA_A}, "b": {"token_sha256": SHA_A}}}},
            "principals 'a' and 'b' have the same token_sha256",
        ),
        (
            {"access": {"principals": {"a": {"token_sha256": "A" * 64}}}},
            "'rag.access.principals.a.token_sha256': String should match pattern '^[0-9a-f]{64}$'",
        ),
        (
            {"access": {"principals": {"a": {"token_sha256": SHA_A, "groups": [" hr"]}}}},
            "'rag.access.principals.a.groups': Value error, access entry ' hr' must be a non-empty name",
        ),
        (
            {"access": {"principals": {"a": {"token_sha256": SHA_A, "tenant": ""}}}},
            "'rag.access.principals.a.tenant': String should have at least 1 character",
        ),
        (
            {"access": {"principals": {"a": {"token": "plain"}}}},
            "unknown key 'rag.access.principals.a.token'",
        ),
        (
            {"ingest": {"access_defaults": [{"path": "kb", "access": [""]}]}},
            "'rag.ingest.access_defaults.0.access': Value error, access entry '' must be a non-empty name",
        ),
        (
            {"ingest": {"access_defaults": [{"path": "kb", "acess": ["public"]}]}},
            "unknown key 'rag.ingest.access_defaults.0.acess'",
        ),
        ({"ingest": {"access_defaults": [{"path": ""}]}}, "'rag.ingest.access_defaults.0.path'"),
    ],
)
def test_bad_access_settings_name_the_key(tmp_path: Path, rag: dict[str, Any], message: str) -> None:
    empty = tmp_path / "sieve.yml"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(SettingsError) as caught:
        load_settings({"rag": rag}, config_path=empty)
    assert message in str(caught.value)


def test_a_principal_is_found_by_its_tokens_sha256_only() -> None:
    access = AccessSettings(
        enabled=True,
        principals={
            "hr": {"token_sha256": sha("hr-token"), "tenant": "acme", "groups": ["hr"], "user": "ann"},
            "plain": {"token_sha256": sha("plain-token")},
        },
    )
    book = PrincipalBook(access)
    assert book.enabled
    assert book.find(b"hr-token") == Principal("hr", tenant="acme", groups=("hr",), user="ann")
    assert book.find(b"plain-token") == Principal("plain")
    assert book.find(sha("hr-token").encode()) is None  # the digest itself is not a token
    assert book.find(b"") is None
    assert book.find(b"HR-TOKEN") is None


def test_eval_principals_are_principals_by_name() -> None:
    access = AccessSettings(eval_principals={"sales": {"tenant": "acme", "groups": ["sales"]}})
    assert eval_principals(access) == {"sales": Principal("sales", tenant="acme", groups=("sales",))}


@pytest.mark.parametrize(
    ("principal", "logged"),
    [(Principal("hr", tenant="acme", groups=("hr",)), "hr"), (ADMIN, "admin"), (None, None)],
)
def test_the_query_log_names_the_principal_with_access_on(
    principal: Principal | None, logged: str | None
) -> None:
    result = RetrievalResult("q", [], 0, False, RetrievalTrace(), 1.0)
    record = query_record(result, None, 5, principal, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert record.get("principal") == logged
    assert ("principal" in record) is (logged is not None)
