"""The shipped deployment files keep to what the README promises: nothing published beyond loopback, Chroma
not published at all, writes impossible without a token from the environment, and a non-root image."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.settings import ServerSettings

REPO = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))


def test_only_sieve_is_published_and_only_on_loopback() -> None:
    services = compose()["services"]
    assert "ports" not in services["chroma"]
    assert services["sieve"]["ports"] == ["127.0.0.1:8000:8000"]


def test_compose_requires_the_admin_token_from_the_environment() -> None:
    env = compose()["services"]["sieve"]["environment"]
    assert env["RAG__SERVER__ADMIN_TOKEN"].startswith("${SIEVE_ADMIN_TOKEN:?")


def test_the_image_runs_as_a_non_root_user() -> None:
    lines = (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("short", "at least 16 characters"),
        ("has a space in it, long enough", "printable ASCII without spaces"),
        ("tökén-with-umlauts-long-enough", "printable ASCII without spaces"),
    ],
)
def test_unusable_tokens_are_refused(token: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ServerSettings(admin_token=token)


def test_an_empty_token_means_not_set_and_tokens_must_differ() -> None:
    assert ServerSettings(admin_token="", api_token="").admin_token is None
    with pytest.raises(ValueError, match="must differ"):
        ServerSettings(admin_token="same-token-0123456789", api_token="same-token-0123456789")


def test_a_bad_token_is_never_echoed_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import SettingsError, load_settings

    monkeypatch.setenv("RAG__SERVER__ADMIN_TOKEN", "secret!")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "secret!" not in str(info.value)
    assert "RAG__SERVER__ADMIN_TOKEN" in str(info.value)
