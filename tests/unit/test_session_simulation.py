"""The mount server's session state machine (serving/server/session_keeper.py) driven on a
simulated host: seeded random schedules of opens, unmounts, token expiries, serving processes
killed, heals that fail, housekeeping, server restarts and stops, thousands of steps per seed,
with the invariants checked after every step.

The host is a model, not a mock: a mount table (a stack of devices per path, binds stacking
and unstacking as the kernel's do), serving processes that start, serve views and session
directories, die (their device stays mounted, dead, under their sessions' binds) and end
themselves once no bind of theirs has stood for their idle time, and a clock. Whatever the
keeper does runs through it, so a failing seed replays exactly:

    CHROMAFS_SIM_SEED=17 pytest tests/unit/test_session_simulation.py   (its log shown too)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chromafs_fuse.access import Principal
from chromafs_fuse.config import ChromaLocation, MountConfig, SessionConfig
from chromafs_fuse.serving.server import state_journal
from chromafs_fuse.serving.server.session_keeper import HostSnapshot, SessionError, SessionKeeper
from chromafs_fuse.serving.server.session_table import ClassMount, Session
from chromafs_fuse.serving.server.state_journal import StateJournal

SEEDS = 20
STEPS = 2000
REPLAY = os.environ.get("CHROMAFS_SIM_SEED")
IDLE_S = 30.0  # --class-idle
IDLE_EXIT_S = IDLE_S + 5.0  # a serving process's own idle time (server.py's ORPHAN_GRACE_S past it)
PROCESSES = 2
SITES = ("acme", "globex")
GROUPS: tuple[tuple[str, ...] | None, ...] = (None, ("billing",), ("eng", "billing"))  # None: anonymous
MOUNTPOINTS = tuple(f"/home/u{i}/docs" for i in range(6))


class Violation(AssertionError):
    pass


# -- the simulated host ------------------------------------------------------------------------


@dataclass
class Process:
    """One serving process of the pool, at `<root>/serving-<index>`."""

    index: int
    mountpoint: str
    pid: int = 0
    pid_start: int | None = None
    device: str = ""
    views: dict[str, str] = field(default_factory=dict)  # view path -> class key
    sessions: dict[str, tuple[str, float | None]] = field(default_factory=dict)  # source -> (view, expires_at)
    next_slot: int = 1
    unused_since: float | None = None


class SimKernel:
    """The mount table (per path a stack of devices, the topmost last) and the running processes."""

    def __init__(self) -> None:
        self.stacks: dict[str, list[str]] = {}
        self.running: dict[int, int] = {}  # pid -> start time
        self.missing: set[str] = set()  # mountpoints whose directory is gone
        self.source_device: Callable[[str], str | None] = lambda _source: None

    def private_directory(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)  # the journal's directory: a real one

    def mounted_devices(self) -> dict[str, str]:
        return {path: stack[-1] for path, stack in self.stacks.items()}

    def device_at(self, path: str) -> str | None:
        stack = self.stacks.get(path)
        return stack[-1] if stack else None

    def process_start(self, pid: int) -> int | None:
        return self.running.get(pid)

    def mount(self, device: str, target: str) -> None:
        if target in self.missing:
            raise OSError(errno.ENOENT, f"{target}: no such directory")
        self.stacks.setdefault(target, []).append(device)

    def bind_read_only(self, source: str, target: str) -> None:
        device = self.source_device(source)
        if device is None:
            raise OSError(errno.ENOENT, f"{source}: no such directory")
        self.mount(device, target)

    def replace_bind(self, source: str, target: str) -> None:
        stack = self.stacks.get(target)
        if not stack:
            raise OSError(errno.ENOENT, f"{target}: nothing is mounted there any more")
        device = self.source_device(source)
        if device is None:
            raise OSError(errno.ENOENT, f"{source}: no such directory")
        stack[-1] = device  # beneath the top one, then the top one detached

    def detach(self, target: str) -> bool:
        stack = self.stacks.get(target)
        if not stack:
            return False
        stack.pop()
        if not stack:
            del self.stacks[target]
        return True


class SimStatuses:
    def __init__(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}

    def write(self, mountpoint: str, status: dict[str, Any]) -> None:
        self.files[mountpoint] = status

    def remove(self, mountpoint: str) -> None:
        self.files.pop(mountpoint, None)

    def remove_stale(self, root: str, live: Container[str]) -> None:
        for mountpoint, status in list(self.files.items()):
            if status["session"]["class_mount"].startswith(root + "/") and mountpoint not in live:
                del self.files[mountpoint]


class SimPool:
    """The `ClassHost`: a pool of serving processes, as serving/server/pool.py's `ServingPool`
    asks them (a site's classes in one process; a dead process started again by the next start)."""

    def __init__(self, root: str, kernel: SimKernel, clock: Callable[[], float]) -> None:
        self.kernel = kernel
        self.clock = clock
        self.processes = [Process(i, f"{root}/serving-{i}") for i in range(PROCESSES)]
        self.next_pid = 100
        self.next_device = 1
        self.fail_starts = 0  # the next starts that fail (a backend down, a process that will not start)
        self.refuse_sessions = 0  # the next session directories refused
        self.starts = 0
        self.stops = 0
        self.interleave: Callable[[str], None] = lambda _where: None  # what happens meanwhile on other threads
        kernel.source_device = self.source_device

    def runs(self, process: Process) -> bool:
        return (
            process.pid_start is not None
            and self.kernel.running.get(process.pid) == process.pid_start
            and self.kernel.mounted_devices().get(process.mountpoint) == process.device
        )

    def source_device(self, source: str) -> str | None:
        process = self._process_of(source, depth=2)
        return process.device if process is not None and self.runs(process) and source in process.sessions else None

    def _process_of(self, path: str, depth: int) -> Process | None:
        for _ in range(depth):
            path = os.path.dirname(path)
        return next((p for p in self.processes if p.mountpoint == path), None)

    def kill(self, process: Process) -> None:
        """Its mount stays, on a dead connection, under whatever binds it."""
        self.kernel.running.pop(process.pid, None)
        process.views.clear()
        process.sessions.clear()

    def _ensure_running(self, process: Process) -> None:
        if self.runs(process):
            return
        if process.mountpoint in self.kernel.stacks:
            self.kernel.detach(process.mountpoint)  # left by a process that is gone
        self.kill(process)
        process.pid, process.pid_start = self.next_pid, self.next_pid * 7
        process.device = f"fuse:{self.next_device}"
        self.next_pid += 1
        self.next_device += 1
        self.kernel.running[process.pid] = process.pid_start
        self.kernel.mount(process.device, process.mountpoint)
        process.next_slot, process.unused_since = 1, self.clock()

    # -- ClassHost

    def start(self, key: str, config: MountConfig, reader: Principal, host: HostSnapshot) -> ClassMount:
        self.starts += 1
        self.interleave("start")
        if self.fail_starts:
            self.fail_starts -= 1
            raise SessionError("simulated: the class cannot be served")
        process = self.processes[SITES.index(config.site) % PROCESSES]
        self._ensure_running(process)
        path = f"{process.mountpoint}/{config.site}/{key}"
        process.views[path] = key
        return ClassMount(
            key,
            path,
            process.pid,
            process.pid_start,
            config.site,
            reader.describe(),
            process.device,
            self.clock(),
            config=config.to_dict(),
            reader_class=[reader.authenticated, sorted(reader.groups)],
        )

    def adopt(self, mount: ClassMount) -> None:
        pass

    def stop(self, mount: ClassMount) -> None:
        self.stops += 1
        process = self._process_of(mount.path, depth=2)
        if process is None or not self.runs(process) or process.pid != mount.pid:
            return
        process.views.pop(mount.path, None)
        for source, (view, _expires_at) in list(process.sessions.items()):
            if view == mount.path:
                del process.sessions[source]

    def alive(self, mount: ClassMount, host: HostSnapshot) -> bool:
        process = self._process_of(mount.path, depth=2)
        return (
            process is not None
            and host.runs(mount.pid, mount.pid_start)
            and host.device_at(process.mountpoint) == mount.device
        )

    def open_session(self, mount: ClassMount, session: Session) -> str:
        self.interleave("open_session")
        process = self._process_of(mount.path, depth=2)
        if process is None or not self.runs(process) or process.pid != mount.pid or mount.path not in process.views:
            raise SessionError("simulated: the serving process did not answer")
        if self.refuse_sessions:
            self.refuse_sessions -= 1
            raise SessionError("simulated: the serving process refused the session")
        source = f"{process.mountpoint}/.sessions/{process.next_slot}"
        process.next_slot += 1
        process.sessions[source] = (mount.path, session.expires_at)
        return source

    def renew_session(self, mount: ClassMount, source: str, expires_at: float) -> None:
        self.interleave("renew_session")
        process = self._process_of(mount.path, depth=2)
        if process is None or not self.runs(process) or process.pid != mount.pid or source not in process.sessions:
            raise SessionError("simulated: the session has ended in its serving process")
        view, _expires_at = process.sessions[source]
        process.sessions[source] = (view, expires_at)

    def end_session(self, mount: ClassMount, source: str) -> None:
        process = self._process_of(mount.path, depth=2)
        if process is not None and source and self.runs(process) and process.pid == mount.pid:
            process.sessions.pop(source, None)

    def owns(self, path: str) -> bool:
        return any(path == p.mountpoint for p in self.processes)

    # -- the processes' own clocks

    def tick(self, now: float) -> None:
        """Sessions end at their expiry in their process too; a process no bind of which has
        stood for its idle time unmounts itself and exits."""
        devices = self.kernel.mounted_devices()
        for process in self.processes:
            if not self.runs(process):
                continue
            for source, (_view, expires_at) in list(process.sessions.items()):
                if expires_at is not None and expires_at <= now:
                    del process.sessions[source]
            if any(d == process.device and p != process.mountpoint for p, d in devices.items()):
                process.unused_since = None
            elif process.unused_since is None:
                process.unused_since = now
            elif now - process.unused_since >= IDLE_EXIT_S:
                self.kernel.detach(process.mountpoint)
                self.kill(process)


# -- the driver ---------------------------------------------------------------------------------


def _config(site: str, mountpoint: str) -> MountConfig:
    return MountConfig(SessionConfig(site, ChromaLocation(path="/chroma"), "page_path", "chunk_index"), mountpoint)


class Simulation:
    def __init__(self, seed: int, root: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = str(root)
        self.now = 1_000_000.0
        self.kernel = SimKernel()
        self.statuses = SimStatuses()
        self.pool = SimPool(self.root, self.kernel, self.clock)
        self.pool.interleave = self._interleave
        self.heals: list[Callable[[], None]] = []  # heals started, not run yet
        self.trace: list[str] = []
        self.step = 0
        self.subjects = 0
        self.bound_by: dict[str, str] = {}  # mountpoint -> the subject whose session the user mounted there
        self.user_ended: set[str] = set()  # subjects whose users unmounted their session
        self.foreign: dict[str, str] = {}  # mountpoint -> a mount of something else its user put there
        self.foreign_devices = 0
        self.opening: str | None = None  # the mountpoint of the open under way
        self.in_interleave = False
        self.running = True
        self.checked: tuple[dict[str, ClassMount], dict[str, Session], int] | None = None
        self.revoked: list[Session] = []  # sessions revoked, to be ended by the next housekeeping pass
        self.keeper = self._new_keeper()

    def clock(self) -> float:
        return self.now

    def _new_keeper(self) -> SessionKeeper:
        self.heals = []  # the old server's heal threads died with it
        self.checked = None
        return SessionKeeper(
            self.root,
            IDLE_S,
            self.pool,
            kernel=self.kernel,
            statuses=self.statuses,
            clock=self.clock,
            run_heal=lambda _name, heal: self.heals.append(heal),
        )

    def fail(self, invariant: str) -> None:
        recent = "\n  ".join(self.trace[-25:])
        raise Violation(
            f"seed {self.seed}, step {self.step}: {invariant}\n"
            f"replay: CHROMAFS_SIM_SEED={self.seed} pytest {__file__}\nlast steps:\n  {recent}"
        )

    def note(self, what: str) -> None:
        self.trace.append(f"{self.step}: {what}")

    # -- actions

    def run(self, steps: int) -> None:
        actions: list[tuple[int, Callable[[], None]]] = [
            (30, self.open),
            (14, self.user_unmounts),
            (4, self.user_unmounts_foreign),
            (10, self.advance),
            (5, self.kill),
            (4, self.starts_fail),
            (2, self.sessions_refused),
            (18, self.housekeep),
            (3, self.revoke),
            (6, self.renew),
            (8, self.heal),
            (3, self.restart),
            (2, self.stop),
        ]
        weights = [w for w, _ in actions]
        for self.step in range(steps):
            (action,) = self.rng.choices([a for _, a in actions], weights)
            action()
            self.pool.tick(self.now)
            self.check()

    def open(self) -> None:
        mountpoint = self.rng.choice(MOUNTPOINTS)
        if mountpoint in self.kernel.missing and self.rng.random() < 0.7:
            self.kernel.missing.discard(mountpoint)  # its client made it again
        site, groups = self.rng.choice(SITES), self.rng.choice(GROUPS)
        self.subjects += 1
        subject = f"user{self.subjects}"
        expires_at = None if self.rng.random() < 0.3 else self.now + self.rng.uniform(1, 200)
        if groups is None:
            principal = Principal(authenticated=False, subject=subject, expires_at=expires_at)
        else:
            principal = Principal.of(groups, subject, expires_at)
        expiry = "never" if expires_at is None else f"in {expires_at - self.now:.0f}s"
        self.note(f"open {mountpoint} {site} {groups} {subject}, expires {expiry}")
        self.opening = mountpoint
        try:
            session = self.keeper.open_session(_config(site, mountpoint), principal, uid=1000)
        except SessionError as exc:
            self.note(f"  refused: {exc}")
            return
        finally:
            self.opening = None
        assert session.subject == subject
        self.bound_by[mountpoint] = subject

    def _chromafs(self, device: str) -> bool:
        return device.startswith("fuse:")

    def user_unmounts(self, swap: bool | None = None) -> None:
        """A user unmounts their session (umount pops the topmost mount), now and then mounting
        something else of theirs at its path at once."""
        mine = sorted(p for p in self.bound_by if self._chromafs(self.kernel.mounted_devices().get(p, "")))
        if not mine:
            return
        mountpoint = self.rng.choice(mine)
        swap = self.rng.random() < 0.3 if swap is None else swap
        self.note(f"user unmounts {mountpoint}{' and mounts a tmpfs there' if swap else ''}")
        self.kernel.detach(mountpoint)
        self.user_ended.add(self.bound_by.pop(mountpoint))
        if swap:
            self.foreign_devices += 1
            device = f"tmpfs:{self.foreign_devices}"
            self.kernel.mount(device, mountpoint)
            self.foreign[mountpoint] = device

    def user_unmounts_foreign(self) -> None:
        if self.foreign:
            mountpoint = self.rng.choice(sorted(self.foreign))
            self.note(f"user unmounts the tmpfs on {mountpoint}")
            del self.foreign[mountpoint]
            self.kernel.detach(mountpoint)

    def advance(self, seconds: float | None = None) -> None:
        seconds = self.rng.choice((0.5, 2.0, 10.0, 40.0, 120.0)) if seconds is None else seconds
        self.note(f"clock +{seconds}s")
        self.now += seconds

    def kill(self) -> None:
        alive = [p for p in self.pool.processes if self.pool.runs(p)]
        if alive:
            process = self.rng.choice(alive)
            self.note(f"serving process {process.index} (pid {process.pid}) killed")
            self.pool.kill(process)

    def starts_fail(self) -> None:
        self.pool.fail_starts += self.rng.randint(1, 2)
        self.note(f"the next {self.pool.fail_starts} starts fail")

    def sessions_refused(self) -> None:
        self.pool.refuse_sessions += 1
        self.note("the next session directory is refused")

    def revoke(self) -> None:
        """`chromafs revoke` of one session's subject: its session ends at the next housekeeping
        pass, as at its token's expiry (checked there)."""
        live = sorted(self.keeper.table.sessions)
        if live:
            mountpoint = self.rng.choice(live)
            self.note(f"the token of the session on {mountpoint} is revoked")
            self.keeper.revoke([mountpoint], "a test")
            self.revoked.append(self.keeper.table.sessions[mountpoint])

    def renew(self) -> None:
        """A later token of a session's reader (kubelet's republish), now and then another
        reader's or an earlier one: the session lasts until the later token's expiry, in the
        table and in its serving process; a revoked or ended session is never renewed."""
        live = sorted(self.keeper.table.sessions)
        if not live:
            return
        mountpoint = self.rng.choice(live)
        session = self.keeper.table.sessions[mountpoint]
        mount = self.keeper.table.classes[session.class_key]
        authenticated, groups = mount.reader_class or [True, []]
        subject = session.subject if self.rng.random() < 0.85 else "someone-else"
        expires_at = self.now + self.rng.uniform(-20, 300)
        if authenticated:
            principal = Principal.of(groups, subject, expires_at)
        else:
            principal = Principal(authenticated=False, subject=subject, expires_at=expires_at)
        was = session.expires_at
        self.note(f"renew {mountpoint} as {subject} until {expires_at - self.now:+.0f}s (was {was})")
        revoked = any(r is session for r in self.revoked)
        try:
            now_expires = self.keeper.renew(_config(mount.site, mountpoint), principal)
        except SessionError as exc:
            self.note(f"  refused: {exc}")
            return
        if revoked:
            self.fail(f"the revoked session on {mountpoint} was renewed")
        if subject != session.subject:
            self.fail(f"the session on {mountpoint} of {session.subject} was renewed for {subject}")
        if was is not None and was <= self.now:
            self.fail(f"the expired session on {mountpoint} was renewed")
        expected = was if was is None or expires_at <= was else expires_at
        if now_expires != expected or self.keeper.table.sessions.get(mountpoint) not in (None, session):
            self.fail(f"the session on {mountpoint} renewed to {now_expires}, not {expected}")

    def housekeep(self) -> None:
        self.note("housekeeping")
        self.keeper.housekeep()
        self.check_after_housekeeping(stopping=False)

    def heal(self) -> None:
        if self.heals:
            heal = self.heals.pop(self.rng.randrange(len(self.heals)))
            self.note("a heal runs")
            heal()

    def restart(self) -> None:
        """The server is killed and started again: a new keeper on the same journal and host."""
        self.note("the server is killed and started again")
        self.keeper = self._new_keeper()

    def stop(self) -> None:
        """The server stops (its last housekeeping pass); now and then everything then winds
        down (its users unmount their sessions and the idle time passes) before it starts again."""
        self.note("the server stops")
        table = self.keeper.table
        classes, starts, stops, heals = dict(table.classes), self.pool.starts, self.pool.stops, len(self.heals)
        self.keeper.housekeep(stopping=True)
        if self.pool.starts != starts or len(self.heals) != heals:
            self.fail("the stopping pass healed a class")
        if self.pool.stops != stops or any(table.classes.get(k) is not m for k, m in classes.items()):
            self.fail("the stopping pass dropped or stopped a class")
        self.check_after_housekeeping(stopping=True)
        self.heals = []  # the server is gone
        self.running = False
        self.check()
        if self.rng.random() < 0.4:
            self.wind_down()
        self.note("the server starts")
        self.running = True
        self.keeper = self._new_keeper()

    def wind_down(self) -> None:
        """With no server: every user unmounts, the idle time passes: nothing of it runs then."""
        self.note("everyone unmounts; the idle time passes")
        while any(self._chromafs(self.kernel.mounted_devices().get(p, "")) for p in self.bound_by):
            self.user_unmounts(swap=False)
        for _ in range(3):
            self.now += IDLE_EXIT_S / 2 + 1
            self.pool.tick(self.now)
        running = [p.index for p in self.pool.processes if self.pool.runs(p)]
        # a killed process's own mount stays (a dead connection) until the pool starts it again
        own = {p.mountpoint for p in self.pool.processes}
        bound = [p for p, stack in self.kernel.stacks.items() if p not in own and any(map(self._chromafs, stack))]
        if running or bound:
            self.fail(f"after the stop and the idle time serving processes {running} run, {bound} are bound")

    def _interleave(self, where: str) -> None:
        """What other threads do while the keeper waits on a serving process outside its lock
        (never under it: they would wait for it)."""
        if self.in_interleave or self.keeper.lock._is_owned() or self.rng.random() < 0.6:  # type: ignore[attr-defined]
            return
        self.in_interleave = True
        try:
            choice = self.rng.randrange(5)
            self.note(f"  meanwhile ({where}):")
            if choice == 0:
                self.user_unmounts()
            elif choice == 1:
                self.kill()
            elif choice == 2:
                self.advance(self.rng.choice((0.5, 5.0, 60.0)))
            elif choice == 3:
                self.housekeep()
            elif self.opening is not None:
                self.note(f"  the client of {self.opening} hangs up: its mountpoint is removed")
                self.kernel.missing.add(self.opening)
        finally:
            self.in_interleave = False

    # -- invariants

    def check(self) -> None:
        table = self.keeper.table
        devices = self.kernel.mounted_devices()
        for mountpoint, session in table.sessions.items():
            mount = table.classes.get(session.class_key)
            if mount is None:
                self.fail(f"the session on {mountpoint} has no class")
            ours = [d for d in self.kernel.stacks.get(mountpoint, []) if self._chromafs(d)]
            if session.subject in self.user_ended:
                if ours:
                    self.fail(f"the session on {mountpoint} its user unmounted is bound again")
            elif ours != [mount.device] or devices[mountpoint] != mount.device:
                self.fail(f"the live session on {mountpoint} is not bound once to its class: {ours} vs {mount.device}")
        processes = {p.mountpoint for p in self.pool.processes}
        for path, stack in self.kernel.stacks.items():
            if path in processes:
                if len(stack) != 1:
                    self.fail(f"serving process mounts stack on {path}: {stack}")
                continue
            if any(map(self._chromafs, stack)) and path not in table.sessions:
                self.fail(f"{path} is bound for a session that ended: {stack}")
        for mountpoint, device in self.foreign.items():
            if devices.get(mountpoint) != device:
                self.fail(f"the user's own mount on {mountpoint} was unmounted or covered")
        for mountpoint, session in table.sessions.items():
            process = self.pool._process_of(table.classes[session.class_key].path, depth=2)
            mount = table.classes[session.class_key]
            live = process is not None and self.pool.runs(process) and process.pid == mount.pid
            unexpired = session.expires_at is None or session.expires_at > self.now
            if live and unexpired and session.subject not in self.user_ended and session.source not in process.sessions:  # type: ignore[union-attr]
                self.fail(f"the live session on {mountpoint} is refused by its serving process ({session.source})")
            if live and unexpired and session.source in process.sessions:  # type: ignore[union-attr]
                served_until = process.sessions[session.source][1]  # type: ignore[union-attr]
                if served_until != session.expires_at:
                    self.fail(
                        f"the session on {mountpoint} ends at {served_until} in its process, not {session.expires_at}"
                    )
        if set(self.statuses.files) != set(table.sessions):
            self.fail(f"the status files {sorted(self.statuses.files)} are not the sessions {sorted(table.sessions)}")
        self.check_journal()

    def check_journal(self) -> None:
        table = self.keeper.table
        size = os.stat(self.keeper.state_path).st_size if os.path.exists(self.keeper.state_path) else -1
        if self.checked is not None:
            classes, sessions, checked_size = self.checked
            if size == checked_size and classes == table.classes and sessions == table.sessions:
                return  # neither changed since the journal last read the same
        loaded = StateJournal(self.keeper.state_path).load()
        for kind, live, saved in (
            ("class", table.classes, loaded.classes),
            ("session", table.sessions, loaded.sessions),
        ):
            differ = [key for key in live.keys() | saved.keys() if _as_json(live.get(key)) != _as_json(saved.get(key))]
            if differ:
                key = sorted(differ)[0]
                live_record, saved_record = _as_json(live.get(key)), _as_json(saved.get(key))
                if isinstance(live_record, dict) and isinstance(saved_record, dict):
                    changed = {k: (v, saved_record.get(k)) for k, v in live_record.items() if saved_record.get(k) != v}
                    self.fail(f"the journal reloaded is not the table: {kind} {key}: (table, journal) {changed}")
                where = "journal" if live_record is None else "table"
                self.fail(f"the journal reloaded is not the table: {kind} {key} is only in the {where}")
        self.checked = (_copy(table.classes), _copy(table.sessions), size)

    def check_after_housekeeping(self, stopping: bool) -> None:
        table = self.keeper.table
        expired = [s.mountpoint for s in table.expired(self.now)]
        if expired:
            self.fail(f"sessions past their expiry after a housekeeping pass: {expired}")
        revoked = [s.mountpoint for s in self.revoked if table.sessions.get(s.mountpoint) is s]
        if revoked:
            self.fail(f"sessions revoked before a housekeeping pass still open after it: {revoked}")
        self.revoked = []
        if not stopping:
            idle = [m.key[:8] for m in table.idle(self.now, IDLE_S)]
            if idle:
                self.fail(f"classes idle past --class-idle after a housekeeping pass: {idle}")
        if not self.in_interleave:  # no session is being opened: a class without one is idle
            unused = [
                m.key[:8] for m in table.classes.values() if m.idle_since is None and not table.sessions_of(m.key)
            ]
            if unused:
                self.fail(f"classes with no session never to be stopped as idle: {unused}")


def _as_json(record: object) -> object:
    """As the journal writes it (a tuple comes back a list)."""
    return None if record is None else json.loads(json.dumps(vars(record)))


def _copy(records: dict[str, Any]) -> dict[str, Any]:
    return {key: type(record)(**vars(record)) for key, record in records.items()}


@pytest.fixture
def quiet_keeper() -> Iterator[None]:
    """Thousands of steps log thousands of lines; a replay shows them."""
    logger = logging.getLogger("chromafs.mountd")
    level = logger.level
    if not REPLAY:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.fixture
def short_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal rewritten every few dozen changes: compaction is exercised, a reload stays cheap."""
    monkeypatch.setattr(state_journal, "COMPACT_MIN_LINES", 40)


@pytest.mark.parametrize("seed", [int(REPLAY)] if REPLAY else range(SEEDS))
def test_the_session_state_machine_keeps_its_invariants(
    seed: int, tmp_path: Path, quiet_keeper: None, short_journal: None
) -> None:
    """After every step: every live session bound exactly once at its path, to its own class's
    device, and served by its class's process; nothing bound for a session that ended, and a
    session its user unmounted (during a heal too) never bound again; the user's own mounts left
    alone; the status files the sessions; the journal reloaded the table; after a housekeeping
    pass nothing past its expiry and no class idle past --class-idle; a stopping pass heals,
    drops and stops nothing; after a stop and the idle time nothing runs."""
    started = time.perf_counter()
    Simulation(seed, tmp_path / "classes").run(STEPS)
    assert time.perf_counter() - started < 10, "the simulation is meant to be quick"
