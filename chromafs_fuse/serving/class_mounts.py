"""The mount server's shared mounts: one live mount per class, a read-only bind per session.

Where a class is served is its `ClassHost`'s business: `ProcessHost` starts a daemon per class
(a FUSE mount of its own, `--class-mode process`), serving/shared_host.py's `SharedHost` adds a
view to the one shared mount (`--class-mode shared`, issue 30). `SessionKeeper` opens a session
by binding its class's directory (the class started first if it has none) on the caller's
mountpoint, and its `housekeep`, called every half second by the
server (never on a request's path), ends sessions whose token expired (the bind is detached), notices sessions their
users unmounted, drops class mounts whose daemon died (detaching their binds) and stops
class mounts idle for `idle_s`. Everything is saved in a state file in the root-only class
directory, so a restarted server finds its class mounts and sessions and carries on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig
from chromafs_fuse.serving.binds import bind_read_only, detach, mounted_devices
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.sessions import ClassMount, Session, class_key
from chromafs_fuse.serving.state_journal import StateJournal
from chromafs_fuse.serving.status import runtime_dir, utc_text, write_private_json

log = logging.getLogger("chromafs.mountd")
DEFAULT_CLASS_ROOT = "/run/chromafs/classes"
DEFAULT_IDLE_S = 300.0
DEFAULT_WARM_WAIT_S = 1.0
PER_SESSION_SETTINGS = ("mountpoint", "pid_file", "log_file", "log_level", "log_format", "metrics_addr")


class SessionError(Exception):
    """A session cannot be opened; the message goes back to the caller."""


def mount_settings(config: MountConfig) -> dict[str, object]:
    """Everything that shapes what a mount serves: sessions share a class mount only when all
    of it is equal (the token's verification key is not: the reader is compared instead)."""
    settings = dataclasses.asdict(config)
    for name in PER_SESSION_SETTINGS:
        settings.pop(name)
    for name in ("jwt_secret_file", "jwt_public_key"):
        settings["session"].pop(name)
    return settings


@dataclass
class HostSnapshot:
    """What one pass of the server reads about the host: the mount table once, and each serving
    process's start time once however many classes it serves (a thousand views of one shared
    mount are one /proc read, not a thousand)."""

    devices: dict[str, str]
    _starts: dict[int, int | None] = field(default_factory=dict)

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(mounted_devices())

    def started(self, pid: int) -> int | None:
        """`process_start(pid)`, read once per snapshot."""
        if pid not in self._starts:
            self._starts[pid] = process_start(pid)
        return self._starts[pid]

    def runs(self, pid: int, pid_start: int | None) -> bool:
        return self.started(pid) == pid_start


def _device(path: str) -> str:
    dev = os.stat(path).st_dev
    return f"{os.major(dev)}:{os.minor(dev)}"


# (the configuration of the session's request, the class's reader, the class mount's path) -> its daemon's pid
StartClass = Callable[[MountConfig, Principal, str], int]


class ClassHost(Protocol):
    """Where classes are served. Every call blocks (the server's loop is synchronous)."""

    def start(self, key: str, config: MountConfig, reader: Principal, host: HostSnapshot) -> ClassMount:
        """Serve the reader class `reader` of the session's site (`host`: read just before);
        SessionError when it cannot be."""
        ...

    def adopt(self, mount: ClassMount) -> None:
        """A class a previous server started that still stands (after a restart)."""
        ...

    def stop(self, mount: ClassMount) -> None:
        """An idle class: stop serving it."""
        ...

    def alive(self, mount: ClassMount, host: HostSnapshot) -> bool:
        """Whether the class is still served."""
        ...

    def drop(self, mount: ClassMount) -> None:
        """A class found dead: unmount what is left of it."""
        ...

    def owns(self, path: str) -> bool:
        """A mount in the class root that is the host's own, not a class mount state may name."""
        ...


class ProcessHost:
    """A daemon and a FUSE mount per class, at `<root>/<class key>`."""

    def __init__(self, root: str, start_class: StartClass) -> None:
        self.root = root
        self.start_class = start_class

    def start(self, key: str, config: MountConfig, reader: Principal, host: HostSnapshot) -> ClassMount:
        path = os.path.join(self.root, key)
        if path in host.devices:
            detach(path)  # a class mount no state names (the state was lost): it drains
        os.makedirs(path, mode=0o755, exist_ok=True)
        pid = self.start_class(config, reader, path)
        return ClassMount(
            key, path, pid, process_start(pid), config.site, reader.describe(), _device(path), time.time()
        )

    def adopt(self, mount: ClassMount) -> None:
        pass  # a daemon of its own: nothing to place

    def stop(self, mount: ClassMount) -> None:
        if process_start(mount.pid) == mount.pid_start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(mount.pid, signal.SIGTERM)  # it unmounts itself
        else:
            detach(mount.path)

    def alive(self, mount: ClassMount, host: HostSnapshot) -> bool:
        return host.runs(mount.pid, mount.pid_start) and host.devices.get(mount.path) == mount.device

    def drop(self, mount: ClassMount) -> None:
        detach(mount.path)

    def owns(self, path: str) -> bool:
        return False


class SessionKeeper:
    def __init__(self, root: str, idle_s: float, host: ClassHost) -> None:
        self.root = root
        self.idle_s = idle_s
        self.host = host
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.chmod(root, 0o700)  # class mounts are reached through session binds only
        self.state_path = os.path.join(root, "state.json")
        self.journal = StateJournal(self.state_path)
        self.table = self.journal.load()
        self.recover()

    # -- sessions ---------------------------------------------------------------------

    def open_session(self, config: MountConfig, principal: Principal, uid: int) -> Session:
        """Bind the reader's class mount on the session's mountpoint (blocking: the first
        session of a class waits for its mount to be ready)."""
        started = time.perf_counter()
        mountpoint = config.mountpoint
        host = HostSnapshot.take()
        if mountpoint in host.devices:
            raise SessionError(f"{mountpoint} is already mounted")
        stale = self.table.sessions.get(mountpoint)
        if stale is not None:  # unmounted by its user since the last housekeeping pass
            self._end(stale, time.time())
            self.table.ended += 1
        key = class_key(mount_settings(config), principal)
        mount = self.table.classes.get(key)
        if mount is None or not self.host.alive(mount, host):
            if mount is not None:
                self._drop_class(mount, "its daemon is gone")
            mount = self._start(key, config, principal, host)
        try:
            bind_read_only(mount.path, mountpoint)
        except OSError as exc:
            raise SessionError(f"cannot bind the session on {mountpoint}: {exc.strerror}") from exc
        reader = principal.describe()
        session = Session(mountpoint, key, principal.subject, reader, time.time(), principal.expires_at, uid)
        self.table.add(session)
        self._write_status(session)
        self._save()
        log.info(
            "session on %s: %s, class %s, expires %s (%.1f ms)",
            mountpoint,
            reader,
            key[:12],
            utc_text(principal.expires_at),
            (time.perf_counter() - started) * 1000,
        )
        return session

    def _start(self, key: str, config: MountConfig, principal: Principal, host: HostSnapshot) -> ClassMount:
        started = time.perf_counter()
        mount = self.host.start(key, config, principal.reader_class(), host)
        self.table.classes[key] = mount
        log.info(
            "class mount %s for %s (%s) ready in %.3fs",
            key[:12],
            mount.reader,
            config.site,
            time.perf_counter() - started,
        )
        return mount

    # -- housekeeping -----------------------------------------------------------------

    def housekeep(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        changed = False
        for session in self.table.expired(now):
            # logged before the detach so that whoever sees the mount go also finds the reason
            log.warning("session on %s expired (%s): detaching it", session.mountpoint, session.reader)
            detach(session.mountpoint)
            self._end(session, now)
            self.table.expiries += 1
            changed = True
        host = HostSnapshot.take()
        for mount in list(self.table.classes.values()):
            if not self.host.alive(mount, host):
                self._drop_class(mount, "its daemon is gone")
                changed = True
        for session in list(self.table.sessions.values()):
            mount = self.table.classes[session.class_key]
            if host.devices.get(session.mountpoint) != mount.device:
                self._end(session, now)
                self.table.ended += 1
                log.info("session on %s ended: unmounted", session.mountpoint)
                changed = True
        for mount in self.table.idle(now, self.idle_s):
            log.info("class mount %s idle for %.0fs: stopping it", mount.key[:12], now - (mount.idle_since or now))
            self.host.stop(mount)
            self.table.drop_class(mount.key)
            changed = True
        if changed:
            self._save()

    def recover(self) -> None:
        """After a restart: keep what still stands, drop the rest, and let class mounts no
        state names drain (detached once no bind uses them)."""
        now = time.time()
        host = HostSnapshot.take()
        devices = host.devices
        for mount in list(self.table.classes.values()):
            if not self.host.alive(mount, host):
                self._drop_class(mount, "gone while the server was down")
        for session in list(self.table.sessions.values()):
            if devices.get(session.mountpoint) != self.table.classes[session.class_key].device:
                self.table.remove(session.mountpoint, now)
                self._remove_status(session)
        for mount in self.table.classes.values():
            self.host.adopt(mount)
            if not self.table.sessions_of(mount.key) and mount.idle_since is None:
                mount.idle_since = now
        known = {m.path for m in self.table.classes.values()}
        for path, device in devices.items():
            if os.path.dirname(path) == self.root and path not in known and not self.host.owns(path):
                users = [p for p, d in devices.items() if d == device and p != path]
                if not users:
                    log.info("unmounting %s: a class mount no state names, with no session", path)
                    detach(path)
        for session in self.table.sessions.values():
            self._write_status(session)
        self._save()
        if self.table.classes:
            log.info("carried on %d class mounts and %d sessions", len(self.table.classes), len(self.table.sessions))

    # -- helpers ------------------------------------------------------------------------

    def _end(self, session: Session, now: float) -> None:
        self.table.remove(session.mountpoint, now)
        self._remove_status(session)

    def _drop_class(self, mount: ClassMount, why: str) -> None:
        log.error("class mount %s dropped: %s; detaching its sessions", mount.key[:12], why)
        for session in self.table.drop_class(mount.key):
            detach(session.mountpoint)
            self._remove_status(session)
        self.host.drop(mount)

    def _save(self) -> None:
        try:
            self.journal.save(self.table)
        except OSError as exc:
            log.error("cannot save the session state %s: %s", self.state_path, exc)

    # -- status (chromafs status) --------------------------------------------------------

    def _status_path(self, session: Session) -> str:
        directory = runtime_dir()
        digest = hashlib.sha256(session.mountpoint.encode()).hexdigest()[:16]
        return os.path.join(directory, f"session-{digest}.json") if directory else ""

    def _write_status(self, session: Session) -> None:
        path = self._status_path(session)
        mount = self.table.classes[session.class_key]
        if not path:
            return
        status = {
            "mountpoint": session.mountpoint,
            "site": mount.site,
            "reader": session.reader,
            "pid": mount.pid,  # the class mount's daemon serves the session
            "pid_start": mount.pid_start,
            "started": session.started,
            "expires_at": session.expires_at,
            "session": {"subject": session.subject, "class": mount.key, "class_mount": mount.path},
        }
        with contextlib.suppress(OSError):
            write_private_json(path, status)

    def _remove_status(self, session: Session) -> None:
        path = self._status_path(session)
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
