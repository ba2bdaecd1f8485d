"""The Markdown "Compared with baseline" section, rendered from the comparison JSON."""

from __future__ import annotations

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.render.markdown import comparison_markdown
from app.evaluation.report.model import Report


def report(ndcg: dict[str, float], hit: dict[str, float], enabled: bool) -> dict:
    return {
        "status": "ok",
        "run": {"settings": {"chain": {"bm25": {"enabled": enabled}}}, "k": 5, "evaluatedAt": "T0"},
        "summary": {"kMixed": False},
        "stages": [],
        "cases": [
            {
                "id": i,
                "query": f"q {i}",
                "topK": 5,
                "metrics": {
                    "recall": hit[i],
                    "hitRate": hit[i],
                    "mrr": v,
                    "ndcg": v,
                    "precision": 0.2,
                    "top1Accuracy": hit[i],
                },
                "rankedDocuments": [
                    {
                        "docId": f"{i}-{'new' if not enabled else 'old'}",
                        "scores": {"fused": 0.9 if enabled else 0.8},
                    }
                ],
            }
            for i, v in ndcg.items()
        ],
    }


def test_comparison_section_says_what_changed_lists_fixed_and_broken_and_warns_on_few_cases() -> None:
    base = report({"a": 0.0, "b": 1.0, "c": 0.5}, {"a": 0.0, "b": 1.0, "c": 1.0}, True)
    cur = report({"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 1.0, "b": 0.0, "c": 1.0}, False)
    comparison = compare_reports(Report.model_validate(base), Report.model_validate(cur), "base.json")
    text = "\n".join(comparison_markdown(comparison, None, "@5"))
    assert text.startswith("## Compared with baseline")
    assert "Only 3 paired cases (fewer than 30): small differences cannot be significant" in text
    assert "- `rag.chain.bm25.enabled: true -> false`" in text
    assert "Fixed (hit 0 → 1): 1" in text and "| a | q a | a-old (0.900) | a-new (0.800) |" in text
    assert "Broken (hit 1 → 0): 1" in text and "| b | q b | b-old (0.900) | b-new (0.800) |" in text
    assert "| nDCG@5 | 0.500 | 0.500 | +0.000 |" in text


def test_without_a_baseline_the_section_says_why() -> None:
    text = comparison_markdown(None, "no previous report (first run)", "@5")
    assert text[:3] == ["## Compared with baseline", "", "No comparison: no previous report (first run)."]
