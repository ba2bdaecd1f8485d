"""The golden set's `datasetVersion` after `sieve golden export` changed its cases.

A report records the version of the set it scored, so two runs over different cases must not carry the same
version. `next_dataset_version` continues whichever scheme the file already uses:

* a date, `YYYY-MM-DD`, with an optional counter `.N` (the sample set's `2026-12-03.1`): today's date with
  counter 1, or the counter plus one when the version already has today's date; a bare date counts as
  counter 0. A version dated after today (a clock behind the one that wrote it) keeps its date and counts
  up, so the version never goes back: on 2026-12-04, `2026-12-03.1 -> 2026-12-04.1`,
  `2026-12-04.1 -> 2026-12-04.2`, `2026-12-04 -> 2026-12-04.1`;
* digits only: the next integer, as wide as before (`7 -> 8`, `009 -> 010`);
* anything else: its trailing `.N` counted up, else `.1` appended (`v3 -> v3.1 -> v3.2`,
  `2024-06 -> 2024-06.1`).

A set without a version (null, blank, absent, or an array or JSONL file, which have no place for one) keeps
none.
"""

from __future__ import annotations

import re
from datetime import date

_DATED = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\.(\d+))?")
_COUNTED = re.compile(r"(.*)\.(\d+)")


def next_dataset_version(current: str | None, today: date) -> str | None:
    """The version after `current` for a set whose cases changed on `today` (the module docstring)."""
    if current is None or not current.strip():
        return current
    dated = _DATED.fullmatch(current)
    if dated is not None:
        on, counter = dated.group(1), int(dated.group(2) or 0)
        if _date_or_none(on) is not None:
            stamp = today.isoformat()
            if on >= stamp:  # ISO dates order as strings
                return f"{on}.{counter + 1}"
            return f"{stamp}.1"
    if current.isdigit():
        return str(int(current) + 1).zfill(len(current))
    counted = _COUNTED.fullmatch(current)
    if counted is not None:
        return f"{counted.group(1)}.{int(counted.group(2)) + 1}"
    return f"{current}.1"


def _date_or_none(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None
