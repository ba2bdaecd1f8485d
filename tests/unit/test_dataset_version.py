"""`next_dataset_version`: the golden set's version after an export changed its cases, in the scheme the
version already follows."""

from __future__ import annotations

from datetime import date

import pytest

from app.evaluation.golden.authoring.dataset_version import next_dataset_version

TODAY = date(2026, 12, 4)


@pytest.mark.parametrize(
    ("current", "after"),
    [
        # a date with a counter: today's date with counter 1, or the next counter on the same day
        ("2026-12-03.1", "2026-12-04.1"),
        ("2026-11-30", "2026-12-04.1"),
        ("2026-12-04", "2026-12-04.1"),  # a bare date is counter 0
        ("2026-12-04.1", "2026-12-04.2"),
        ("2026-12-04.9", "2026-12-04.10"),
        ("2026-12-31.3", "2026-12-31.4"),  # dated after today: never back to an earlier date
        # an integer
        ("7", "8"),
        ("009", "010"),
        ("99", "100"),
        # anything else: a trailing .N counted up, else .1
        ("v3", "v3.1"),
        ("v3.1", "v3.2"),
        ("1.2.3", "1.2.4"),
        ("2024-06", "2024-06.1"),
        ("2026-13-45", "2026-13-45.1"),  # not a date
        # no version: none is made up
        (None, None),
        ("", ""),
    ],
)
def test_next_dataset_version(current: str | None, after: str | None) -> None:
    assert next_dataset_version(current, TODAY) == after


@pytest.mark.parametrize("current", ["2026-12-03.1", "7", "v3", "1.2.3", "2024-06"])
def test_the_next_version_differs_and_moves_on_again(current: str) -> None:
    once = next_dataset_version(current, TODAY)
    twice = next_dataset_version(once, TODAY)
    assert len({current, once, twice}) == 3
