"""The mount server's sessions: one view per reader class, a read-only bind per session.

Where a class is served is its `ClassHost`'s business (serving/server/pool.py's `ServingPool`: a
directory of one of the pool's serving processes). `SessionKeeper` opens a session by binding
its class's directory (the class served first if it is not) on the caller's mountpoint. It is
called from many request threads at once: the table is guarded by one lock held only for
bookkeeping and binds, never while a class is being served (a backend may take seconds), and
the requests of one class wait for the one that serves it.

`housekeep`, on the server's own clock (never on a request's path), ends sessions whose token
expired (the bind is detached), notices sessions their users unmounted, stops classes idle for
`idle_s`, and heals: a class whose serving process died is served again by a new process and
every session of it bound again at its own path, each class on a thread of its own. Everything
is saved in a state journal in the root-only class directory, so a restarted server finds its
classes and sessions and carries on.

The keeper itself does no I/O but its journal's: the host's mount table, binds and processes are
its `Kernel`, the status files its `StatusBoard`, the time its clock, and a heal runs where its
`RunHeal` puts it (host_kernel.py holds the real ones; tests/unit/test_session_simulation.py
drives it on a simulated host).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig, mount_settings
from chromafs_fuse.errors import Refused
from chromafs_fuse.serving.server.host_kernel import HOST_KERNEL, StatusFiles, heal_in_thread
from chromafs_fuse.serving.server.session_table import ClassMount, Session, SessionTable, class_key
from chromafs_fuse.serving.server.state_journal import StateJournal
from chromafs_fuse.serving.status import utc_text

log = logging.getLogger("chromafs.mountd")


class SessionError(Refused):
    """A session cannot be opened; the message goes back to the caller."""


class Kernel(Protocol):
    """The host's mount table and processes, as the keeper reads and changes them."""

    def private_directory(self, path: str) -> None:
        """Create `path` (the class root), readable by root only."""
        ...

    def mounted_devices(self) -> dict[str, str]:
        """Mountpoint -> the device mounted there, the topmost mount's (serving/binds.py)."""
        ...

    def device_at(self, path: str) -> str | None:
        """`mounted_devices().get(path)`, asked for one path (a request's cost must not grow
        with the mounts on the host)."""
        ...

    def process_start(self, pid: int) -> int | None:
        """When `pid` started (None: no such process); with the pid, names a process for good."""
        ...

    def bind_read_only(self, source: str, target: str) -> None:
        """A read-only bind of `source` on `target`; OSError when it cannot be."""
        ...

    def replace_bind(self, source: str, target: str) -> None:
        """A read-only bind of `source` in place of the mount at `target`; OSError (ENOENT when
        nothing is mounted there any more) when it cannot be."""
        ...

    def detach(self, target: str) -> bool:
        """Unmount the topmost mount at `target`; False when nothing was mounted there."""
        ...


class StatusBoard(Protocol):
    """Where `chromafs status` finds the sessions (a status file each)."""

    def write(self, mountpoint: str, status: dict[str, Any]) -> None: ...

    def remove(self, mountpoint: str) -> None: ...

    def remove_stale(self, root: str, live: Container[str]) -> None:
        """Forget every session of the class root `root` whose mountpoint is not in `live`."""
        ...


# runs a heal (named, for its thread) in the background: on a thread of its own for real
RunHeal = Callable[[str, Callable[[], None]], None]


@dataclass(frozen=True)
class SessionReader:
    """A session's token, as a revocation is checked against it."""

    mountpoint: str
    site: str
    redis: dict[str, Any] | None  # its site's RedisSettings, as the class's config holds them
    subject: str | None
    token_id: str | None
    issued_at: float | None


@dataclass
class HostSnapshot:
    """What one pass of the server reads about the host: the mount table at most once (read when
    a pass looks at every mount; a request asks about its few paths one by one), and each
    serving process's start time once however many classes it serves (a thousand views of one
    serving process are one /proc read, not a thousand)."""

    kernel: Kernel = HOST_KERNEL
    _devices: dict[str, str] | None = None
    _starts: dict[int, int | None] = field(default_factory=dict)

    @classmethod
    def take(cls, kernel: Kernel = HOST_KERNEL) -> HostSnapshot:
        return cls(kernel)

    @property
    def devices(self) -> dict[str, str]:
        """The whole mount table, read once."""
        if self._devices is None:
            self._devices = self.kernel.mounted_devices()
        return self._devices

    def device_at(self, path: str) -> str | None:
        """The device mounted at `path` (None: nothing), from the table if it was read."""
        return self._devices.get(path) if self._devices is not None else self.kernel.device_at(path)

    def started(self, pid: int) -> int | None:
        """`process_start(pid)`, read once per snapshot."""
        if pid not in self._starts:
            self._starts[pid] = self.kernel.process_start(pid)
        return self._starts[pid]

    def runs(self, pid: int, pid_start: int | None) -> bool:
        return self.started(pid) == pid_start


class ClassHost(Protocol):
    """Where classes are served. Calls may block; `start` on many threads at once."""

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

    def open_session(self, mount: ClassMount, session: Session) -> str:
        """The session's own directory where its class is served (its owner, its expiry): the
        path its bind takes. SessionError when it cannot be had."""
        ...

    def renew_session(self, mount: ClassMount, source: str, expires_at: float) -> None:
        """The session at `source` expires at `expires_at` where its class is served from now
        on; SessionError when it has ended there."""
        ...

    def end_session(self, mount: ClassMount, source: str) -> None:
        """The session at `source` ended: its serving process refuses it from now on."""
        ...

    def owns(self, path: str) -> bool:
        """A mount in the class root that is the host's own (a serving process's mount)."""
        ...


class SessionKeeper:
    def __init__(
        self,
        root: str,
        idle_s: float,
        host: ClassHost,
        kernel: Kernel = HOST_KERNEL,
        statuses: StatusBoard | None = None,
        clock: Callable[[], float] = time.time,
        run_heal: RunHeal = heal_in_thread,
    ) -> None:
        self.root = root
        self.idle_s = idle_s
        self.host = host
        self.kernel = kernel
        self.statuses: StatusBoard = statuses or StatusFiles()
        self.clock = clock
        self.run_heal = run_heal
        kernel.private_directory(root)
        self.state_path = os.path.join(root, "state.json")
        self.journal = StateJournal(self.state_path)
        self.lock = threading.RLock()  # the table, the journal, the binds
        self._class_locks: dict[str, threading.RLock] = {}  # one start (or heal) of a class at a time
        self._opening: set[str] = set()  # mountpoints a request is binding now
        self._healing: set[str] = set()  # class keys being served again after their process died
        self._ended: list[tuple[ClassMount, str]] = []  # sessions ended, their serving process not told yet
        self._revoked: set[str] = set()  # mountpoints of sessions whose expiry a revocation brought forward
        self.table = self.journal.load()
        self.recover()

    # -- sessions ---------------------------------------------------------------------

    def open_session(self, config: MountConfig, principal: Principal, uid: int, gid: int = 0) -> Session:
        """Bind the reader's class on the session's mountpoint (the first session of a class
        waits for it to be served; sessions of other classes never wait for that)."""
        started = time.perf_counter()
        mountpoint = config.mountpoint
        with self.lock:
            if mountpoint in self._opening:
                raise SessionError(f"{mountpoint} is already being mounted")
            self._opening.add(mountpoint)
        try:
            return self._open(config, principal, uid, gid, started)
        finally:
            with self.lock:
                self._opening.discard(mountpoint)
            self._tell_ended()

    def _open(self, config: MountConfig, principal: Principal, uid: int, gid: int, started: float) -> Session:
        mountpoint = config.mountpoint
        key = class_key(mount_settings(config), principal)
        host = self._snapshot()
        if host.device_at(mountpoint) is not None:
            raise SessionError(f"{mountpoint} is already mounted")
        mount = self._class(key, config, principal, host)
        reader = principal.describe()
        session = Session(
            mountpoint,
            key,
            principal.subject,
            reader,
            self.clock(),
            principal.expires_at,
            uid,
            gid,
            allow_other="allow_other" in config.fuse_options,
            token_id=principal.token_id,
            issued_at=principal.issued_at,
        )
        try:
            session.source = self.host.open_session(mount, session)
        except SessionError:
            with self.lock:
                self._not_opened(mount)
            raise
        with self.lock:
            stale = self.table.sessions.get(mountpoint)
            if stale is not None:  # unmounted by its user since the last housekeeping pass
                self._end(stale, self.clock())
                self.table.ended += 1
            if self.table.classes.get(key) is not mount:
                self._ended.append((mount, session.source))
                self._save()
                raise SessionError("the reader's class went away while the session opened: try again")
            try:
                self.kernel.bind_read_only(session.source, mountpoint)
            except OSError as exc:
                self._ended.append((mount, session.source))
                self._not_opened(mount)
                raise SessionError(f"cannot bind the session on {mountpoint}: {exc.strerror}") from exc
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

    def renew(self, config: MountConfig, principal: Principal) -> float | None:
        """The session at the config's mountpoint lasts until `principal`'s expiry, a later token
        of its reader (kubelet's republish): its serving process is told first, then the table.
        SessionError when there is no live session there (ended, expired, revoked: a revoked
        session is never renewed) or it is another reader's or class's. The expiry it has now."""
        mountpoint = config.mountpoint
        key = class_key(mount_settings(config), principal)
        with self.lock:
            session = self._renewable(mountpoint)
            if session.class_key != key or session.subject != principal.subject:
                raise SessionError(f"the session on {mountpoint} is another reader's: unpublish it first")
            if principal.expires_at is None or session.expires_at is None or principal.expires_at <= session.expires_at:
                return session.expires_at  # nothing later to renew to
            mount, source = self.table.classes[session.class_key], session.source
        self.host.renew_session(mount, source, principal.expires_at)  # never under the lock: it asks the process
        with self.lock:
            if self._renewable(mountpoint) is not session or session.source != source:
                raise SessionError(f"the session on {mountpoint} ended while it was renewed")
            previous, session.expires_at = session.expires_at, principal.expires_at
            session.token_id, session.issued_at = principal.token_id, principal.issued_at
            self.table.touch(session)
            self._write_status(session)
            self._save()
        log.info("session on %s renewed (%s): expires %s, was %s", mountpoint, session.reader,
                 utc_text(principal.expires_at), utc_text(previous))  # fmt: skip
        return principal.expires_at

    def _renewable(self, mountpoint: str) -> Session:
        session = self.table.sessions.get(mountpoint)
        now = self.clock()
        if (
            session is None
            or mountpoint in self._revoked
            or (session.expires_at is not None and session.expires_at <= now)
            or not session.source
        ):
            raise SessionError(f"no live session on {mountpoint} to renew")
        return session

    def _class(self, key: str, config: MountConfig, principal: Principal, host: HostSnapshot) -> ClassMount:
        """The class's mount, served first if it is not (healed if its process died under its
        sessions); held in use (never idle-stopped) from here."""
        with self._class_lock(key):
            with self.lock:
                mount = self.table.classes.get(key)
                if mount is not None and not self.host.alive(mount, host):
                    host = self._snapshot()  # it may have been served while this request waited
                if mount is not None and self.host.alive(mount, host):
                    mount.idle_since = None  # in use from now: housekeeping must not stop it under us
                    return mount
                heal = mount is not None and self._may_heal(mount)
                if heal:
                    self._healing.add(key)
                elif mount is not None:
                    self._drop_class(mount, "its serving process is gone")
                    self._save()
            if heal:
                assert mount is not None
                self._heal(mount)
                with self.lock:
                    mount = self.table.classes.get(key)
                    if mount is not None:
                        mount.idle_since = None
                        return mount
            mount = self._start(key, config, principal, host)
            with self.lock:
                self.table.classes[key] = mount
                self._save()
            return mount

    @contextlib.contextmanager
    def _class_lock(self, key: str) -> Iterator[None]:
        with self.lock:
            lock = self._class_locks.setdefault(key, threading.RLock())
        with lock:
            yield

    def _start(self, key: str, config: MountConfig, principal: Principal, host: HostSnapshot) -> ClassMount:
        started = time.perf_counter()
        log.info("class %s for %s (%s): serving it", key[:12], principal.reader_class().describe(), config.site)
        mount = self.host.start(key, config, principal.reader_class(), host)
        log.info(
            "class %s for %s (%s) ready in %.3fs",
            key[:12],
            mount.reader,
            config.site,
            time.perf_counter() - started,
        )
        return mount

    # -- housekeeping -----------------------------------------------------------------

    def snapshot(self) -> SessionTable:
        """A copy of the table to read without the lock (the metrics endpoint)."""
        with self.lock:
            table = self.table
            return SessionTable(dict(table.classes), dict(table.sessions), table.binds, table.expiries, table.ended)

    def next_expiry(self) -> float | None:
        """When the next session's token expires (None: no session expires)."""
        with self.lock:
            return min((s.expires_at for s in self.table.sessions.values() if s.expires_at is not None), default=None)

    def any_redis(self) -> bool:
        """Whether a class served uses a Redis (where revocations may be found)."""
        with self.lock:
            return any(m.config is not None and m.config["session"].get("redis") for m in self.table.classes.values())

    def readers(self) -> list[SessionReader]:
        """Each authenticated session's token as a revocation is checked against, with its site's Redis."""
        out = []
        with self.lock:
            for session in self.table.sessions.values():
                mount = self.table.classes.get(session.class_key)
                if (session.subject is None and session.token_id is None) or mount is None or mount.config is None:
                    continue
                site = str(mount.config["session"]["site"])
                redis = mount.config["session"].get("redis")
                token = (session.subject, session.token_id, session.issued_at)
                out.append(SessionReader(session.mountpoint, site, redis, *token))
        return out

    def revoke(self, mountpoints: Iterable[str], why: str) -> int:
        """End the sessions at `mountpoints` as at their token's expiry: their serving process
        refuses them now, as it would at `exp`, and the next pass (which the caller may run at
        once) detaches their binds; how many were still open."""
        now = self.clock()
        ended = 0
        tell: list[tuple[ClassMount, str]] = []
        with self.lock:
            for mountpoint in mountpoints:
                session = self.table.sessions.get(mountpoint)
                if session is None or (session.expires_at is not None and session.expires_at <= now):
                    continue
                log.info("session on %s revoked (%s, %s): ending it as at its expiry", mountpoint, session.reader, why)
                session.expires_at = now
                self._revoked.add(mountpoint)
                mount = self.table.classes.get(session.class_key)
                if mount is not None and session.source:
                    tell.append((mount, session.source))
                    # told here: `_end` must not tell it again (its slot may be another session's by then)
                    session.source = ""
                self.table.touch(session)
                ended += 1
            if ended:
                self._save()
        for mount, source in tell:  # never under the lock: it asks the serving process
            self.host.end_session(mount, source)
        return ended

    def housekeep(self, now: float | None = None, stopping: bool = False) -> None:
        """One pass; `stopping`: the server's last, which ends what must end (expired tokens,
        sessions unmounted) but heals and drops nothing: serving processes stopped with the
        server are the next server's to serve again."""
        now = self.clock() if now is None else now
        idle: list[ClassMount] = []
        with self.lock:
            changed = self._expire(now)
            host = self._snapshot()
            for mount in list(self.table.classes.values()):
                if stopping or mount.key in self._healing or self.host.alive(mount, host):
                    continue
                if self._may_heal(mount):
                    self._heal_in_background(mount)
                else:
                    self._drop_class(mount, "its serving process is gone")
                    changed = True
            for session in list(self.table.sessions.values()):
                mount = self.table.classes[session.class_key]
                if mount.key in self._healing or session.mountpoint in self._opening:
                    continue
                if host.devices.get(session.mountpoint) != mount.device:
                    self._end(session, now)
                    self.table.ended += 1
                    log.info("session on %s ended: unmounted", session.mountpoint)
                    changed = True
            for mount in [] if stopping else self.table.idle(now, self.idle_s):
                log.info("class %s idle for %.0fs: stopping it", mount.key[:12], now - (mount.idle_since or now))
                self.table.drop_class(mount.key)
                idle.append(mount)
                changed = True
            if changed:
                self._save()
        self._tell_ended()
        for mount in idle:  # may ask a serving process: never under the lock
            self.host.stop(mount)

    def _tell_ended(self) -> None:
        """Tell the serving processes which sessions ended (never under the lock: it asks them)."""
        with self.lock:
            ended, self._ended = self._ended, []
        for mount, source in ended:
            self.host.end_session(mount, source)

    def _expire(self, now: float) -> bool:
        expired = self.table.expired(now)
        devices = self._devices() if expired else {}
        for session in expired:
            mount = self.table.classes[session.class_key]
            why = "revoked" if session.mountpoint in self._revoked else "expired"
            self._revoked.discard(session.mountpoint)
            if devices is None or devices.get(session.mountpoint) == mount.device:
                # logged before the detach so that whoever sees the mount go also finds the reason
                log.warning("session on %s %s (%s): detaching it", session.mountpoint, why, session.reader)
                self.kernel.detach(session.mountpoint)
            else:
                log.info("session on %s %s (%s); its user had unmounted it", session.mountpoint, why, session.reader)
            self._end(session, now)
            self.table.expiries += 1
        return bool(expired)

    # -- healing ----------------------------------------------------------------------

    def _may_heal(self, mount: ClassMount) -> bool:
        return mount.config is not None and mount.reader_class is not None and bool(self.table.sessions_of(mount.key))

    def _heal_in_background(self, mount: ClassMount) -> None:
        log.error("class %s: its serving process is gone; serving it again", mount.key[:12])
        self._healing.add(mount.key)
        self.run_heal(f"heal-{mount.key[:8]}", lambda: self._heal(mount))

    def _heal(self, mount: ClassMount) -> None:
        """Serve a class whose process died again, and bind each of its sessions again at its own
        path (the new bind put beneath the old one, on a dead connection, which is then detached:
        nothing stacks, and the path never shows the empty directory under them). New sessions
        of the class wait for it (the class lock); sessions of other classes never do."""
        with self._class_lock(mount.key):
            self._heal_locked(mount)
        self._tell_ended()

    def _heal_locked(self, mount: ClassMount) -> None:
        started = time.perf_counter()
        assert mount.config is not None and mount.reader_class is not None
        with self.lock:
            if self.table.classes.get(mount.key) is not mount:
                self._healing.discard(mount.key)
                return  # a request healed it first, or its sessions ended
        try:
            config = MountConfig.from_dict(mount.config)
            authenticated, groups = mount.reader_class
            reader = Principal(bool(authenticated), frozenset(groups))
            served = self.host.start(mount.key, config, reader, self._snapshot())
        except Exception as exc:  # whatever it is, the class is dropped with the reason logged
            with self.lock:
                self._healing.discard(mount.key)
                if self.table.classes.get(mount.key) is mount:
                    self._drop_class(mount, f"it cannot be served again ({exc})")
                    self._save()
            return
        with self.lock:
            self._healing.discard(mount.key)
            if self.table.classes.get(mount.key) is not mount:
                return  # its sessions ended meanwhile
            served.created, served.idle_since = mount.created, mount.idle_since
            self.table.classes[mount.key] = served
            bound = 0
            devices = self.kernel.mounted_devices()
            for session in self.table.sessions_of(mount.key):
                if devices.get(session.mountpoint) != mount.device:
                    # its user unmounted it while the class was down: never bound again
                    log.info("session on %s ended: unmounted", session.mountpoint)
                    session.source = ""  # its directory was the dead process's: nobody to tell
                    self._end(session, self.clock())
                    self.table.ended += 1
                    continue
                # its directory was the dead process's: the new one may give its path to another
                # session, which must not be ended in its place if this one cannot be bound
                session.source = ""
                self.table.touch(session)
                try:
                    session.source = self.host.open_session(served, session)
                    # the new bind beneath the dead one, then the dead one detached: a reader never
                    # finds the empty directory under them (no empty listing, no ENOENT)
                    self.kernel.replace_bind(session.source, session.mountpoint)
                    bound += 1
                    self._write_status(session)
                except (OSError, SessionError) as exc:
                    if isinstance(exc, OSError) and exc.errno == errno.ENOENT:
                        # unmounted by its user between the look above and the bind
                        log.info("session on %s ended: unmounted", session.mountpoint)
                    else:
                        log.error("session on %s cannot be bound again: %s; ending it", session.mountpoint, exc)
                    if self.kernel.device_at(session.mountpoint) == mount.device:
                        self.kernel.detach(session.mountpoint)  # the dead class's bind: nothing to read there
                    self._end(session, self.clock(), served)
                    self.table.ended += 1
            self._save()
        log.warning(
            "class %s served again by pid %d: %d sessions bound again in %.3fs",
            mount.key[:12],
            served.pid,
            bound,
            time.perf_counter() - started,
        )

    # -- after a restart ----------------------------------------------------------------

    def recover(self) -> None:
        """After a restart: keep what still stands (a class whose process died but has sessions
        is healed by the first housekeeping pass), drop the rest, and let class mounts no state
        names drain (detached once no bind uses them)."""
        now = self.clock()
        host = self._snapshot()
        devices = host.devices
        for session in list(self.table.sessions.values()):
            if devices.get(session.mountpoint) != self.table.classes[session.class_key].device:
                self.table.remove(session.mountpoint, now)
                self._remove_status(session)
        for mount in list(self.table.classes.values()):
            if not self.host.alive(mount, host) and not self._may_heal(mount):
                self._drop_class(mount, "gone while the server was down")
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
                    self.kernel.detach(path)
        self.statuses.remove_stale(self.root, self.table.sessions)
        for session in self.table.sessions.values():
            self._write_status(session)
        self._save()
        if self.table.classes:
            log.info("carried on %d classes and %d sessions", len(self.table.classes), len(self.table.sessions))

    # -- helpers ------------------------------------------------------------------------

    def _end(self, session: Session, now: float, mount: ClassMount | None = None) -> None:
        """Forget the session (its bind is gone or detached); its serving process is told after
        the lock is released (`_tell_ended`)."""
        mount = mount or self.table.classes.get(session.class_key)
        self._revoked.discard(session.mountpoint)
        if mount is not None and session.source:
            self._ended.append((mount, session.source))
        self.table.remove(session.mountpoint, now)
        self._remove_status(session)

    def _not_opened(self, mount: ClassMount) -> None:
        """A session of `mount` was not opened after all: the class `_class` held in use is idle
        again (from now) if no session of it is left."""
        if not self.table.sessions_of(mount.key):
            mount.idle_since = self.clock()
        self._save()

    def _drop_class(self, mount: ClassMount, why: str) -> None:
        log.error("class %s dropped: %s; detaching its sessions", mount.key[:12], why)
        sessions = self.table.drop_class(mount.key)
        devices = self._devices() if sessions else {}
        for session in sessions:
            if devices is None or devices.get(session.mountpoint) == mount.device:
                self.kernel.detach(session.mountpoint)
            self._remove_status(session)

    def _devices(self) -> dict[str, str] | None:
        """The mount table, to tell a session's bind from another mount its user put at its path
        since (never detached); None when it cannot be read (short of descriptors): a session
        that must end is detached all the same."""
        try:
            return self.kernel.mounted_devices()
        except OSError:
            return None

    def _snapshot(self) -> HostSnapshot:
        return HostSnapshot.take(self.kernel)

    def _save(self) -> None:
        try:
            self.journal.save(self.table)
        except OSError as exc:
            log.error("cannot save the session state %s: %s", self.state_path, exc)

    # -- status (chromafs status) --------------------------------------------------------

    def _write_status(self, session: Session) -> None:
        mount = self.table.classes[session.class_key]
        status = {
            "mountpoint": session.mountpoint,
            "site": mount.site,
            "reader": session.reader,
            "pid": mount.pid,  # the serving process serves the session
            "pid_start": mount.pid_start,
            "started": session.started,
            "expires_at": session.expires_at,
            "session": {"subject": session.subject, "class": mount.key, "class_mount": mount.path},
        }
        self.statuses.write(session.mountpoint, status)

    def _remove_status(self, session: Session) -> None:
        self.statuses.remove(session.mountpoint)
