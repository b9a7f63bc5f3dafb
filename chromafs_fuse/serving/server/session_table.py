"""The mount server's sessions and class mounts: who is bound to what, and until when (no I/O:
state_journal.py keeps the table on disk).

A *class mount* serves one (site, backend, mount options, visibility key): every reader with
that key may read exactly the same pages, so their sessions share it. A *session* is one
read-only bind of a class mount on the caller's mountpoint, with the token's subject and
expiry. A class with no session left is unmounted once it has been idle for a while.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chromafs_fuse.access import Principal, visibility_key


def class_key(mount_settings: Mapping[str, object], principal: Principal) -> str:
    """The class a session belongs to: equal keys, equal mounts. Every setting that shapes
    what a mount serves is in `mount_settings`; the reader counts only by what it may see."""
    authenticated, groups = visibility_key(principal)
    material = json.dumps(
        {"settings": mount_settings, "authenticated": authenticated, "groups": sorted(groups)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:24]


@dataclass
class ClassMount:
    key: str
    path: str  # the class mount's mountpoint, in the server's root-only directory
    pid: int  # its daemon
    pid_start: int | None  # with the pid, names the daemon for good
    site: str
    reader: str  # what its readers may see ("anonymous", "groups=a,b")
    device: str  # major:minor of the FUSE mount: a session's bind shows the same
    created: float
    idle_since: float | None = None  # when its last session ended (None: in use)
    # what serves it again when its serving process dies: the session's MountConfig.to_dict()
    # and the reader class [authenticated, groups] (None in a state file from before they were kept)
    config: dict[str, Any] | None = None
    reader_class: list[Any] | None = None


@dataclass
class Session:
    mountpoint: str
    class_key: str
    subject: str | None
    reader: str
    started: float
    expires_at: float | None
    uid: int
    gid: int = 0
    allow_other: bool = False
    source: str = ""  # its own directory in the serving process's mount, which it binds
    token_id: str | None = None  # the token's `jti` and `iat`: what a revocation names
    issued_at: float | None = None


@dataclass
class SessionTable:
    classes: dict[str, ClassMount] = field(default_factory=dict)
    sessions: dict[str, Session] = field(default_factory=dict)  # by mountpoint
    binds: int = 0  # sessions opened since the server started
    expiries: int = 0  # sessions ended by their token's expiry
    ended: int = 0  # sessions ended by an unmount
    # sessions added, changed or removed since the journal last saved (it writes only those: a
    # request's cost must not grow with the sessions on the host)
    changed: set[str] = field(default_factory=set, compare=False, repr=False)

    def add(self, session: Session) -> None:
        self.sessions[session.mountpoint] = session
        self.classes[session.class_key].idle_since = None
        self.binds += 1
        self.changed.add(session.mountpoint)

    def touch(self, session: Session) -> None:
        """`session` changed (a field set after it was added): the journal writes it again."""
        self.changed.add(session.mountpoint)

    def remove(self, mountpoint: str, now: float) -> Session | None:
        self.changed.add(mountpoint)
        session = self.sessions.pop(mountpoint, None)
        if session is not None and not self.sessions_of(session.class_key):
            mount = self.classes.get(session.class_key)
            if mount is not None:
                mount.idle_since = now
        return session

    def sessions_of(self, key: str) -> list[Session]:
        return [s for s in self.sessions.values() if s.class_key == key]

    def expired(self, now: float) -> list[Session]:
        return [s for s in self.sessions.values() if s.expires_at is not None and s.expires_at <= now]

    def idle(self, now: float, idle_s: float) -> list[ClassMount]:
        return [c for c in self.classes.values() if c.idle_since is not None and now - c.idle_since >= idle_s]

    def drop_class(self, key: str) -> list[Session]:
        """Forget a class mount; returns its sessions, which the caller must detach."""
        self.classes.pop(key, None)
        orphans = self.sessions_of(key)
        for session in orphans:
            del self.sessions[session.mountpoint]
            self.changed.add(session.mountpoint)
        return orphans
