"""The experiment report's Markdown and HTML from its JSON, and the base checked against the record."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.experiment.render import experiment_html, experiment_markdown, table_rows
from app.experiment.run import ExperimentError, base_against_record


def _data() -> dict[str, Any]:
    def row(name: str, ndcg: float, p95: float, comparison: Any, pareto: bool) -> dict[str, Any]:
        return {
            "name": name,
            "overlay": {} if comparison is None else {"rag.ingest.chunk_size": 300},
            "index": "base" if comparison is None else "build",
            "evaluation": "ran",
            "collection": "sieve",
            "summary": {"recall": 1.0, "hitRate": 1.0, "mrr": 0.5, "ndcg": ndcg},
            "cost": {
                "ingestSeconds": None,
                "chunks": 200,
                "storeBytes": 1000,
                "p50Ms": 20.0,
                "p95Ms": p95,
                "contextChars": 2600.0,
            },
            "comparison": comparison,
            "pareto": pareto,
            "report": f"{name}/retrieval-eval-latest.json",
        }

    test = {"delta": 0.1, "pHolm": 0.01, "significant": True}
    comparison = {"measures": {"ndcg": test}, "fixed": ["a"], "broken": [], "pairedCases": 3}
    return {
        "name": "demo <x>",
        "file": "exp.yml",
        "design": "grid",
        "notes": [],
        "goldenSet": "g.json",
        "k": 5,
        "measure": "ndcg",
        "seconds": 1.0,
        "embedded": 0,
        "embeddingCacheHits": 0,
        "variants": [row("base", 0.8, 30.0, None, False), row("small", 0.9, 25.0, comparison, True)],
        "detectableDifference": {
            "value": 0.05,
            "alpha": 0.05,
            "power": 0.8,
            "pairedCases": 3,
            "formula": "f",
        },
        "warnings": ["at its ceiling"],
        "winner": {"name": "small", "reason": "ndcg up"},
    }


def test_a_row_per_variant_with_its_delta_fixed_broken_and_pareto_mark() -> None:
    base, small = table_rows(_data())
    assert base[:3] == ["base", "base", "ran"] and base[7] == "(base)" and base[-1] == ""
    assert small[7] == "+0.1000 (0.010) *" and small[8] == "1/0" and small[-1] == "◆"


def test_the_markdown_has_the_table_the_verdict_and_the_variants() -> None:
    text = experiment_markdown(_data())
    assert "| small | build | ran | 1.0000 | 1.0000 | 0.5000 | 0.9000 | +0.1000 (0.010) * |" in text
    assert (
        "Detectable difference (ndcg, paired, α = 0.05 two-sided, power 0.8, 3 paired cases): 0.0500." in text
    )
    assert "Warning: at its ceiling" in text and "Winner: **small**: ndcg up." in text
    assert "- **small**: `rag.ingest.chunk_size: 300`" in text


def test_the_html_is_one_page_with_bar_charts_and_escaped_text() -> None:
    page = experiment_html(_data())
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
