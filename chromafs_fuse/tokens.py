"""Turning a session token into the Principal a mount is scoped to.

Tokens are JWTs. The algorithm is fixed by the kind of key configured, never
taken from the token, so `alg: none` and HS/RS confusion are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import AccessDenied
from chromafs_fuse.names import MAX_TOKEN_BYTES


class TokenError(AccessDenied, ValueError):
    """The token cannot be used; the message is safe to print (holds no token)."""


class TokenNotForSite(TokenError):
    """A valid token that does not name this site: its holder is known, but not allowed here."""


class KeysUnavailable(TokenError):
    """The keys that would verify the token cannot be had now (an identity provider down, its JWKS
    file unreadable): the token is refused, though it may be good."""


# clock skew between the token's issuer and this host that nbf and iat allow; not exp: a session
# ends at its token's exp by this host's clock, so a token past it would open a session only to end it
LEEWAY_S = 30.0


@dataclass(frozen=True)
class VerificationKey:
    key: bytes | ed25519.Ed25519PublicKey | rsa.RSAPublicKey | ec.EllipticCurvePublicKey  # a secret, or a public key
    algorithms: Sequence[str]


# A token's key found by the token itself (its header's `kid`), from a set of keys the verifier
# trusts (a JWKS: backends/jwks.py); TokenError when the set has none for it. May block.
KeyLookup = Callable[[str], VerificationKey]


@dataclass(frozen=True)
class TokenRules:
    """What a token must say besides its site: who issued it (`iss`), for whom (`aud`)."""

    issuer: str | None = None  # --jwt-issuer
    audience: str | None = None  # --jwt-audience: then `aud` names the audience, not the site
    leeway_s: float = LEEWAY_S
    # the flags that set them, as a refusal names them (chromafs-csi's --sa-* for a pod's token)
    issuer_flag: str = "--jwt-issuer"
    audience_flag: str = "--jwt-audience"
    keys_flags: str = "--jwt-secret-file, --jwt-public-key or --jwks-url"


def verification_key(
    secret: bytes | None, public_pem: bytes | None, pem_name: str = "the public key"
) -> VerificationKey | None:
    """The key a token is checked with, from an HS256 secret or a PEM public key (pure: the files
    are read by token_source.load_verification_key); None without either."""
    if secret is not None and public_pem is not None:
        raise TokenError("give --jwt-secret-file or --jwt-public-key, not both")
    if secret is not None:
        secret = secret.strip()
        if len(secret) < 16:
            raise TokenError("JWT secret is shorter than 16 bytes")
        return VerificationKey(secret, ["HS256"])
    if public_pem is not None:
        try:
            key = load_pem_public_key(public_pem)
        except ValueError as exc:
            raise TokenError(f"{pem_name} is not a PEM public key") from exc
        if isinstance(key, ed25519.Ed25519PublicKey):
            return VerificationKey(key, ["EdDSA"])
        if isinstance(key, rsa.RSAPublicKey):
            return VerificationKey(key, ["RS256"])
        if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
            return VerificationKey(key, ["ES256"])
        raise TokenError("public key must be Ed25519, RSA or EC P-256")
    return None


def principal_from_token(
    token: str | None, key: VerificationKey | KeyLookup | None, site: str, rules: TokenRules = TokenRules()
) -> Principal:
    """No token: anonymous. A token: verified, or TokenError. Never a silent fallback."""
    if token is None or token == "":
        return Principal.anonymous()
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenError(f"token is larger than {MAX_TOKEN_BYTES} bytes")
    if key is None:
        raise TokenError("a token was given but no --jwt-secret-file, --jwt-public-key or --jwks-url to verify it")
    claims = _verified_claims(token, key if isinstance(key, VerificationKey) else _looked_up(key, token), rules)
    token_site = claims.get("site")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if token_site is not None:
        if token_site != site:
            raise TokenNotForSite(
                f"token is for site '{token_site}', not '{site}': check --site, or use a token of site '{site}'"
            )
    elif site not in audiences:
        if rules.audience is not None:
            raise TokenNotForSite(f"token names no site: no 'site' claim, and '{site}' is not in its 'aud' claim")
        raise TokenNotForSite("token has no 'site' (or 'aud') claim for this site")
    groups = claims.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise TokenError("token 'groups' claim is not a list of strings")
    subject = claims.get("sub")
    expires_at = claims["exp"]
    assert isinstance(expires_at, (int, float))  # _verified_claims checked it
    token_id, issued_at = claims.get("jti"), claims.get("iat")
    return Principal.of(
        groups,
        subject if isinstance(subject, str) else None,
        float(expires_at),
        token_id if isinstance(token_id, str) and token_id else None,
        float(issued_at) if isinstance(issued_at, (int, float)) and not isinstance(issued_at, bool) else None,
    )


def verified_claims(token: str, key: VerificationKey | KeyLookup, rules: TokenRules) -> dict[str, object]:
    """A token's claims once its signature, `exp`, `nbf`, and `iss`/`aud` (as `rules` ask) are
    checked; TokenError otherwise. For tokens that name no site (a pod's: pod_readers.py)."""
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenError(f"token is larger than {MAX_TOKEN_BYTES} bytes")
    return _verified_claims(token, key if isinstance(key, VerificationKey) else _looked_up(key, token), rules)


def _looked_up(lookup: KeyLookup, token: str) -> VerificationKey:
    import jwt  # with cryptography, ~50 ms: a mount read without a token never imports it

    try:
        jwt.get_unverified_header(token)
    except jwt.DecodeError as exc:
        raise TokenError("the token is not a JWT (three base64url parts joined by dots): check the token file") from exc
    return lookup(token)


def _verified_claims(token: str, key: VerificationKey, rules: TokenRules) -> dict[str, object]:
    import jwt

    required = ["exp"] + (["iss"] if rules.issuer is not None else []) + (["aud"] if rules.audience is not None else [])
    try:
        claims: dict[str, object] = jwt.decode(
            token,
            key.key,
            algorithms=list(key.algorithms),
            options={"require": required, "verify_aud": rules.audience is not None},
            issuer=rules.issuer,
            audience=rules.audience,
            leeway=rules.leeway_s,
        )
    except jwt.ExpiredSignatureError as exc:
        raise TokenError("token has expired: ask for a new one") from exc
    except jwt.ImmatureSignatureError as exc:
        raise TokenError("token is not valid yet (nbf/iat in the future): check this machine's clock") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"token has no '{exc.claim}' claim{_wanted(exc.claim, rules)}") from exc
    except jwt.InvalidIssuerError as exc:
        got = _claim_text(token, "iss")
        raise TokenError(
            f"token's 'iss' claim is {got}, not the issuer {rules.issuer_flag} expects, '{rules.issuer}'"
        ) from exc
    except jwt.InvalidAudienceError as exc:
        got = _claim_text(token, "aud")
        raise TokenError(
            f"token's 'aud' claim is {got}, without the audience {rules.audience_flag} expects, '{rules.audience}'"
        ) from exc
    except jwt.InvalidAlgorithmError as exc:
        raise TokenError(f"token algorithm is not allowed (expected {', '.join(key.algorithms)})") from exc
    except jwt.InvalidSignatureError as exc:
        raise TokenError(f"token signature is invalid: it was not signed with a key of {rules.keys_flags}") from exc
    except jwt.DecodeError as exc:
        raise TokenError("the token is not a JWT (three base64url parts joined by dots): check the token file") from exc
    except jwt.InvalidTokenError as exc:
        raise TokenError(f"the token is invalid: {exc}") from exc
    expires_at = claims["exp"]  # required and checked by jwt.decode: a number
    if not isinstance(expires_at, (int, float)) or expires_at <= time.time():  # no leeway (LEEWAY_S)
        raise TokenError("token has expired: ask for a new one")
    return claims


def _claim_text(token: str, claim: str) -> str:
    import jwt

    """A claim of a token whose signature was verified, as a refusal quotes it (shortened)."""
    text = repr(jwt.decode(token, options={"verify_signature": False}).get(claim))
    return text if len(text) <= 80 else text[:77] + "..."


def _wanted(claim: str, rules: TokenRules) -> str:
    if claim == "iss":
        return f" ({rules.issuer_flag} expects '{rules.issuer}')"
    if claim == "aud":
        return f" ({rules.audience_flag} expects '{rules.audience}')"
    return ""
