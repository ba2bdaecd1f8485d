"""One exit-code table for the CLI and `sieve serve`, and the README says the same."""

from __future__ import annotations

import re
from pathlib import Path

from app import cli, exit_codes, main

README = Path(__file__).resolve().parents[2] / "README.md"


def test_cli_and_serve_use_the_one_table() -> None:
    assert (cli.EXIT_OK, cli.EXIT_GATE, cli.EXIT_INPUT, cli.EXIT_RUNTIME) == (0, 1, 2, 3)
    assert main.EXIT_GATE_FAILED == exit_codes.GATE_FAILED == cli.EXIT_GATE == 1
    assert main.EXIT_INVALID_GOLDEN_SET == exit_codes.BAD_INPUT == 2
    assert main.EXIT_STARTUP_FAILED == exit_codes.UNAVAILABLE == 3


def test_readme_documents_every_exit_code() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("Exit codes, the same for every command") :]
    table = section[section.index("| Code | Meaning |") :]
    table = table[: table.index("\n\n")]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == set(exit_codes.TABLE)
