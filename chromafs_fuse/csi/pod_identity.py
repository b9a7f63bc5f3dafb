"""Pods that sign in as themselves (--sa-jwks-url, --sa-issuer, --sa-audience, --sa-readers): the
pod's service-account token kubelet hands over (CSIDriver.spec.tokenRequests), verified with the
cluster's keys, issuer and chromafs's audience, its account mapped to a reader by the operator's
mapping file (a ConfigMap, read again when it changes). The mapping itself: pod_readers.py.

Each refusal is a VolumeError: a token that is missing for the audience, forged, expired, of
another issuer or audience, or no service account's is UNAUTHENTICATED (who holds it is not known);
an account the mapping gives no reader of the site is PERMISSION_DENIED (known, not allowed); keys
that cannot be had now are UNAVAILABLE (kubelet asks again); a mapping that cannot be read is
FAILED_PRECONDITION (the operator's to fix; nothing is served from a mapping read half).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from chromafs_fuse.access import Principal
from chromafs_fuse.csi.volume import VolumeError
from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import POD_OPTIONS, absolute, find
from chromafs_fuse.pod_readers import (
    POD_NAMESPACE_ATTRIBUTE,
    MappingError,
    NotMapped,
    PodTokenError,
    ReaderMap,
    parse_map,
    pod_reader,
    pod_token,
)
from chromafs_fuse.tokens import KeysUnavailable, TokenError, TokenRules, verified_claims

MAX_MAP_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB


@dataclass(frozen=True)
class PodKeys:
    """The flags of options.POD_OPTIONS: all four, or none (pods do not sign in)."""

    jwks_url: str
    issuer: str
    audience: str
    readers: str  # the mapping file's absolute path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PodKeys | None:
        values: dict[str, str] = {o.dest: getattr(args, o.dest, None) or "" for o in POD_OPTIONS}
        given = [o.name for o in POD_OPTIONS if values[o.dest]]
        if not given:
            return None
        if len(given) != len(POD_OPTIONS):
            missing = [o.name for o in POD_OPTIONS if not values[o.dest]]
            raise UsageError(f"pods sign in with all of {', '.join(o.name for o in POD_OPTIONS)}: "
                             f"{', '.join(missing)} missing")  # fmt: skip
        return cls(
            absolute(find("--sa-jwks-url", POD_OPTIONS), values["sa_jwks_url"]),
            values["sa_issuer"],
            values["sa_audience"],
            absolute(find("--sa-readers", POD_OPTIONS), values["sa_readers"]),
        )


class MappingFile:
    """The operator's mapping, read again when its file changes (its inode, size or modification
    time: a ConfigMap's update swaps a symlink, a new inode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._map: ReaderMap | None = None

    def current(self) -> ReaderMap:
        """The mapping; MappingError when the file cannot be read or is not a mapping (never the
        one read before: a mapping being fixed grants nothing meanwhile)."""
        with self._lock:
            try:
                st = os.stat(self.path)
                seen = (st.st_ino, st.st_mtime_ns, st.st_size)
                if self._map is None or self._seen != seen:
                    self._map, self._seen = None, None
                    if st.st_size > MAX_MAP_BYTES:
                        raise MappingError(f"{self.path} is larger than {MAX_MAP_BYTES} bytes")
                    with open(self.path, "rb") as f:
                        text = f.read(MAX_MAP_BYTES + 1).decode("utf-8", "replace")
                    self._map, self._seen = parse_map(text, self.path), seen
            except OSError as exc:
                raise MappingError(f"cannot read the service-account mapping {self.path}: {exc.strerror}") from exc
            return self._map


@dataclass(frozen=True)
class PodSignIn:
    keys: PodKeys
    mapping: MappingFile = dataclasses.field(compare=False)
    cooldown_s: float = 10.0  # the JWKS's refetch on an unknown kid, and its schedule (--jwks-*)
    refresh_s: float = 300.0

    @classmethod
    def of(cls, keys: PodKeys, cooldown_s: float, refresh_s: float) -> PodSignIn:
        return cls(keys, MappingFile(keys.readers), cooldown_s, refresh_s)

    def check(self) -> int:
        """At start: the mapping's entries (VolumeError when it cannot be read)."""
        try:
            return len(self.mapping.current())
        except MappingError as exc:
            raise VolumeError("FAILED_PRECONDITION", str(exc)) from exc

    def token(self, attributes: Mapping[str, str]) -> str | None:
        """The pod's token for chromafs's audience, None when kubelet handed over none at all."""
        try:
            return pod_token(attributes, self.keys.audience)
        except PodTokenError as exc:
            raise VolumeError("UNAUTHENTICATED", str(exc)) from exc

    def reader(self, token: str, site: str, attributes: Mapping[str, str], timeout_s: float) -> Principal:
        """The reader of `site` the pod's token maps to (blocking: the cluster's keys may be fetched)."""
        from chromafs_fuse.backends.jwks import jwks_keys

        rules = TokenRules(
            self.keys.issuer,
            self.keys.audience,
            issuer_flag="--sa-issuer",
            audience_flag="--sa-audience",
            keys_flags="--sa-jwks-url (the cluster's keys)",
        )
        try:
            keys = jwks_keys(self.keys.jwks_url, self.cooldown_s, self.refresh_s, timeout_s)
            claims = verified_claims(token, keys, rules)
            readers = self.mapping.current()
            return pod_reader(claims, site, readers, attributes.get(POD_NAMESPACE_ATTRIBUTE))
        except KeysUnavailable as exc:
            raise VolumeError("UNAVAILABLE", f"the pod's service-account token: {exc}") from exc
        except MappingError as exc:
            raise VolumeError("FAILED_PRECONDITION", str(exc)) from exc
        except NotMapped as exc:
            raise VolumeError("PERMISSION_DENIED", str(exc)) from exc
        except (TokenError, PodTokenError) as exc:
            raise VolumeError("UNAUTHENTICATED", f"the pod's service-account token: {exc}") from exc
