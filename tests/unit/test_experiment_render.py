"""The experiment report's Markdown and HTML from its JSON, and the base checked against the record."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.experiment.render import experiment_html, experiment_markdown, table_rows
from app.experiment.run import ExperimentError, base_against_record
from tests.fixtures.experiment_data import experiment_data


def test_a_row_per_variant_with_its_delta_fixed_broken_and_pareto_mark() -> None:
    base, small = table_rows(experiment_data())
    assert base[:3] == ["base", "base", "ran"] and base[7] == "(base)" and base[-1] == ""
    assert small[7] == "+0.1000 (0.010) *" and small[8] == "1/0" and small[-1] == "◆"


def test_the_markdown_has_the_table_the_verdict_and_the_variants() -> None:
    text = experiment_markdown(experiment_data())
    assert "| small | build | ran | 1.0000 | 1.0000 | 0.5000 | 0.9000 | +0.1000 (0.010) * |" in text
    assert (
        "Detectable difference (ndcg, paired, α = 0.05 two-sided, power 0.8, 3 paired cases): 0.0500." in text
    )
    assert "Warning: at its ceiling" in text and "Winner: **small**: ndcg up." in text
    assert "- **small**: `rag.ingest.chunk_size: 300`" in text


def test_the_html_is_one_page_with_bar_charts_and_escaped_text() -> None:
    page = experiment_html(experiment_data())
    assert page.count("<svg") == 3 and page.count("<rect") == 6
    assert "demo &lt;x&gt;" in page and "<x>" not in page
    assert "http" not in page and "<script" not in page  # no external asset, no script


def _store(doc_ids: list[str]) -> Any:
    chunks = [SimpleNamespace(metadata={"doc_id": d}) for d in doc_ids]
    return SimpleNamespace(name="sieve", iter_all=lambda include_text=True: iter(chunks))


def _record(doc_ids: list[str]) -> Any:
    return SimpleNamespace(hashes=lambda: dict.fromkeys(doc_ids, "h"))


def test_the_base_is_checked_against_the_record() -> None:
    assert base_against_record(_store(["a", "a", "b"]), _record(["a", "b"])) is None
    warning = base_against_record(_store(["a", "x"]), _record(["a", "b", "c"]))
    assert warning is not None and "holds 1 document(s) the document record lacks and lacks 2" in warning
    with pytest.raises(ExperimentError, match="the base collection 'sieve' is empty"):
        base_against_record(_store([]), _record(["a"]))
