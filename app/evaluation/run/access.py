"""The evaluation's access checks: leaks, and the expected ids a case's principal may not read.

Both apply `app.access.scope.may_read`, the independent rule, to the chunks' metadata as the store holds
it (`KnownIds.scopes`, read from the store before the run), never to the filter's decision that produced
the list: a filter that lets a chunk through wrongly is caught here.

* A leak (`access_leaks`): a chunk the chain returned for a case run as principal P (a ranked chunk, or one
  the diversity stage attached to it) that P may not read. The gate's `max_access_leaks` (default 0) counts
  them over every case; the leak probe (`session`, `leak_probe`) runs every case again as every other
  evaluation principal and counts its own, with zero tolerance.
* ACL_FILTERED (`acl_filtered`): an expected id of which P may read no chunk at all: the case cannot find it
  as P, whatever the ranking; its loss says so instead of NOT_RETRIEVED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from app.access.scope import Principal, may_read
from app.evaluation.report.model import AccessLeak
from app.retrieval.types import Candidate

ACL_FILTERED = "ACL_FILTERED"

# the stored metadata of a chunk by its id, and the candidate's own as a fallback for a chunk the store did
# not hold when the run began
ScopeOf = Callable[[Candidate], Mapping[str, Any]]


def access_leaks(
    case_id: str,
    principal: Principal | None,
    documents: Sequence[Candidate],
    scope_of: ScopeOf,
    probe: bool = False,
) -> list[AccessLeak]:
    """The chunks of `documents` (a case's answer, in rank order: each ranked chunk, then the chunks attached
    to it) that `principal` may not read by their stored metadata (`scope_of`). None for an unscoped run
    (no principal) and the admin: they read everything."""
    if principal is None or principal.admin:
        return []
    out = []
    for rank, document in enumerate(documents, start=1):
        for chunk, attached in ((document, False), *((a, True) for a in document.attached)):
            if not may_read(principal, scope_of(chunk)):
                out.append(
                    AccessLeak(
                        case=case_id,
                        principal=principal.name,
                        chunk_id=chunk.chunk_id,
                        doc_id=chunk.doc_id,
                        rank=rank,
                        attached=attached,
                        probe=probe,
                    )
                )
    return out


def acl_filtered(
    principal: Principal | None,
    wanted: Iterable[str],
    chunks_of: Callable[[str], Sequence[str]],
    scopes: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """The ids of `wanted` (a case's expected ids at its matching level, each in the index) of whose chunks
    (`chunks_of`) `principal` may read none, by their stored metadata (`scopes`; a chunk without an entry
    has no scope: the admin's only), sorted. Empty for an unscoped run and the admin."""
    if principal is None or principal.admin:
        return []
    no_scope: Mapping[str, Any] = {}
    return sorted(
        i
        for i in set(wanted)
        if (chunks := chunks_of(i)) and not any(may_read(principal, scopes.get(c, no_scope)) for c in chunks)
    )
