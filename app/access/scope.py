"""Who may read a chunk: principals, the access metadata of documents, and the one rule joining them.

A document (and every chunk made of it) may carry
- `tenant`: a string, the organisation it belongs to;
- `access`: a list of strings, the principals that may read it: `public`, `group:<name>`, `user:<name>`.

A principal is who asks: an API token's (`rag.access.principals`) or an evaluation's
(`rag.access.eval_principals`). It reads under the names `public`, `group:<g>` for each of its groups and
`user:<u>` for its user (`Principal.readers`).

The rule (`may_read`), over a chunk's stored metadata:
- the admin reads everything;
- anyone else reads a chunk only when its tenant is the principal's tenant (a chunk without a tenant is read
  only by a principal without one, and the other way round), and its `access` list names one of the
  principal's readers. A chunk with no `access` list, or an empty one, is read by the admin only: a missing
  scope never falls back to "everything".

Entries are matched whole, as strings: `group:hr,group:sales` is one principal name that nothing holds, never
two. `may_read` is the independent check: the evaluation's leak gate applies it to what the chain returned,
never trusting the filter that produced the list (`candidates`, `scope_where`, the indexes' labels).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TENANT = "tenant"
ACCESS = "access"
PUBLIC = "public"

# Bounds on what a document may say of its scope (a name is one entry of `access`, or the tenant).
MAX_ACCESS_ENTRIES = 256
MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class Principal:
    """Who reads: `name` names it in traces, logs and reports; `admin` reads everything."""

    name: str
    tenant: str | None = None
    groups: tuple[str, ...] = ()
    user: str | None = None
    admin: bool = False

    @property
    def readers(self) -> frozenset[str]:
        """The `access` entries this principal reads under: `public`, `group:<g>` per group, `user:<u>`."""
        names = {PUBLIC, *(f"group:{g}" for g in self.groups)}
        if self.user is not None:
            names.add(f"user:{self.user}")
        return frozenset(names)

    @property
    def key(self) -> tuple[str | None, frozenset[str]] | None:
        """What decides what this principal reads (None: everything, the admin): two principals with the
        same key read the same chunks."""
        return None if self.admin else (self.tenant, self.readers)

    def describe(self) -> dict[str, Any]:
        """The principal as a trace or report shows it (its name and scope, never its token)."""
        if self.admin:
            return {"name": self.name, "admin": True}
        return {"name": self.name, "tenant": self.tenant, "readers": sorted(self.readers)}


ADMIN = Principal(name="admin", admin=True)


def may_read(principal: Principal, metadata: Mapping[str, Any]) -> bool:
    """True when `principal` may read a chunk with this stored metadata (the rule in the module's text).

    Written apart from every filter, over the metadata as the store gives it back: a value of the wrong type
    (a comma-joined string for `access`, a number for `tenant`) reads as no scope at all, so only the admin
    reads such a chunk."""
    if principal.admin:
        return True
    access = metadata.get(ACCESS)
    if not isinstance(access, list | tuple) or not access:
        return False
    tenant = metadata.get(TENANT)
    if tenant is not None and not isinstance(tenant, str):
        return False
    if (tenant or None) != principal.tenant:
        return False
    readers = principal.readers
    return any(isinstance(entry, str) and entry in readers for entry in access)


def has_scope(metadata: Mapping[str, Any]) -> bool:
    """The chunk carries a usable `access` list (else only the admin reads it)."""
    access = metadata.get(ACCESS)
    return isinstance(access, list | tuple) and any(isinstance(entry, str) for entry in access)


# -- a document's fields ----------------------------------------------------------------------------------


class AccessFieldError(ValueError):
    """A document's `tenant` or `access` is not usable; the message names the field."""


def checked_tenant(value: Any) -> str | None:
    """The `tenant` field as stored: a non-empty string without surrounding spaces, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise AccessFieldError(f"'tenant' must be a string, got {type(value).__name__}")
    _check_name(value, "'tenant'")
    return value


def checked_access(value: Any) -> list[str] | None:
    """The `access` field as stored: a list of distinct non-empty strings, in the order given; None when
    absent. A lone string is a list of that one entry, never split at commas. An empty list is kept as
    None: the same as no scope (admins only)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise AccessFieldError(f"'access' must be a list of strings, got {type(value).__name__}")
    if len(value) > MAX_ACCESS_ENTRIES:
        raise AccessFieldError(f"'access' holds {len(value)} entries, more than {MAX_ACCESS_ENTRIES}")
    out: list[str] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            raise AccessFieldError(f"'access' entry {i} must be a string, got {type(entry).__name__}")
        _check_name(entry, f"'access' entry {i}")
        if entry not in out:
            out.append(entry)
    return out or None


def scope_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `tenant` and `access` of a document's fields, checked (`checked_tenant`, `checked_access`);
    a field absent, or given as null or an empty list, is None."""
    return {TENANT: checked_tenant(fields.get(TENANT)), ACCESS: checked_access(fields.get(ACCESS))}


def _check_name(value: str, what: str) -> None:
    if not value.strip():
        raise AccessFieldError(f"{what} is empty")
    if value != value.strip():
        raise AccessFieldError(f"{what} {value!r} has spaces around it")
    if len(value) > MAX_NAME_CHARS:
        raise AccessFieldError(f"{what} is longer than {MAX_NAME_CHARS} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise AccessFieldError(f"{what} is not valid Unicode") from None


# -- the filter, as the store and the indexes apply it -------------------------------------------------------


def scope_where(principal: Principal) -> dict[str, Any] | None:
    """The store's `where` clause for what `principal` reads (None for the admin): its tenant (when it has
    one) and one of its readers in the chunk's `access` list. A principal without a tenant gets no tenant
    clause (the store cannot ask for a missing key): `candidates` drops the other tenants' chunks by
    `may_read`."""
    if principal.admin:
        return None
    readers = sorted(principal.readers)
    contains: dict[str, Any] = (
        {ACCESS: {"$contains": readers[0]}}
        if len(readers) == 1
        else {"$or": [{ACCESS: {"$contains": name}} for name in readers]}
    )
    if principal.tenant is None:
        return contains
    return {"$and": [{TENANT: principal.tenant}, contains]}


def and_where(*clauses: dict[str, Any] | None) -> dict[str, Any] | None:
    """The clauses that are not None, joined with `$and` when there are several."""
    present = [c for c in clauses if c is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else {"$and": present}


# -- index labels ------------------------------------------------------------------------------------------
#
# The lexical index and the exact search keep one small label per chunk, numbered, to filter by before a
# cut: the chunk's knowledge tag alone (a chunk without a scope, as before scopes existed), or, for a chunk
# with a tenant or an access list, a string that starts with LABEL_MARK and holds all three.

LABEL_MARK = "\x00scope:"


@dataclass(frozen=True)
class Label:
    knowledge: str | None
    tenant: str | None
    access: tuple[str, ...] | None

    def readable_by(self, principal: Principal) -> bool:
        return may_read(principal, self.metadata())

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tenant is not None:
            out[TENANT] = self.tenant
        if self.access is not None:
            out[ACCESS] = list(self.access)
        return out


def chunk_label(knowledge: str | None, metadata: Mapping[str, Any]) -> str | None:
    """The index label of a chunk with this knowledge tag and stored metadata (None: untagged, unscoped)."""
    tenant = metadata.get(TENANT)
    access = metadata.get(ACCESS)
    if tenant is None and access is None:
        return knowledge
    scoped: list[Any] = [
        knowledge,
        tenant if isinstance(tenant, str) else None,
        sorted(a for a in access if isinstance(a, str)) if isinstance(access, list | tuple) else None,
    ]
    if tenant is not None and not isinstance(tenant, str):
        # a tenant of another type: JSON false, which no principal's tenant (a string) equals and which
        # `may_read` refuses as it refuses the original (a marker string could be some principal's tenant)
        scoped[1] = False
    return LABEL_MARK + json.dumps(scoped, ensure_ascii=False, separators=(",", ":"))


def parse_label(label: str | None) -> Label:
    if label is None:
        return Label(None, None, None)
    if not label.startswith(LABEL_MARK):
        return Label(label, None, None)
    knowledge, tenant, access = json.loads(label[len(LABEL_MARK) :])
    return Label(knowledge, tenant, tuple(access) if access is not None else None)


def label_knowledge(label: str | None) -> str | None:
    """The knowledge tag part of a label."""
    if label is None or not label.startswith(LABEL_MARK):
        return label
    return parse_label(label).knowledge


def label_matches(label: str | None, knowledge_tag: str | None, principal: Principal | None) -> bool:
    """A chunk so labelled has `knowledge_tag` (any, for None) and `principal` may read it (anyone, for
    None)."""
    parsed = parse_label(label)
    if knowledge_tag is not None and parsed.knowledge != knowledge_tag:
        return False
    return principal is None or parsed.readable_by(principal)


def readable_labels(labels: Iterable[str | None], principal: Principal) -> list[bool]:
    """Per label, whether `principal` reads a chunk so labelled."""
    return [parse_label(label).readable_by(principal) for label in labels]
