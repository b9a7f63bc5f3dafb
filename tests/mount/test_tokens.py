"""Tokens: what verifies, and every way a bad token is refused (unit and real CLI)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from chromafs_fuse.token_source import load_verification_key
from chromafs_fuse.tokens import TokenError, principal_from_token
from infra import Backend, is_mounted, try_mount

SECRET = "unit-test-secret-0123456789abcdef-0123"


def _claims(**extra: object) -> dict[str, object]:
    claims: dict[str, object] = {"sub": "u", "site": "acme", "groups": ["billing"], "exp": int(time.time()) + 600}
    claims.update(extra)
    return claims


@pytest.fixture
def hs_key(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "secret").write_text(SECRET)
    return load_verification_key(str(tmp_path / "secret"), None)


def _pem(tmp_path: Path, private_key: object) -> Path:
    path = tmp_path / "pub.pem"
    path.write_bytes(
        private_key.public_key().public_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


@pytest.mark.parametrize(
    ("make_key", "alg"),
    [
        (ed25519.Ed25519PrivateKey.generate, "EdDSA"),
        (lambda: rsa.generate_private_key(65537, 2048), "RS256"),
        (lambda: ec.generate_private_key(ec.SECP256R1()), "ES256"),
    ],
)
def test_public_key_algorithms(tmp_path: Path, make_key: Callable[[], object], alg: str) -> None:
    private = make_key()
    key = load_verification_key(None, str(_pem(tmp_path, private)))
    token = jwt.encode(_claims(), private, algorithm=alg)  # type: ignore[arg-type]
    principal = principal_from_token(token, key, "acme")
    assert principal.authenticated and principal.groups == {"billing"}


def test_valid_tokens(hs_key) -> None:  # type: ignore[no-untyped-def]
    assert principal_from_token(None, hs_key, "acme").authenticated is False
    no_groups = jwt.encode({k: v for k, v in _claims().items() if k != "groups"}, SECRET, "HS256")
    assert principal_from_token(no_groups, hs_key, "acme").groups == frozenset()
    aud = jwt.encode({**{k: v for k, v in _claims().items() if k != "site"}, "aud": ["other", "acme"]}, SECRET, "HS256")
    assert principal_from_token(aud, hs_key, "acme").authenticated


# Site names that hold the site "acme" or that it holds: each names another site.
NEAR_SITES = ["acme-staging", "xacme", "acme ", "ACME", "acm", ""]
NEAR_AUDIENCES: list[object] = ["acme-staging", ["acme-staging", "xacme"], "acm"]


def _without_site() -> dict[str, object]:
    return {k: v for k, v in _claims().items() if k != "site"}


@pytest.mark.parametrize("site", NEAR_SITES)
def test_a_site_claim_names_the_site_exactly(hs_key, site: str) -> None:  # type: ignore[no-untyped-def]
    """A token for "acme-staging", "xacme" or "acm" is a token for another site, not for "acme"."""
    with pytest.raises(TokenError) as refused:
        principal_from_token(jwt.encode(_claims(site=site), SECRET, "HS256"), hs_key, "acme")
    assert str(refused.value).startswith("token is for site ") and "not 'acme'" in str(refused.value)


@pytest.mark.parametrize("aud", NEAR_AUDIENCES, ids=str)
def test_an_audience_names_the_site_exactly(hs_key, aud: object) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenError) as refused:
        principal_from_token(jwt.encode({**_without_site(), "aud": aud}, SECRET, "HS256"), hs_key, "acme")
    assert str(refused.value) == "token has no 'site' (or 'aud') claim for this site"


def _b64(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def bad_tokens(tmp_path: Path) -> dict[str, str]:
    rsa_private = rsa.generate_private_key(65537, 2048)
    rsa_public_pem = rsa_private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "wrong signature": jwt.encode(_claims(), "another-secret-0123456789abcdef-0123", "HS256"),
        "expired": jwt.encode(_claims(exp=int(time.time()) - 60), SECRET, "HS256"),
        "not yet valid": jwt.encode(_claims(nbf=int(time.time()) + 3600), SECRET, "HS256"),
        "no exp": jwt.encode({k: v for k, v in _claims().items() if k != "exp"}, SECRET, "HS256"),
        "other site": jwt.encode(_claims(site="other"), SECRET, "HS256"),
        **{f"site {site!r}": jwt.encode(_claims(site=site), SECRET, "HS256") for site in NEAR_SITES},
        **{f"aud {aud!r}": jwt.encode({**_without_site(), "aud": aud}, SECRET, "HS256") for aud in NEAR_AUDIENCES},
        "no site": jwt.encode({k: v for k, v in _claims().items() if k != "site"}, SECRET, "HS256"),
        "groups not a list": jwt.encode(_claims(groups="admin"), SECRET, "HS256"),
        "groups not strings": jwt.encode(_claims(groups=[1, 2]), SECRET, "HS256"),
        "alg none": _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(_claims()) + ".",
        "HS256 signed with an RSA public key": _b64({"alg": "HS256", "typ": "JWT"})
        + "."
        + _b64(_claims())
        + "."
        + base64.urlsafe_b64encode(
            __import__("hmac")
            .new(rsa_public_pem, (_b64({"alg": "HS256", "typ": "JWT"}) + "." + _b64(_claims())).encode(), "sha256")
            .digest()
        )
        .rstrip(b"=")
        .decode(),
        "malformed": "not-a-jwt",
        "huge": "a" * 20000,
    }


def test_bad_tokens_are_refused(hs_key, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for what, token in bad_tokens(tmp_path).items():
        with pytest.raises(TokenError):
            principal_from_token(token, hs_key, "acme")
        assert what


def test_token_without_a_key_is_refused() -> None:
    with pytest.raises(TokenError, match="no --jwt-secret-file"):
        principal_from_token(jwt.encode(_claims(), SECRET, "HS256"), None, "acme")


def test_cli_refuses_bad_tokens_with_one_line_and_no_mount(
    sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    backend = sample_backend().args
    for what, token in bad_tokens(tmp_path).items():
        token_path = tmp_path / "t.jwt"
        token_path.write_text(token)
        proc = try_mount(mnt, *backend, "--token-file", str(token_path), "--jwt-secret-file", str(secret))
        assert proc.returncode != 0, what
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chromafs-mount: "), (what, proc.stderr)
        assert token not in proc.stderr
        assert not is_mounted(mnt), what
    # token through the environment is verified too; an unreadable token file is refused
    env_proc = try_mount(mnt, *backend, "--jwt-secret-file", str(secret), env={"CHROMAFS_TOKEN": "garbage"})
    assert env_proc.returncode != 0 and not is_mounted(mnt)
    missing = try_mount(mnt, *backend, "--token-file", str(tmp_path / "nope"), "--jwt-secret-file", str(secret))
    assert missing.returncode != 0 and "cannot read token file" in missing.stderr
