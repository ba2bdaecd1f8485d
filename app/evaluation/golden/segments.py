"""The segments of a golden set: which cases are judged together (each tag, knowledge tag, risk, golden-set
part, query language, origin, literalness band and the principal a case ran as). One definition, read by
the report's segments, the comparison's per-segment tests and the gate's configured segments, over the
report's case records, so a baseline read from a file segments the same way.
"""

from __future__ import annotations

from collections import defaultdict

from app.evaluation.golden.authoring.literalness import band
from app.evaluation.golden.language import query_language
from app.evaluation.report.model import CaseRecord

SEGMENT_KINDS = ("tag", "knowledgeTag", "risk", "set", "language", "origin", "literalness", "principal")
UNSCOPED = "(unscoped)"  # the principal segment of the cases run without a principal
ORIGINS = ("manual", "generated", "log")
# segment names in reading order where alphabetical order would not do
_NAME_ORDER = {
    "origin": ORIGINS,
    "literalness": ("low", "mid", "high"),
    "risk": ("high", "medium", "low"),
    "set": ("core", "incremental"),
    "principal": (UNSCOPED, "admin"),
}


def case_segments(c: CaseRecord) -> list[tuple[str, str]]:
    """The segments (kind, name) case `c` belongs to, the golden-set part included: its risk (if any), its
    part (core when none), each tag, its knowledge tag (if any), its query language, its origin (manual when
    none), its literalness band (if any) and the principal it ran as (`resolved.runAs`; `(unscoped)` for
    none). `members` drops the part when the cases have only one, and the principal when none ran as one."""
    keys = [("risk", c.case.risk)] if c.case.risk else []
    keys.append(("set", c.case.case_set or "core"))
    keys += [("tag", tag) for tag in dict.fromkeys(c.case.tags)]
    keys += [("knowledgeTag", c.case.knowledge_tag)] if c.case.knowledge_tag else []
    keys.append(("language", c.case.language or query_language(c.case.query)))
    keys.append(("origin", c.case.origin or "manual"))
    literal = band(c.case.literalness)
    keys += [("literalness", literal)] if literal is not None else []
    keys.append(("principal", c.resolved.run_as or UNSCOPED))
    return keys


def members(cases: list[CaseRecord]) -> dict[tuple[str, str], list[CaseRecord]]:
    """Each segment's cases, in reading order (`SEGMENT_KINDS`, then by name). The golden-set part is a
    segment only when `cases` come from both parts: a set of one part would be its whole set. The principal
    segments only when some case ran as a principal: without scopes they would all be `(unscoped)`."""
    out: dict[tuple[str, str], list[CaseRecord]] = defaultdict(list)
    for c in cases:
        for key in case_segments(c):
            out[key].append(c)
    if len([key for key in out if key[0] == "set"]) < 2:
        out = defaultdict(list, {key: group for key, group in out.items() if key[0] != "set"})
    if all(key == ("principal", UNSCOPED) for key in out if key[0] == "principal"):
        out = defaultdict(list, {key: group for key, group in out.items() if key[0] != "principal"})
    return dict(sorted(out.items(), key=lambda kv: _segment_order(kv[0])))


def _segment_order(key: tuple[str, str]) -> tuple[int, int, str]:
    kind, name = key
    names = _NAME_ORDER.get(kind, ())
    return (SEGMENT_KINDS.index(kind), names.index(name) if name in names else len(names), name)
