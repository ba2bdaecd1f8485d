"""The golden-set audit as text: the plain text `sieve golden check` prints, its JSON (`--json`), and the
report's "Golden-set audit" Markdown section. The one-line summary is the audit's own field
(`checks.summary_line`)."""

from __future__ import annotations

from pydantic import TypeAdapter

from app.evaluation.golden.audit.checks import ACL_FILTERED_FINDING, summary_line
from app.evaluation.report.model import Audit, Coverage
from app.evaluation.report.text import md_text


def audit_json(audit: Audit) -> dict[str, object]:
    """The audit's JSON (`sieve golden check --json`): its model dump by alias."""
    return TypeAdapter(type(audit)).dump_python(audit, mode="json", by_alias=True)


def finding_lines(audit: Audit) -> list[tuple[str, list[str]]]:
    """(heading, one line per finding) for each kind of finding, in FINDING_KINDS order; then, in an
    evaluation report whose cases ran scoped (`findings` counts `aclFiltered`), the ACL_FILTERED cases."""
    threshold = audit.near_duplicate_cosine
    lines = [
        (
            "Duplicate queries (same text once normalised)",
            [f"{', '.join(d.cases)}: {d.normalised!r}" for d in audit.duplicate_queries],
        ),
        (
            f"Near-duplicate queries (cosine >= {threshold:g}, not of one group)",
            [
                f"{p.cases[0]}, {p.cases[1]}: cosine {p.cosine:.4f}: {p.queries[0]!r} / {p.queries[1]!r}"
                for p in audit.near_duplicate_queries
            ],
        ),
        (
            "Stale ids (not in the index)",
            [f"{s.case}: {s.field} {s.id!r}: {s.note}" for s in audit.stale_ids],
        ),
        (
            f"Relevant but removed by the hard filter as of {audit.as_of}",
            [f"{e.case}: {e.level} {e.id}: {'; '.join(e.reasons)}" for e in audit.hard_filter_excluded],
        ),
        (
            "Content copies under other ids (same doc_sha256)",
            [
                f"{c.case}: {c.role} {c.id} = {', '.join(c.copies)}"
                + (f" (not judged in the case: {', '.join(c.unjudged_copies)})" if c.unjudged_copies else "")
                for c in audit.content_copies
            ],
        ),
        (
            "Relevant in one case, forbidden in another of the same group",
            [
                f"group {r.group}: {r.id} relevant in {', '.join(r.relevant_in)}, "
                f"forbidden in {', '.join(r.forbidden_in)}"
                for r in audit.relevant_and_forbidden
            ],
        ),
    ]
    if ACL_FILTERED_FINDING in audit.findings:
        lines.append(
            (
                "Expected but out of the case principal's scope (ACL_FILTERED)",
                [f"{a.case} as {a.principal}: {', '.join(a.ids)}" for a in audit.acl_filtered],
            )
        )
    return lines


def paraphrase_lines(audit: Audit) -> tuple[str, list[str]]:
    """(heading, lines) of the paraphrase pairs: information, not findings."""
    threshold = audit.near_duplicate_cosine
    return (
        f"Paraphrases of one group at cosine >= {threshold:g} (expected; not findings)",
        [f"group {p.group}: {p.cases[0]}, {p.cases[1]}: cosine {p.cosine:.4f}" for p in audit.paraphrases],
    )


def coverage_lines(audit: Audit) -> list[str]:
    """The coverage in lines: untouched documents (listed), then one line per knowledge tag."""
    cov = audit.coverage or Coverage(0, 0, [], [], [])
    listed = cov.untouched_documents
    more = cov.untouched_count - len(listed)
    lines = [
        f"{cov.untouched_count} of {cov.documents} documents no case touches"
        + (": " + ", ".join(listed) if listed else "")
        + (f" ... and {more} more" if more > 0 else "")
    ]
    lines += [
        f"knowledge tag {t.tag}: {t.documents} documents, {t.untouched_documents} untouched, {t.cases} cases"
        for t in cov.tags
    ]
    if cov.untouched_tags:
        lines.append("knowledge tags no case touches: " + ", ".join(cov.untouched_tags))
    return lines


def audit_text(audit: Audit) -> str:
    """The plain text `sieve golden check` prints: the findings grouped by kind (with case ids), the
    paraphrases, the coverage, and the one-line summary last."""
    if not audit.ran:
        return f"golden-set audit {summary_line(audit)}\n"
    lines = [
        f"golden-set audit of {audit.golden_set} ({audit.cases} cases) as of {audit.as_of}; embedder "
        f"{audit.embedder}; recorded hashes: {audit.previous_report}",
        "",
    ]
    for heading, items in [*finding_lines(audit), paraphrase_lines(audit)]:
        lines.append(f"{heading}: {len(items)}")
        lines += [f"  {item}" for item in items]
    lines.append("Coverage:")
    lines += [f"  {line}" for line in coverage_lines(audit)]
    lines += ["", "summary: " + summary_line(audit)]
    return "\n".join(lines) + "\n"


def audit_markdown(audit: Audit | None) -> list[str]:
    """The report's "Golden-set audit" section, led by a blank line (nothing when the report has no
    `audit`)."""
    if audit is None:
        return []
    out = ["", "## Golden-set audit", ""]
    if not audit.ran:
        return [*out, f"The audit {summary_line(audit)}."]
    out.append(
        f"{summary_line(audit)}. As of {audit.as_of}; near duplicates at cosine >= "
        f"{audit.near_duplicate_cosine:g} with {audit.embedder}; stale-id "
        f"remaps from {audit.previous_report}. Findings are information: they fail no gate."
    )
    for heading, items in [*finding_lines(audit), paraphrase_lines(audit)]:
        if items:
            out += ["", f"**{heading}** ({len(items)})", ""] + [f"- {_md(item)}" for item in items]
    out += ["", "**Coverage**", ""] + [f"- {_md(line)}" for line in coverage_lines(audit)]
    return out


def _md(text: str) -> str:
    """A finding's line (it names case ids, queries and document ids) made safe for the Markdown report."""
    return md_text(text.replace("\n", " ")).replace("|", "\\|")
