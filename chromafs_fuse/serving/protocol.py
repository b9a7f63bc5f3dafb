"""The messages between chromafs's processes, and their one codec: a JSON object a line.

    mount client, CSI plugin -> mount server (its socket)      OpenSession
    CSI plugin -> mount server (its socket)                   OpenPodSession, RenewSession
    chromafs search -> mount server (its socket)              Search
    chromafs revoke -> mount server (its socket)              Revoke
    mount server -> serving process (its control socket)      AddView, RemoveView, OpenViewSession,
                                                              RenewViewSession, EndViewSession, Describe
    mount server -> its forker (a socketpair; descriptors     ServePoolProcess, ServeIsolated
    passed beside the line)

A request is `{"op": <its name>, <its fields>}`; its answer `{"ok": true, <fields>}` or
`{"ok": false, "kind": <the ChromafsError kind>, "error": <the message>}`, so a refusal keeps its
kind from whichever process made it to whichever front end shows it, and each front end maps
kinds in its one place (errors.py). Fields are checked against their declared types when read:
a line that does not fit is a `BadRequest`. Adding a request is a class here, its entry in the
table of the socket that takes it, and its handler there.

The mount client's fast path writes OpenSession with an encoder of its own (cli/mount_request.py,
lighter to import than this module); tests keep the two equal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from chromafs_fuse.errors import UsageError, error_of, kind_of, user_message
from chromafs_fuse.serving.handshake import OK_LINE

if TYPE_CHECKING:  # `chromafs search` imports this module: the access core (orjson, hashlib) when used
    from chromafs_fuse.access import Principal

MAX_LINE_BYTES = 256 * 1024


class BadRequest(UsageError):
    """A line that is not a request of this socket, or whose fields do not fit."""


@dataclass(frozen=True)
class Request:
    op: ClassVar[str] = ""


# -- the mount server's socket ------------------------------------------------------------------


@dataclass(frozen=True)
class OpenSession(Request):
    """A session at `mountpoint` (absolute) for the holder of `token` (None: anonymous), with
    chromafs-mount's options as its client resolved them: flag -> value (options.request_values),
    paths absolute, the caller's environment applied."""

    op: ClassVar[str] = "open_session"
    mountpoint: str
    options: dict[str, Any]
    token: str | None = None


@dataclass(frozen=True)
class OpenPodSession(Request):
    """A session at `mountpoint` for a reader its caller verified (`reader`: reader_fields), not
    for a token: a pod's service-account token, which chromafs-csi verified with the cluster's keys
    and mapped to a reader (pod_readers.py). Honoured only from root or the server's own user,
    as every request is (they also choose the keys a token is verified with); served as a class
    session only (an --isolated daemon verifies a token itself)."""

    op: ClassVar[str] = "open_pod_session"
    mountpoint: str
    options: dict[str, Any]
    reader: dict[str, Any]


@dataclass(frozen=True)
class RenewSession(Request):
    """The session at `mountpoint` lasts until the `expires_at` of `reader` (reader_fields), a
    later token of the same reader (kubelet's republish): it must be live, not revoked, and of
    the class these `options` and reader make. Answered `{"ok": true, "expires_at": ...}`."""

    op: ClassVar[str] = "renew_session"
    mountpoint: str
    options: dict[str, Any]
    reader: dict[str, Any]


@dataclass(frozen=True)
class Search(Request):
    """`chromafs search` answered warm: the `limit` pages of the site that best match `query` for
    the holder of `token`, with the session options as its client resolved them (OpenSession's,
    without a mountpoint). Answered `{"ok": true, "records": [...], "lines": [...], "mode",
    "embedder", "notes"}`: each hit as `--json` and as the command print it."""

    op: ClassVar[str] = "search"
    options: dict[str, Any]
    query: str
    limit: int
    token: str | None = None
    embedder: str | None = None
    rank: str = "hybrid"


@dataclass(frozen=True)
class Revoke(Request):
    """`chromafs revoke` without Redis: the tokens of `site` whose `kind` ("sub" or "jti") is
    `name` are revoked for `for_s` seconds (revocation.py), kept in the server's state; its
    sessions they cover end. Answered `{"ok": true, "ended": <sessions ended>}`."""

    op: ClassVar[str] = "revoke"
    site: str
    kind: str
    name: str
    for_s: float


MOUNT_SERVER_REQUESTS: dict[str, type[Request]] = {
    cls.op: cls for cls in (OpenSession, OpenPodSession, RenewSession, Search, Revoke)
}


def reader_fields(principal: Principal) -> dict[str, Any]:
    """A verified reader as OpenPodSession and RenewSession carry it."""
    return {
        "groups": sorted(principal.groups),
        "subject": principal.subject,
        "expires_at": principal.expires_at,
        "token_id": principal.token_id,
        "issued_at": principal.issued_at,
    }


def reader_principal(fields: Mapping[str, Any]) -> Principal:
    """The reader reader_fields wrote; BadRequest when the fields do not fit. It has an expiry: a
    reader that never ends is not taken on a caller's word."""
    groups: Any = fields.get("groups")
    expires_at: Any = fields.get("expires_at")
    subject, token_id, issued_at = fields.get("subject"), fields.get("token_id"), fields.get("issued_at")
    if (
        set(fields) != {"groups", "subject", "expires_at", "token_id", "issued_at"}
        or not _fits(groups, "list[str]")
        or not _fits(subject, "str | None")
        or not _fits(expires_at, "float")
        or not _fits(token_id, "str | None")
        or not _fits(issued_at, "float | None")
    ):
        raise BadRequest("bad request: a reader is groups, subject, expires_at, token_id and issued_at")
    from chromafs_fuse.access import Principal

    return Principal.of(groups, subject, float(expires_at), token_id, None if issued_at is None else float(issued_at))


# -- a serving process's control socket ------------------------------------------------------


@dataclass(frozen=True)
class AddView(Request):
    """Serve a reader class of a site (MountConfig.to_dict()); answered with its `path`."""

    op: ClassVar[str] = "add"
    config: dict[str, Any]
    authenticated: bool
    groups: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RemoveView(Request):
    """Stop serving the view at `path`; answered with `site_gone` (its site's last view)."""

    op: ClassVar[str] = "remove"
    path: str


@dataclass(frozen=True)
class RenewViewSession(Request):
    """The session at `path` (`.sessions/<slot>`) expires at `expires_at` from now on; answered
    with `renewed` (false: it had ended)."""

    op: ClassVar[str] = "renew_session"
    path: str
    expires_at: float


@dataclass(frozen=True)
class OpenViewSession(Request):
    """A session's own directory in the view at `path`; answered with its `path`."""

    op: ClassVar[str] = "session"
    path: str
    uid: int
    gid: int
    expires_at: float | None = None
    allow_other: bool = False


@dataclass(frozen=True)
class EndViewSession(Request):
    """The session at `path` ended: refused from now on."""

    op: ClassVar[str] = "end_session"
    path: str


@dataclass(frozen=True)
class Describe(Request):
    """The process's status (`pid`, `views`, ...)."""

    op: ClassVar[str] = "describe"


CONTROL_REQUESTS: dict[str, type[Request]] = {
    cls.op: cls for cls in (AddView, RemoveView, OpenViewSession, RenewViewSession, EndViewSession, Describe)
}


# -- the forker --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServePoolProcess(Request):
    """Fork the `index`-th serving process of the pool in `class_root`."""

    op: ClassVar[str] = "serve_pool_process"
    class_root: str
    index: int
    cache_bytes: int
    idle_exit_s: float


@dataclass(frozen=True)
class ServeIsolated(Request):
    """Fork an `--isolated` session's own daemon (MountConfig.to_dict()) for `token`."""

    op: ClassVar[str] = "serve_isolated"
    config: dict[str, Any]
    token: str | None = None


FORKER_JOBS: dict[str, type[Request]] = {cls.op: cls for cls in (ServePoolProcess, ServeIsolated)}


# -- the codec ---------------------------------------------------------------------------------


def encode(request: Request) -> bytes:
    """`request` as its line."""
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    return json.dumps({"op": request.op, **fields}).encode() + b"\n"


R = TypeVar("R", bound=Request)


def decode(line: bytes | str, table: Mapping[str, type[R]]) -> R:
    """The request a line carries, one of `table`'s; BadRequest when it is none or does not fit."""
    try:
        data = json.loads(line)
    except ValueError:
        raise BadRequest("bad request: not a JSON line") from None
    if not isinstance(data, dict):
        raise BadRequest("bad request: not a JSON object")
    op = data.pop("op", None)
    cls = table.get(op) if isinstance(op, str) else None
    if cls is None:
        raise BadRequest(f"bad request: unknown op {op!r}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            value = data.pop(f.name)
            if not _fits(value, str(f.type)):
                raise BadRequest(f"bad request: {op}.{f.name} is not {f.type}")
            values[f.name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BadRequest(f"bad request: {op} without {f.name}")
    if data:
        raise BadRequest(f"bad request: {op} has no field {sorted(data)[0]!r}")
    return cls(**values)


def _fits(value: object, annotation: str) -> bool:
    """Whether a JSON value fits a field's declared type (the few this module uses)."""
    kinds = [a.strip() for a in annotation.split("|")]
    if value is None:
        return "None" in kinds
    for kind in kinds:
        if kind == "str" and isinstance(value, str):
            return True
        if kind == "bool" and isinstance(value, bool):
            return True
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind == "list[str]" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return True
        if kind == "dict[str, Any]" and isinstance(value, dict):
            return True
    return False


# -- answers -----------------------------------------------------------------------------------


def ok_line(**fields: Any) -> bytes:
    return OK_LINE if not fields else json.dumps({"ok": True, **fields}).encode() + b"\n"


def error_answer(exc: BaseException) -> dict[str, Any]:
    """A failure as an answer: its kind and its message for the user (never a traceback)."""
    return {"ok": False, "kind": kind_of(exc), "error": user_message(exc)}


def error_line(exc: BaseException) -> bytes:
    return json.dumps(error_answer(exc)).encode() + b"\n"


def answer_of(line: bytes | str) -> dict[str, Any]:
    """An answer's fields when it says ok; else its error raised as its kind (a ChromafsError)."""
    try:
        answer = json.loads(line)
    except ValueError:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        raise error_of("internal", text.strip() or "no answer") from None
    if not isinstance(answer, dict):
        raise error_of("internal", "an answer that is not a JSON object")
    if answer.get("ok"):
        return answer
    raise error_of(str(answer.get("kind") or "internal"), str(answer.get("error") or "no reason given"))
