"""`make run` listens where it is told: `make run HOST=... PORT=...` beats RAG__SERVER__HOST and
RAG__SERVER__PORT, which beat rag.server in the config file. The Makefile passes `--host` / `--port` only for
variables given on make's command line, so the environment and the config file decide otherwise (their order
is the settings' own, tested in test_settings.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def serve_command(*make_args: str, env: dict[str, str] | None = None) -> list[str]:
    """The `sieve serve` command `make run` would run (`make -n`: printed, not run)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "MAKEFLAGS")}
    environment.update(env or {})
    printed = subprocess.run(
        ["make", "-n", "run", *make_args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    [line] = [line for line in printed.splitlines() if "sieve serve" in line]
    return line.split()


@pytest.mark.parametrize(
    ("make_args", "env", "flags"),
    [
        ((), {}, []),
        (("PORT=8010", "HOST=0.0.0.0"), {}, ["--host", "0.0.0.0", "--port", "8010"]),
        (("PORT=8010",), {}, ["--port", "8010"]),
        (("HOST=::1",), {}, ["--host", "::1"]),
        # the environment's RAG__SERVER__* reach `sieve serve` untouched: no flag overrides them
        ((), {"RAG__SERVER__PORT": "9001", "RAG__SERVER__HOST": "0.0.0.0"}, []),
        (("PORT=8010",), {"RAG__SERVER__PORT": "9001"}, ["--port", "8010"]),
        # HOST and PORT from the environment are not make's to pass on (zsh exports HOST as the machine name)
        ((), {"HOST": "my-laptop", "PORT": "5000"}, []),
        (("PORT=",), {}, []),
    ],
)
def test_make_run_passes_only_the_host_and_port_given_to_make(
    make_args: tuple[str, ...], env: dict[str, str], flags: list[str]
) -> None:
    command = serve_command(*make_args, env=env)
    assert command[:3] == ["RAG__EVALUATE__ENABLED=true", ".venv/bin/sieve", "serve"]
    assert command[3:] == flags
