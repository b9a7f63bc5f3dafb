"""Token verification's rules (tokens.py): the issuer and audience a deployment requires, the clock
skew allowed, the site a token names; and a JWKS kept in a file (backends/jwks.py), followed
through a rotation. The JWKS over http is tests/server/test_identity.py's."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from chromafs_fuse.backends.jwks import jwks_keys, shown
from chromafs_fuse.config import TokenKeys
from chromafs_fuse.token_source import load_token_key
from chromafs_fuse.tokens import (
    KeysUnavailable,
    TokenError,
    TokenNotForSite,
    TokenRules,
    VerificationKey,
    principal_from_token,
)

SECRET = b"unit-test-secret-0123456789abcdef"
KEY = VerificationKey(SECRET, ["HS256"])
ISSUER, AUDIENCE = "https://idp.test", "chromafs"
RULES = TokenRules(ISSUER, AUDIENCE)


def _token(**claims: object) -> str:
    payload: dict[str, object] = {"sub": "alice", "site": "acme", "iss": ISSUER, "aud": AUDIENCE}
    payload["exp"] = int(time.time()) + 600
    payload.update(claims)
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, SECRET, "HS256")


def test_a_token_of_the_issuer_and_audience_is_a_reader() -> None:
    principal = principal_from_token(_token(groups=["billing"]), KEY, "acme", RULES)
    assert principal.subject == "alice" and principal.groups == {"billing"}
    # one audience among others
    assert principal_from_token(_token(aud=["other", AUDIENCE]), KEY, "acme", RULES).subject == "alice"


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        (
            {"iss": "https://evil.test"},
            "token's 'iss' claim is 'https://evil.test', not the issuer --jwt-issuer expects, 'https://idp.test'",
        ),
        ({"iss": None}, "token has no 'iss' claim (--jwt-issuer expects 'https://idp.test')"),
        (
            {"aud": "someone-else"},
            "token's 'aud' claim is 'someone-else', without the audience --jwt-audience expects, 'chromafs'",
        ),
        ({"aud": None}, "token has no 'aud' claim (--jwt-audience expects 'chromafs')"),
    ],
)
def test_another_issuer_or_audience_is_refused_saying_which_claim(claims: dict[str, object], message: str) -> None:
    with pytest.raises(TokenError) as refused:
        principal_from_token(_token(**claims), KEY, "acme", RULES)
    assert str(refused.value) == message
    assert SECRET.decode() not in str(refused.value)


def test_without_rules_iss_is_not_checked_and_aud_names_the_site() -> None:
    """Tokens made before --jwt-issuer/--jwt-audience keep working: `aud` stands for the site."""
    assert principal_from_token(_token(iss="anyone"), KEY, "acme").subject == "alice"
    assert principal_from_token(_token(site=None, aud="acme"), KEY, "acme").subject == "alice"
    with pytest.raises(TokenNotForSite):
        principal_from_token(_token(site=None, aud=AUDIENCE), KEY, "acme")


def test_with_an_audience_the_site_is_the_site_claim_or_another_aud() -> None:
    assert principal_from_token(_token(site=None, aud=[AUDIENCE, "acme"]), KEY, "acme", RULES).subject == "alice"
    with pytest.raises(TokenNotForSite) as refused:
        principal_from_token(_token(site=None), KEY, "acme", RULES)
    assert str(refused.value) == "token names no site: no 'site' claim, and 'acme' is not in its 'aud' claim"


def test_a_small_clock_skew_is_allowed_for_nbf_and_iat() -> None:
    now = int(time.time())
    assert principal_from_token(_token(iat=now + 20, nbf=now + 20), KEY, "acme", RULES).subject == "alice"
    with pytest.raises(TokenError, match="not valid yet"):
        principal_from_token(_token(nbf=now + 120), KEY, "acme", RULES)
    # none for exp: the session would end at once, by this host's clock
    with pytest.raises(TokenError, match="expired"):
        principal_from_token(_token(exp=now - 5), KEY, "acme", RULES)


def _jwk(private: rsa.RSAPrivateKey, kid: str) -> dict[str, object]:
    return {**RSAAlgorithm.to_jwk(private.public_key(), as_dict=True), "kid": kid, "use": "sig", "alg": "RS256"}


def _rs(private: rsa.RSAPrivateKey, kid: str, **claims: object) -> str:
    payload = {"sub": "alice", "site": "acme", "exp": int(time.time()) + 600, **claims}
    return jwt.encode(payload, private, "RS256", headers={"kid": kid})


def test_a_jwks_file_is_followed_through_a_rotation(tmp_path: Path) -> None:
    old, new = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [_jwk(old, "k1")]}))
    keys = load_token_key(TokenKeys(jwks_url=f"file://{path}"), 5.0)
    assert keys is not None and not isinstance(keys, VerificationKey)
    assert principal_from_token(_rs(old, "k1"), keys, "acme").subject == "alice"
    with pytest.raises(TokenError) as refused:
        principal_from_token(_rs(new, "k2"), keys, "acme")
    assert str(refused.value) == f"token's signing key (kid 'k2') is not in the JWKS at {path}"
    # the provider rotates: k2 published, k1 withdrawn (a new file, as a Secret's update writes it)
    path.with_suffix(".new").write_text(json.dumps({"keys": [_jwk(new, "k2")]}))
    os.replace(path.with_suffix(".new"), path)
    assert principal_from_token(_rs(new, "k2"), keys, "acme").subject == "alice"
    with pytest.raises(TokenError, match="kid 'k1'"):
        principal_from_token(_rs(old, "k1"), keys, "acme")
    # a token naming k2 but signed by another key is a forgery
    with pytest.raises(TokenError, match="signature is invalid"):
        principal_from_token(_rs(old, "k2"), keys, "acme")
    # the algorithm is the JWKS's, never the token's: an HS256 token under kid k2 is refused
    forged = jwt.encode({"site": "acme", "exp": int(time.time()) + 60}, "x" * 32, "HS256", headers={"kid": "k2"})
    with pytest.raises(TokenError, match="algorithm is not allowed"):
        principal_from_token(forged, keys, "acme")
    # a key set that cannot be read refuses every token (fails closed), naming the file
    path.unlink()
    with pytest.raises(KeysUnavailable) as unreadable:
        principal_from_token(_rs(new, "k2"), keys, "acme")
    assert str(unreadable.value) == f"cannot read the JWKS file {path}: No such file or directory"


def test_one_key_source_at_a_time_and_urls_shown_without_secrets(tmp_path: Path) -> None:
    with pytest.raises(TokenError) as refused:
        load_token_key(TokenKeys(secret_file=str(tmp_path / "s"), jwks_url="https://idp.test/jwks"), 5.0)
    assert str(refused.value) == (
        "give one of --jwt-secret-file, --jwt-public-key and --jwks-url, not --jwt-secret-file and --jwks-url"
    )
    with pytest.raises(TokenError, match="wants an http"):
        jwks_keys("ftp://idp.test/jwks", 1.0, 300.0, 5.0)
    assert shown("https://user:pw@idp.test:8443/keys?token=s3cret") == "https://idp.test:8443/keys"


def test_a_configuration_journaled_before_token_keys_were_grouped_is_read() -> None:
    """A mount server's state journal keeps each class's MountConfig.to_dict(): one written before
    `keys` (jwt_secret_file, jwt_public_key beside the other settings) still serves its class again."""
    from chromafs_fuse.config import ChromaLocation, MountConfig, SessionConfig

    keys = TokenKeys(jwks_url="https://idp.test/jwks", issuer=ISSUER, audience=AUDIENCE, jwks_cooldown_s=1.0)
    config = MountConfig(SessionConfig("acme", ChromaLocation(path="/c", collection="acme"), "p", "i", keys=keys), "/m")
    assert MountConfig.from_dict(config.to_dict()) == config
    old = config.to_dict()
    old["session"].pop("keys")  # type: ignore[attr-defined]
    old["session"].update(jwt_secret_file="/etc/secret", jwt_public_key=None)  # type: ignore[attr-defined]
    assert MountConfig.from_dict(old).session.keys == TokenKeys(secret_file="/etc/secret")
    # what a serving process is sent: no keys at all, as an older one reads it
    sent = config.without_keys().to_dict()
    assert "keys" not in sent["session"] and MountConfig.from_dict(sent) == config.without_keys()  # type: ignore[operator]
