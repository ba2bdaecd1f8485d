"""Whose view each golden case tests: the evaluation principal it runs as (docs/access.md, "Evaluating
scopes").

A case names a principal by name (`principal: NAME`); the identity behind the name (tenant, groups, user)
comes from `rag.access.eval_principals` in the evaluation's configuration, never from the golden set
(`cases.IDENTITY_KEYS`). The rule per case:

* `principal: NAME`: the principal `NAME` of `rag.access.eval_principals`; "admin" (when no evaluation
  principal has that name) is the admin, who reads everything. Any other name is a golden-set error.
* no `principal`, `rag.access.enabled` false: unscoped (None), as before scopes existed;
* no `principal`, `rag.access.enabled` true: `rag.access.eval_default_principal`; without one the golden
  set is invalid, since a missing scope must never silently become "everything".
"""

from __future__ import annotations

from collections.abc import Mapping

from app.access.scope import ADMIN, Principal
from app.evaluation.golden.cases import GoldenSet, GoldenSetError
from app.evaluation.golden.segments import UNSCOPED
from app.settings import EVAL_ADMIN, AccessSettings


def eval_principals(access: AccessSettings) -> dict[str, Principal]:
    """`rag.access.eval_principals` as principals, by name, in the configured order."""
    return {
        name: Principal(name=name, tenant=p.tenant, groups=tuple(p.groups), user=p.user)
        for name, p in access.eval_principals.items()
    }


def principal_named(name: str, access: AccessSettings) -> Principal | None:
    """The evaluation principal `name` (the admin for "admin" unless one is configured so), None when
    there is none of that name."""
    defined = eval_principals(access)
    if name in defined:
        return defined[name]
    return ADMIN if name == EVAL_ADMIN else None


def case_principals(golden: GoldenSet, access: AccessSettings) -> dict[str, Principal | None]:
    """Per case id (drafts included), the principal it runs as (None: unscoped), by the module's rule.

    Raises `GoldenSetError` listing every case that names a principal not configured, and every case that
    names none while access is enabled without `eval_default_principal`."""
    defined = eval_principals(access)
    names = ", ".join(sorted(defined)) or "none"
    default = access.eval_default_principal if access.enabled else None
    errors: list[str] = []
    out: dict[str, Principal | None] = {}
    for case in golden.cases:
        name = case.principal if case.principal is not None else default
        if name is None:
            if access.enabled:
                errors.append(
                    f"{golden.path}: case {case.id!r} names no principal; with rag.access.enabled every case "
                    "says whose view it tests (principal: NAME, one of rag.access.eval_principals: "
                    f"{names}), or set rag.access.eval_default_principal"
                )
            out[case.id] = None
            continue
        principal = principal_named(name, access)
        if principal is None:
            errors.append(
                f'{golden.path}: case {case.id!r}: field "principal": {name!r} is not an evaluation '
                "principal; "
                f"defined in rag.access.eval_principals: {names} (or {EVAL_ADMIN!r}, who reads everything)"
            )
        out[case.id] = principal
    if errors:
        raise GoldenSetError(golden.path, errors)
    return out


def check_principals(golden: GoldenSet, access: AccessSettings) -> None:
    """`case_principals`' errors, raised as a `GoldenSetError` (exit 2 from the CLI) before anything runs."""
    case_principals(golden, access)


def principal_label(principal: Principal | None) -> str:
    """A run-as principal's name as the report shows it (`UNSCOPED` for None)."""
    return UNSCOPED if principal is None else principal.name


def others(principal: Principal | None, defined: Mapping[str, Principal]) -> list[Principal]:
    """The evaluation principals a case run as `principal` is probed as: every defined one but its own."""
    own = principal.name if principal is not None else None
    return [p for name, p in defined.items() if name != own]
