"""Bearer JWTs as principals (`app.api.principals`, rag.access.jwt): signed by the configured key (a PEM
public key, a shared secret, or a JWKS by `kid`), unexpired, for the audience and issuer, the claims name
the principal; everything else is refused with the reason."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.access.scope import Principal
from app.api.principals import PrincipalBook, PrincipalConfigError, TokenRefused
from app.settings import AccessSettings

NOW = int(time.time())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def book(tmp_path: Path, **jwt_settings: Any) -> PrincipalBook:
    return PrincipalBook(AccessSettings(enabled=True, jwt={"enabled": True, **jwt_settings}))


def claims(**more: Any) -> dict[str, Any]:
    return {"sub": "alice", "tenant": "acme", "groups": ["hr"], "exp": NOW + 600, **more}


def test_a_signed_token_reads_as_the_principal_its_claims_name(tmp_path: Path, rsa_key) -> None:
    (tmp_path / "key.pem").write_bytes(public_pem(rsa_key))
    verifier = book(tmp_path, key_file=str(tmp_path / "key.pem"), audience="sieve", issuer="https://idp")
    token = jwt.encode(claims(aud="sieve", iss="https://idp"), rsa_key, algorithm="RS256")
    assert verifier.resolve(token.encode()) == Principal("jwt:alice", "acme", ("hr",), "alice")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"exp": NOW - 3600}, "the JWT has expired"),
        ({"aud": "another-service"}, "Audience doesn't match"),
        ({"iss": "https://elsewhere"}, "Invalid issuer"),
        ({"sub": None}, "sub"),
        ({"groups": [1, 2]}, "not a list of group names"),
        ({"tenant": " acme"}, "has spaces around it"),
    ],
)
def test_a_token_with_a_wrong_claim_is_refused_saying_which(tmp_path: Path, rsa_key, change, why) -> None:
    (tmp_path / "key.pem").write_bytes(public_pem(rsa_key))
    verifier = book(tmp_path, key_file=str(tmp_path / "key.pem"), audience="sieve", issuer="https://idp")
    body = {k: v for k, v in {**claims(aud="sieve", iss="https://idp"), **change}.items() if v is not None}
    with pytest.raises(TokenRefused, match=why):
        verifier.resolve(jwt.encode(body, rsa_key, algorithm="RS256").encode())


def test_a_token_without_expiry_signed_by_another_key_or_unsigned_is_refused(tmp_path: Path, rsa_key) -> None:
    (tmp_path / "key.pem").write_bytes(public_pem(rsa_key))
    verifier = book(tmp_path, key_file=str(tmp_path / "key.pem"))
    no_exp = {k: v for k, v in claims().items() if k != "exp"}
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for token in [
        jwt.encode(no_exp, rsa_key, algorithm="RS256"),
        jwt.encode(claims(), other, algorithm="RS256"),
        jwt.encode(claims(), None, algorithm="none"),
        jwt.encode(claims(), "a-guessed-secret-of-32-bytes-or-more", algorithm="HS256"),  # not RS256
    ]:
        with pytest.raises(TokenRefused, match="JWT is not valid"):
            verifier.resolve(token.encode())


def test_a_shared_secret_and_a_lone_group_string_which_is_one_group(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret-s3cret-s3cret-s3cret-s3cret\n", encoding="utf-8")
    verifier = book(tmp_path, key_file=str(tmp_path / "secret"), algorithms=["HS256"])
    token = jwt.encode(claims(groups="hr,sales"), "s3cret-s3cret-s3cret-s3cret-s3cret", algorithm="HS256")
    assert verifier.resolve(token.encode()).groups == ("hr,sales",)  # never split at commas


def test_a_jwks_key_is_picked_by_the_tokens_kid(tmp_path: Path, rsa_key) -> None:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}))
    verifier = book(tmp_path, jwks_file=str(tmp_path / "jwks.json"))
    good = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k1"})
    assert verifier.resolve(good.encode()).name == "jwt:alice"
    unknown = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "k2"})
    with pytest.raises(TokenRefused, match="no key with kid 'k2'"):
        verifier.resolve(unknown.encode())


def test_a_key_file_that_cannot_be_read_is_a_configuration_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(PrincipalConfigError, match=r"rag.access.jwt.jwks_file: cannot read .*missing.json"):
        book(tmp_path, jwks_file=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"keys": "no"}')
    with pytest.raises(PrincipalConfigError, match="is not a usable JWKS"):
        book(tmp_path, jwks_file=str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"enabled": True}, "exactly one of key_file and jwks_file"),
        ({"enabled": True, "key_file": "a", "jwks_file": "b"}, "exactly one of key_file and jwks_file"),
        ({"algorithms": ["none"]}, "an unsigned token proves nothing"),
    ],
)
def test_jwt_settings_refuse_an_unusable_combination(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        AccessSettings(jwt=settings)


def test_with_jwt_off_a_token_that_is_no_principals_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenRefused, match="not one of them"):
        PrincipalBook(AccessSettings(enabled=True)).resolve(b"whatever-token-0123456789")
