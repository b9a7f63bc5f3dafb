"""Where a session's token comes from: --token, --token-file, CHROMAFS_TOKEN_FILE, CHROMAFS_TOKEN.

Standard library only: the mount client imports it on its fast path.
"""

from __future__ import annotations

import os
import sys

from chromafs_fuse.errors import UsageError
from chromafs_fuse.names import MAX_TOKEN_BYTES

TYPE_CHECKING = False  # not `from typing import ...`: typing costs the mount client ~3 ms of start-up

if TYPE_CHECKING:
    import argparse

    from chromafs_fuse.config import TokenKeys
    from chromafs_fuse.tokens import KeyLookup, VerificationKey


def read_token_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_TOKEN_BYTES:
        raise UsageError(f"token file {path} is larger than {MAX_TOKEN_BYTES} bytes")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise UsageError(f"token file {path} does not hold a JWT") from exc
    if not token:
        raise UsageError(f"token file {path} is empty")
    return token


def token_of(token: str | None, token_file: str | None) -> str | None:
    """The session token: --token, --token-file, CHROMAFS_TOKEN_FILE, CHROMAFS_TOKEN, in that order."""
    if token and token_file:
        raise UsageError("give --token or --token-file, not both")
    if token:
        return token
    if token_file:
        return read_token_file(token_file)
    if os.environ.get("CHROMAFS_TOKEN_FILE"):
        return read_token_file(os.environ["CHROMAFS_TOKEN_FILE"])
    return os.environ.get("CHROMAFS_TOKEN") or None


def resolve_token(args: argparse.Namespace) -> str | None:
    """The session token the flags name: stdin (--token-stdin: chromafs-mount hands it to its
    daemon so), else as `token_of` finds it."""
    if args.token_stdin:
        return sys.stdin.read().strip() or None
    return token_of(args.token, args.token_file)


def load_verification_key(secret_file: str | None, public_key_file: str | None) -> VerificationKey | None:
    """The key of --jwt-secret-file or --jwt-public-key, read from its file (tokens.verification_key)."""
    from chromafs_fuse.tokens import TokenError, verification_key  # jwt and cryptography: only when asked

    if secret_file and public_key_file:
        raise TokenError("give --jwt-secret-file or --jwt-public-key, not both")
    secret = _key_file(secret_file, "JWT secret file") if secret_file else None
    pem = _key_file(public_key_file, "JWT public key") if public_key_file else None
    return verification_key(secret, pem, public_key_file or "the public key")


def _key_file(path: str, what: str) -> bytes:
    from chromafs_fuse.tokens import TokenError

    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TokenError(f"cannot read {what} {path}: {exc.strerror}") from exc


def load_token_key(keys: TokenKeys, timeout_s: float) -> VerificationKey | KeyLookup | None:
    """What verifies a token's signature: the key of --jwt-secret-file or --jwt-public-key, or the
    keys of --jwks-url (found by the token's `kid`, fetched and cached: backends/jwks.py); None
    without any. `timeout_s` bounds a JWKS fetch."""
    from chromafs_fuse.tokens import TokenError

    given = [flag for flag, value in (("--jwt-secret-file", keys.secret_file),
             ("--jwt-public-key", keys.public_key), ("--jwks-url", keys.jwks_url)) if value]  # fmt: skip
    if len(given) > 1:
        raise TokenError(f"give one of --jwt-secret-file, --jwt-public-key and --jwks-url, not {' and '.join(given)}")
    if keys.jwks_url:
        from chromafs_fuse.backends.jwks import jwks_keys

        return jwks_keys(keys.jwks_url, keys.jwks_cooldown_s, keys.jwks_refresh_s, timeout_s)
    return load_verification_key(keys.secret_file, keys.public_key)
