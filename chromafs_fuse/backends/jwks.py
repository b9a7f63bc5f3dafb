"""An identity provider's signing keys, a JWKS document, to verify tokens with (--jwks-url).

Over http(s), PyJWT's PyJWKClient fetches the key set and keeps it for --jwks-refresh seconds; a
token signed by a key the kept set lacks (the provider rotated its keys) has the set fetched again
at once, but at most once per --jwks-cooldown seconds, so that tokens with made-up `kid`s cannot
hammer the provider. A JWKS in a file is read again whenever the file changes. The key's algorithm
is the JWKS's, never the token's.

Fails closed: a key set that cannot be fetched refuses the token, saying so in one line that names
the URL (without its credentials or query). Every call may block on the network: a trio loop runs
it in a worker thread.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import unquote, urlsplit, urlunsplit

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKSet
from jwt.exceptions import PyJWKClientConnectionError, PyJWKClientError, PyJWKError, PyJWKSetError

from chromafs_fuse import __version__
from chromafs_fuse.tokens import KeysUnavailable, TokenError, VerificationKey

# asymmetric signatures only: a JWKS is published, so a symmetric (HS*) key in it would be anyone's
ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})
MAX_KEY_SETS = 16  # key sets kept by one process (a mount server may be asked with a few URLs)


def shown(location: str) -> str:
    """A URL as a message may show it: no user, password or query (which may hold a secret)."""
    parts = urlsplit(location)
    if not parts.scheme:
        return location
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _kid_of(token: str) -> str:
    kid = jwt.get_unverified_header(token).get("kid")
    if not isinstance(kid, str) or not kid:
        raise TokenError("token has no 'kid' in its header: the JWKS key that signed it cannot be told")
    return kid


def _key(jwk: PyJWK, where: str) -> VerificationKey:
    algorithm = jwk.algorithm_name
    if algorithm not in ALGORITHMS:
        raise TokenError(f"the JWKS at {where} gives key '{jwk.key_id}' algorithm {algorithm}, not an asymmetric one")
    return VerificationKey(jwk.key, [algorithm])


def _find(keys: PyJWKSet, kid: str) -> PyJWK | None:
    for jwk in keys.keys:
        if jwk.key_id == kid and jwk.public_key_use in ("sig", None):
            return jwk
    return None


def _unknown(kid: str, where: str) -> TokenError:
    return TokenError(f"token's signing key (kid {kid[:64]!r}) is not in the JWKS at {where}")


class _Client(PyJWKClient):
    """PyJWKClient that remembers when it last fetched (its cache's expiry refetches too)."""

    fetched_at = -math.inf

    def fetch_data(self) -> Any:
        data = super().fetch_data()
        self.fetched_at = time.monotonic()
        return data


class RemoteKeys:
    """The key set at an http(s) URL; called with a token, the key it was signed with."""

    def __init__(self, url: str, cooldown_s: float, refresh_s: float, timeout_s: float) -> None:
        self.where = shown(url)
        self.cooldown_s = cooldown_s
        headers = {"User-Agent": f"chromafs/{__version__}", "Accept": "application/json"}
        self._client = _Client(url, cache_keys=False, lifespan=refresh_s, headers=headers, timeout=timeout_s)
        self._lock = threading.Lock()  # one fetch at a time; the others wait for its keys

    def __call__(self, token: str) -> VerificationKey:
        kid = _kid_of(token)
        with self._lock:
            keys = self._keys(refresh=False)
            jwk = _find(keys, kid)
            if jwk is None and time.monotonic() - self._client.fetched_at >= self.cooldown_s:
                jwk = _find(self._keys(refresh=True), kid)  # a rotation: the provider's new key
        if jwk is None:
            raise _unknown(kid, self.where)
        return _key(jwk, self.where)

    def _keys(self, refresh: bool) -> PyJWKSet:
        try:
            return self._client.get_jwk_set(refresh=refresh)
        except PyJWKClientConnectionError as exc:
            raise KeysUnavailable(f"cannot fetch the JWKS at {self.where}: {_reason(exc.__cause__)}") from exc
        except (PyJWKClientError, PyJWKSetError, PyJWKError) as exc:
            raise KeysUnavailable(f"the JWKS at {self.where} is not a usable key set: {exc}") from exc
        except ValueError as exc:  # json's: not JSON at all
            raise KeysUnavailable(f"the JWKS at {self.where} is not JSON") from exc


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, URLError):
        reason = exc.reason
        return getattr(reason, "strerror", None) or str(reason)
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) if exc is not None else "failed"


class FileKeys:
    """The key set in a file, read again when the file changes (its inode, size or modification
    time: a file replaced by a rename, as a Kubernetes Secret's update does, is a new inode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._keys: PyJWKSet | None = None

    def __call__(self, token: str) -> VerificationKey:
        kid = _kid_of(token)
        with self._lock:
            jwk = _find(self._current(), kid)
        if jwk is None:
            raise _unknown(kid, self.path)
        return _key(jwk, self.path)

    def _current(self) -> PyJWKSet:
        try:
            st = os.stat(self.path)
            if self._keys is None or self._seen != (st.st_ino, st.st_mtime_ns, st.st_size):
                with open(self.path, "rb") as f:
                    document = json.load(f)
                self._keys = PyJWKSet.from_dict(document)
                self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError as exc:
            raise KeysUnavailable(f"cannot read the JWKS file {self.path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise KeysUnavailable(f"the JWKS file {self.path} is not JSON") from exc
        except (PyJWKSetError, PyJWKError) as exc:
            raise KeysUnavailable(f"the JWKS file {self.path} is not a usable key set: {exc}") from exc
        return self._keys


_sets: dict[tuple[str, float, float, float], RemoteKeys | FileKeys] = {}
_sets_lock = threading.Lock()


def jwks_keys(location: str, cooldown_s: float, refresh_s: float, timeout_s: float) -> RemoteKeys | FileKeys:
    """The key set at `location` (an http(s) URL, a file:// URL or a path), one per process for
    each location and settings, so that its cache outlives a request."""
    scheme = urlsplit(location).scheme.lower()
    if scheme not in ("http", "https", "file", ""):
        raise TokenError(f"--jwks-url wants an http(s) URL or a file, not a {scheme}: URL")
    remote = scheme in ("http", "https")
    settings = (location, cooldown_s, refresh_s, timeout_s) if remote else (location, 0.0, 0.0, 0.0)
    with _sets_lock:
        found = _sets.get(settings)
        if found is None:
            if remote:
                found = RemoteKeys(location, cooldown_s, refresh_s, timeout_s)
            else:
                found = FileKeys(unquote(urlsplit(location).path) if scheme == "file" else location)
            if len(_sets) >= MAX_KEY_SETS:
                _sets.pop(next(iter(_sets)))
            _sets[settings] = found
        return found
