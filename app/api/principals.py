"""Who a request reads as, when `rag.access.enabled`: the admin token reads everything; any other token must
be one of `rag.access.principals` (found by its SHA-256, never compared or stored in clear); anything else is
refused. Fail closed: no token, an unknown token, or `rag.server.api_token` (a shared token has no scope) is
a 401, never a fallback to "everything".

With access off, every reader is unscoped (`None`), as before scopes existed."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from app.access.scope import ADMIN, Principal
from app.settings import AccessSettings, PrincipalSettings


class PrincipalBook:
    """The configured principals by the SHA-256 of their token."""

    def __init__(self, access: AccessSettings):
        self.enabled = access.enabled
        self._by_digest: dict[str, Principal] = {
            p.token_sha256: principal_of(name, p) for name, p in access.principals.items()
        }

    def find(self, token: bytes) -> Principal | None:
        """The principal whose token this is, or None."""
        return self._by_digest.get(hashlib.sha256(token).hexdigest())


def principal_of(name: str, settings: PrincipalSettings) -> Principal:
    return Principal(name=name, tenant=settings.tenant, groups=tuple(settings.groups), user=settings.user)


def eval_principals(access: AccessSettings) -> Mapping[str, Principal]:
    """`rag.access.eval_principals` as principals, by name."""
    return {
        name: Principal(name=name, tenant=p.tenant, groups=tuple(p.groups), user=p.user)
        for name, p in access.eval_principals.items()
    }


__all__ = ["ADMIN", "PrincipalBook", "eval_principals", "principal_of"]
