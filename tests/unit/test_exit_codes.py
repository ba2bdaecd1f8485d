"""One exit-code table for the CLI and `sieve serve`, and the README says the same."""

from __future__ import annotations

import re
from pathlib import Path

from app import cli, exit_codes, main

README = Path(__file__).resolve().parents[2] / "README.md"


APP = Path(__file__).resolve().parents[2] / "app"


def test_the_one_table() -> None:
    assert (exit_codes.OK, exit_codes.GATE_FAILED, exit_codes.BAD_INPUT) == (0, 1, 2)
    assert (exit_codes.UNAVAILABLE, exit_codes.INTERRUPTED) == (3, 130)


def test_cli_and_serve_use_the_one_table() -> None:
    # no module of the app keeps a second set of names for the codes (EXIT_OK = ..., EXIT_GATE_FAILED = ...)
    second_sets = [
        f"{path.relative_to(APP)}: {line.strip()}"
        for path in sorted(APP.rglob("*.py"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.match(r"\s*EXIT_(OK|GATE|INPUT|RUNTIME|STARTUP|INVALID)\w*\s*[,=]", line)
    ]
    assert second_sets == []
    assert main.exit_codes is exit_codes and cli.exit_codes is exit_codes


def test_readme_documents_every_exit_code() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("Exit codes, the same for every command") :]
    table = section[section.index("| Code | Meaning |") :]
    table = table[: table.index("\n\n")]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == set(exit_codes.TABLE)
