"""What a NodePublishVolume asks for, checked and turned into a mount server request; no gRPC.

A pod's inline volume names its site and backends in `volumeAttributes` (each one a
`chromafs-mount` flag without its dashes, from an allowed list: servers only, never a path on
the node) and its reader in a Secret (`token`), or the pod signs in with its service-account
token (csi/pod_identity.py). Kubelet adds `csi.storage.k8s.io/*` attributes
(the pod's name, namespace, uid, service account, `ephemeral`): they are read, never passed on.
Each refusal is a `VolumeError` with the gRPC status code it gets and a message that says what
to change.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig, TokenKeys, mount_settings
from chromafs_fuse.errors import Refused, UsageError
from chromafs_fuse.options import request_values
from chromafs_fuse.serving.server.session_table import class_key
from chromafs_fuse.serving.status import session_status_path
from chromafs_fuse.token_source import load_token_key
from chromafs_fuse.tokens import KeysUnavailable, TokenError, TokenNotForSite, TokenRules, principal_from_token

if TYPE_CHECKING:
    from chromafs_fuse.csi.pod_identity import PodSignIn

KUBELET_PREFIX = "csi.storage.k8s.io/"
# volumeAttributes a pod may set: the site and where its backends answer, and how a session reads
# them. Not chroma-path, redis-ca, cache sizes or log files: those name the node's own files.
ATTRIBUTES = (
    "site",
    "chroma-url",
    "collection",
    "chroma-tenant",
    "chroma-database",
    "page-field",
    "chunk-index-field",
    "chunk-joiner",
    "backend-timeout",
    "s3-endpoint-url",
    "redis-url",
    "redis-prefix",
    "redis-ttl",
    "tree-ttl",
    "cache-timeout",
    "isolated",  # "true": the session gets a daemon of its own, which ends at the token's expiry
)
SWITCHES = ("isolated",)
# a pod's containers run as any user: its session (a class session's directories, an isolated
# daemon's mount) is open to every user who reaches the target, which kubelet keeps to the pod
POD_FUSE_OPTIONS = ["allow_other"]
# VolumeCapability.AccessMode.Mode values (csi.proto); kubelet asks SINGLE_NODE_WRITER (ReadWriteOnce)
# with readonly set for an inline volume with `readOnly: true`, so the readonly flag decides "writable"
READ_ONLY_MODES = {1, 2, 3}  # SINGLE_NODE_WRITER (with readonly), SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY
MODE_NAMES = {
    4: "MULTI_NODE_SINGLE_WRITER",
    5: "MULTI_NODE_MULTI_WRITER",
    6: "SINGLE_NODE_SINGLE_WRITER",
    7: "SINGLE_NODE_MULTI_WRITER",
}


class VolumeError(Refused):
    """A request refused: `code` is the gRPC status code's name, the message is for the pod's events."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PublishRequest:
    """The parts of a NodePublishVolumeRequest this plugin reads."""

    volume_id: str
    target_path: str
    readonly: bool
    access_mode: int | None  # None: no volume_capability
    block: bool
    attributes: dict[str, str]
    token: str | None


@dataclass(frozen=True)
class Publish:
    """A checked request: the session's options (serving/protocol.py's OpenSession), the token,
    and the session's class."""

    options: dict[str, object]
    token: str | None
    principal: Principal
    class_key: str
    backend_timeout_s: float
    pod: bool = False  # the reader is the pod's service account's (verified here: pod_identity.py)


Keys = TokenKeys  # the plugin's token keys; `options()`, the mount server's options for them


def check_target(volume_id: str, target_path: str) -> None:
    if not volume_id:
        raise VolumeError("INVALID_ARGUMENT", "volume_id is empty")
    if not target_path or not os.path.isabs(target_path):
        raise VolumeError("INVALID_ARGUMENT", f"target_path must be an absolute path, got {target_path!r}")


def check_access(request: PublishRequest) -> None:
    if request.access_mode is None:
        raise VolumeError("INVALID_ARGUMENT", "volume_capability is missing")
    if request.block:
        raise VolumeError("INVALID_ARGUMENT", "the docs are a filesystem: ask for a mount volume, not a block one")
    if request.access_mode in MODE_NAMES:
        name = MODE_NAMES[request.access_mode]
        raise VolumeError("INVALID_ARGUMENT", f"the docs are read-only: access mode {name} is not offered")
    if request.access_mode not in READ_ONLY_MODES:
        raise VolumeError("INVALID_ARGUMENT", "the volume's access mode is unknown: ask for a read-only one")
    if not request.readonly:
        raise VolumeError("INVALID_ARGUMENT", "the docs are read-only: set `readOnly: true` on the pod's csi volume")


def mount_options(request: PublishRequest) -> dict[str, object]:
    """The session's options for the volume's attributes, as a request to the mount server
    carries them (each attribute a chromafs-mount flag)."""
    attributes = {k: v for k, v in request.attributes.items() if not k.startswith(KUBELET_PREFIX)}
    unknown = sorted(set(attributes) - set(ATTRIBUTES))
    if unknown:
        allowed = ", ".join(ATTRIBUTES)
        raise VolumeError("INVALID_ARGUMENT", f"unknown volumeAttributes {', '.join(unknown)}; allowed: {allowed}")
    if not attributes.get("site"):
        raise VolumeError("INVALID_ARGUMENT", "volumeAttributes has no `site`: name the docs site to mount")
    if not attributes.get("chroma-url"):
        raise VolumeError("INVALID_ARGUMENT", "volumeAttributes has no `chroma-url`: give the Chroma server's URL")
    options: dict[str, object] = {}
    for name in ATTRIBUTES:
        value = attributes.get(name)
        if value is None:
            continue
        if name in SWITCHES:
            if value not in ("true", "false"):
                raise VolumeError("INVALID_ARGUMENT", f'volumeAttributes: {name} is "true" or "false", not {value!r}')
            options[f"--{name}"] = value == "true"
        else:
            options[f"--{name}"] = value
    options["-o"] = list(POD_FUSE_OPTIONS)
    return options


def reader(token: str | None, site: str, keys: Keys, timeout_s: float) -> Principal:
    """The token's reader, checked here as the mount server checks it, so that a refusal has its
    own code and nothing is asked of the server."""
    try:
        key = load_token_key(keys, timeout_s)
    except TokenError as exc:
        raise VolumeError("FAILED_PRECONDITION", f"chromafs-csi cannot read its token key: {exc}") from exc
    if token and key is None:
        raise VolumeError(
            "FAILED_PRECONDITION",
            "a token was given but chromafs-csi has no --jwt-secret-file, --jwt-public-key or --jwks-url",
        )
    try:
        return principal_from_token(token, key, site, TokenRules(keys.issuer, keys.audience))
    except TokenNotForSite as exc:
        raise VolumeError("PERMISSION_DENIED", f"{exc} ({site}): use a token issued for this site") from exc
    except KeysUnavailable as exc:  # the provider's keys cannot be had now: kubelet asks again
        raise VolumeError("UNAVAILABLE", str(exc)) from exc
    except TokenError as exc:
        raise VolumeError("UNAUTHENTICATED", f"{exc}: put a valid token in the volume's Secret (key `token`)") from exc


def prepare(request: PublishRequest, keys: Keys, pods: PodSignIn | None = None) -> Publish:
    """The request checked (VolumeError when it cannot be served) and its mount server request.
    The reader: the token in the volume's Secret when there is one; else, when pods sign in
    (`pods`), the pod's service-account token kubelet handed over; else anonymous."""
    check_target(request.volume_id, request.target_path)
    check_access(request)
    options = {**mount_options(request), **keys.options()}
    token = request.token.strip() if request.token else None
    pod_token = pods.token(request.attributes) if pods is not None and not token else None
    try:  # read as the mount server reads it
        flags = SimpleNamespace(**request_values(options), mountpoint=request.target_path)
        config = MountConfig.from_args(flags)
    except (UsageError, ValueError) as exc:
        raise VolumeError("INVALID_ARGUMENT", f"volumeAttributes: {exc}") from exc
    if pod_token is not None and flags.isolated:
        raise VolumeError(
            "INVALID_ARGUMENT",
            "a pod signed in with its service account is served as a class session: drop `isolated` "
            "(or give the pod a token in a Secret)",
        )
    try:
        if pods is not None and pod_token is not None:
            attributes = request.attributes
            principal = pods.reader(pod_token, config.site, attributes, config.session.backend_timeout_s)
        else:
            principal = reader(token or None, config.site, keys, config.session.backend_timeout_s)
    except VolumeError as exc:
        from chromafs_fuse.site.loader import missing_site  # the site's backends: only on this path

        missing = missing_site(config.session) if exc.code == "PERMISSION_DENIED" else None
        if missing is not None:  # a site that does not exist: that is the problem, not the token
            raise VolumeError("NOT_FOUND", str(missing)) from exc
        raise
    key = class_key(mount_settings(config), principal)
    return Publish(options, token or None, principal, key, config.session.backend_timeout_s, pod_token is not None)


def session_class(target_path: str) -> str | None:
    """The reader class of the mount server's session at `target_path` (its status file), or None
    when the server left no status this plugin can read."""
    path = session_status_path(target_path)
    if not path:
        return None
    try:
        with open(path) as f:
            status = json.load(f)
        return str(status["session"]["class"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
