"""Who a request reads as, when `rag.access.enabled`: the admin token reads everything; any other token must
be one of `rag.access.principals` (found by its SHA-256, never compared or stored in clear) or, with
`rag.access.jwt.enabled`, a JSON Web Token signed by the configured key (PyJWT checks the signature, expiry,
audience and issuer); anything else is refused. Fail closed: no token, an unknown or invalid token, or
`rag.server.api_token` (a shared token has no scope) is a 401, never a fallback to "everything".

With access off, every reader is unscoped (`None`), as before scopes existed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jwt

from app.access.scope import ADMIN, AccessFieldError, Principal, checked_tenant
from app.settings import AccessSettings, JwtSettings, PrincipalSettings, SettingsError

# A bearer token longer than this is refused before it is decoded (a JWT with many groups is a few kB).
MAX_JWT_BYTES = 16_384
MAX_JWT_GROUPS = 1000


class PrincipalConfigError(SettingsError):
    """rag.access cannot be used as configured (a key file missing or unreadable); names the setting."""


class TokenRefused(Exception):
    """A bearer token that is not the admin's, nor a principal's, nor a valid JWT; says why."""


class PrincipalBook:
    """The configured principals by the SHA-256 of their token, and the JWT verifier when one is on."""

    def __init__(self, access: AccessSettings):
        self.enabled = access.enabled
        self._by_digest: dict[str, Principal] = {
            p.token_sha256: principal_of(name, p) for name, p in access.principals.items()
        }
        self._jwt = JwtVerifier(access.jwt) if access.enabled and access.jwt.enabled else None

    def find(self, token: bytes) -> Principal | None:
        """The configured principal whose token this is, or None."""
        return self._by_digest.get(hashlib.sha256(token).hexdigest())

    def resolve(self, token: bytes) -> Principal:
        """The principal this token reads as: a configured one, else the JWT's; TokenRefused otherwise."""
        found = self.find(token)
        if found is not None:
            return found
        if self._jwt is None:
            raise TokenRefused("this token is not one of them")
        return self._jwt.principal(token)


class JwtVerifier:
    """Turns a signed, valid JWT into a principal by `rag.access.jwt`'s claim names."""

    def __init__(self, settings: JwtSettings):
        self.settings = settings
        self._keys: dict[str | None, Any] = _load_keys(settings)

    def principal(self, token: bytes) -> Principal:
        s = self.settings
        if len(token) > MAX_JWT_BYTES:
            raise TokenRefused(f"a bearer token of {len(token)} bytes, more than {MAX_JWT_BYTES}")
        try:
            header = jwt.get_unverified_header(token)
            key = self._key_for(header.get("kid"))
            claims = jwt.decode(
                token,
                key,
                algorithms=s.algorithms,
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_seconds,
                options={"require": ["exp", s.user_claim] + (["aud"] if s.audience else [])},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused("the JWT has expired") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"the JWT is not valid: {exc}") from None
        return _principal_from_claims(claims, s)

    def _key_for(self, kid: object) -> Any:
        if None in self._keys and len(self._keys) == 1:
            return self._keys[None]
        key = self._keys.get(kid if isinstance(kid, str) else None)
        if key is None:
            raise jwt.InvalidKeyError(f"no key with kid {kid!r} in rag.access.jwt.jwks_file")
        return key


def _principal_from_claims(claims: Mapping[str, Any], s: JwtSettings) -> Principal:
    user = claims.get(s.user_claim)
    if not isinstance(user, str) or not user.strip():
        raise TokenRefused(f"the JWT's {s.user_claim!r} claim is not a name")
    groups = claims.get(s.groups_claim, [])
    if isinstance(groups, str):
        groups = [groups]  # one group, never split at commas
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise TokenRefused(f"the JWT's {s.groups_claim!r} claim is not a list of group names")
    if len(groups) > MAX_JWT_GROUPS:
        raise TokenRefused(f"the JWT names {len(groups)} groups, more than {MAX_JWT_GROUPS}")
    try:
        tenant = checked_tenant(claims.get(s.tenant_claim))
    except AccessFieldError as exc:
        raise TokenRefused(f"the JWT's {s.tenant_claim!r} claim: {exc}") from None
    return Principal(name=f"jwt:{user}", tenant=tenant, groups=tuple(groups), user=user)


def _load_keys(s: JwtSettings) -> dict[str | None, Any]:
    """The verification keys by `kid` (None: the one key of key_file)."""
    path = Path(s.key_file or s.jwks_file or "")
    setting = "rag.access.jwt.key_file" if s.key_file else "rag.access.jwt.jwks_file"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PrincipalConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
    if s.key_file:
        if all(alg.upper().startswith("HS") for alg in s.algorithms):
            return {None: data.strip()}  # a shared secret
        return {None: data}  # a PEM public key: PyJWT loads it for the token's algorithm
    try:
        jwks = jwt.PyJWKSet.from_dict(json.loads(data))
    except (ValueError, jwt.PyJWTError) as exc:
        raise PrincipalConfigError(f"{setting}: {path} is not a usable JWKS: {exc}") from None
    return {k.key_id: k.key for k in jwks.keys}


def principal_of(name: str, settings: PrincipalSettings) -> Principal:
    return Principal(name=name, tenant=settings.tenant, groups=tuple(settings.groups), user=settings.user)


__all__ = ["ADMIN", "PrincipalBook", "PrincipalConfigError", "TokenRefused", "principal_of"]
