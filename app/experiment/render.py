"""The experiment report's Markdown and HTML, drawn from its JSON object (app/experiment/report.py). The HTML
is one self-contained page: inline CSS and SVG bars, no script, no network."""

from __future__ import annotations

from html import escape
from typing import Any

MEASURES = ("recall", "hitRate", "mrr", "ndcg")
HEADER = (
    "variant",
    "index",
    "eval",
    *MEASURES,
    "Δ {measure} (pHolm)",
    "fixed/broken",
    "p50 ms",
    "p95 ms",
    "context chars",
    "chunks",
    "store bytes",
    "ingest s",
    "Pareto",
)


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def _delta(row: dict[str, Any], measure: str) -> str:
    comparison = row.get("comparison")
    if comparison is None:
        return "(base)"
    test = comparison["measures"].get(measure)
    if test is None:
        return "no paired case"
    mark = " *" if test["significant"] else ""
    return f"{test['delta']:+.4f} ({_num(test['pHolm'], 3)}){mark}"


def _changed(comparison: dict[str, Any] | None) -> str:
    """`fixed/broken`, with the unverified drops among them when there are any."""
    if comparison is None:
        return "–"
    unverified = comparison.get("unverified") or []
    extra = f" ({len(unverified)} unverified)" if unverified else ""
    return f"{len(comparison['fixed'])}/{len(comparison['broken'])}{extra}"


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row of cells per variant, in HEADER's order."""
    measure = data["measure"]
    rows = []
    for row in data["variants"]:
        s, cost, comparison = row["summary"], row["cost"], row.get("comparison")
        changed = _changed(comparison)
        rows.append(
            [
                row["name"],
                row["index"],
                row.get("evaluation", "ran"),
                *(_num(s.get(m)) for m in MEASURES),
                _delta(row, measure),
                changed,
                _num(cost.get("p50Ms"), 1),
                _num(cost.get("p95Ms"), 1),
                _num(cost.get("contextChars"), 0),
                _num(cost.get("chunks")),
                _num(cost.get("storeBytes")),
                _num(cost.get("ingestSeconds"), 1),
                "◆" if row["pareto"] else "",
            ]
        )
    return rows


def verdict_lines(data: dict[str, Any]) -> list[str]:
    """The sentences under the table: the detectable difference, warnings, notes and the winner."""
    dd, measure = data["detectableDifference"], data["measure"]
    value = dd["value"]
    if value is None:
        detect = (
            f"Detectable difference: cannot be estimated (no variant differs from the base on {measure} in "
            "two or more paired cases)."
        )
    else:
        detect = (
            f"Detectable difference ({measure}, paired, α = {dd['alpha']} two-sided, power {dd['power']}, "
            f"{dd['pairedCases']} paired cases): {value:.4f}. A true difference smaller than this may go "
            f"unseen ({dd['formula']}; the largest over the variants)."
        )
    out = [detect]
    out += [f"Warning: {w}" for w in data["warnings"]]
    out += [f"Note: {n}" for n in data["notes"]]
    out.append(f"Winner: **{data['winner']['name']}**: {data['winner']['reason']}.")
    return out


def experiment_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown: the table, the verdict, each variant's overlay and report file."""
    header = [h.format(measure=data["measure"]) for h in HEADER]
    lines = [
        f"# Experiment {data['name'] or ''}".rstrip(),
        "",
        f"Golden set `{data['goldenSet']}` at K = {data['k']}, file `{data['file']}` ({data['design']}); "
        f"{data['seconds']:.1f} s, {data['embedded']} chunks embedded, {data['embeddingCacheHits']} from "
        "the embedding cache. `*`: significant after Holm over variants × measures; fixed/broken: cases "
        "whose hit went 0 → 1 / 1 → 0 against the base; ◆: on the Pareto front (quality, p95, context); "
        "eval `reused`: nothing the evaluation depends on changed since it ran (`--rerun` runs it again).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(data)]
    lines.append("")
    for line in verdict_lines(data):
        lines += [line, ""]
    lines += ["## Variants", ""]
    for row in data["variants"]:
        overlay = ", ".join(f"`{k}: {v}`" for k, v in row["overlay"].items()) or "the current configuration"
        lines.append(
            f"- **{row['name']}**: {overlay}; collection `{row['collection']}`; report `{row['report']}`"
        )
    return "\n".join(lines) + "\n"


def _bars(data: dict[str, Any], title: str, values: list[tuple[str, float | None]], fmt: str) -> str:
    """One horizontal SVG bar chart: a bar per variant, scaled to the largest value."""
    top = max((v for _, v in values if v is not None), default=0.0) or 1.0
    height = 22 * len(values) + 28
    parts = [f'<svg role="img" width="520" height="{height}" aria-label="{escape(title)}">']
    parts.append(f'<text x="0" y="14" class="t">{escape(title)}</text>')
    for i, (name, value) in enumerate(values):
        y = 24 + 22 * i
        width = 0 if value is None else int(300 * value / top)
        label = "–" if value is None else format(value, fmt)
        parts.append(f'<text x="0" y="{y + 14}">{escape(name[:24])}</text>')
        parts.append(f'<rect x="170" y="{y + 2}" width="{width}" height="16"></rect>')
        parts.append(f'<text x="{176 + width}" y="{y + 14}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def experiment_html(data: dict[str, Any]) -> str:
    """The report as one HTML page: charts of the measure, p95 and context characters, then the table."""
    measure = data["measure"]
    rows = data["variants"]
    charts = [
        _bars(data, f"{measure}@{data['k']}", [(r["name"], r["summary"].get(measure)) for r in rows], ".4f"),
        _bars(data, "p95 ms", [(r["name"], r["cost"].get("p95Ms")) for r in rows], ".1f"),
        _bars(data, "context chars", [(r["name"], r["cost"].get("contextChars")) for r in rows], ".0f"),
    ]
    head = "".join(f"<th>{escape(h.format(measure=measure))}</th>" for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in table_rows(data)
    )
    verdict = "".join(f"<p>{escape(line).replace('**', '')}</p>" for line in verdict_lines(data))
    title = escape(f"Experiment {data['name'] or ''}".strip())
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title><style>"
        "body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 6px;text-align:right}td:first-child{text-align:left}rect{fill:#4a7ab5}"
        ".t{font-weight:bold}svg{display:block;margin:1em 0}</style></head><body>"
        f"<h1>{title}</h1>{''.join(charts)}<table><tr>{head}</tr>{body}</table>{verdict}</body></html>\n"
    )
