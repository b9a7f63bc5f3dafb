"""The mount server's side of its serving processes: `ServingPool` serves each reader class as
a view of a serving process's mount (serving/serving_process/process.py), asked over its control socket,
and starts that process when none answers. It keeps a pool of N of them (`--serving-processes`,
one per core by default) and places each new site in the one serving the fewest sites; every
class of a site goes where the site is. Request threads call it at once: a process is started by
one of them, the others wait for it.

A class is alive while the serving process that added its view runs and its mount stands. The
processes outlive the mount server: a restarted server finds them through their sockets and
carries on with the views its state names (their sites stay where they are). A process that
died is started again by the next `start` of a class placed in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import ChromafsError
from chromafs_fuse.serving.binds import detach, device_at
from chromafs_fuse.serving.handshake import ask_line
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.protocol import (
    AddView,
    Describe,
    EndViewSession,
    OpenViewSession,
    RemoveView,
    RenewViewSession,
    Request,
    answer_of,
    encode,
)
from chromafs_fuse.serving.server.session_keeper import HostSnapshot, SessionError
from chromafs_fuse.serving.server.session_table import ClassMount, Session
from chromafs_fuse.serving.serving_process.process import member_paths
from chromafs_fuse.serving.serving_process.sites import site_key
from chromafs_fuse.serving_views import site_dir_name

log = logging.getLogger("chromafs.mountd")
CONTROL_TIMEOUT_S = 5.0  # a request that does not load a site answers in milliseconds

# starts the i-th serving process and waits until it serves; its pid (SessionError if it cannot)
StartMember = Callable[[int], int]
MAX_SERVING_PROCESSES = 256
START_ATTEMPTS = 3  # a class asked of a serving process that dies meanwhile: asked of the next one
DEATH_WAIT_S = 2.0  # how long a process whose connection reset is given to be seen gone


class ControlSocket:
    """The serving process's control socket, one connection per request (a few microseconds)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def ask(self, request: Request, timeout_s: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """The answer's fields; OSError when nobody answers, the process's refusal as its
        ChromafsError (its kind kept: a site that does not exist is NotFound)."""
        answer = ask_line(self.path, encode(request), timeout_s)
        if not answer.endswith(b"\n"):
            raise ConnectionError("the serving process closed the connection")
        return answer_of(answer)


class PoolMember:
    """One serving process, as the mount server knows it: started when a site first needs
    it, found again through its socket after a restart of the server."""

    def __init__(self, root: str, index: int, start: StartMember) -> None:
        self.index = index
        self.mountpoint, socket_path = member_paths(root, index)
        self.control = ControlSocket(socket_path)
        self._start = start
        self.pid: int | None = None
        self.pid_start: int | None = None
        self.sites: set[str] = set()  # site directories placed here (by this server or one before it)
        self.lock = threading.Lock()  # one start of the process at a time

    def _serving(self, host: HostSnapshot) -> bool:
        return (
            self.pid is not None and host.runs(self.pid, self.pid_start) and host.device_at(self.mountpoint) is not None
        )

    def ensure_running(self, host: HostSnapshot) -> str:
        """The process's mount device, the process started first if none answers."""
        with self.lock:
            return self._ensure_running(host)

    def _ensure_running(self, host: HostSnapshot) -> str:
        if not self._serving(host):
            host = HostSnapshot.take()  # another request may have started it meanwhile
        device = host.device_at(self.mountpoint)
        if not self._serving(host):
            self.pid = None
            with contextlib.suppress(OSError, ValueError, ChromafsError):
                pid = int(self.control.ask(Describe())["pid"])
                if device is not None:
                    self.pid, self.pid_start = pid, process_start(pid)
            if self.pid is None:
                if device is not None:
                    detach(self.mountpoint)  # left by a process that is gone
                started = time.perf_counter()
                self.pid = self._start(self.index)
                self.pid_start = process_start(self.pid)
                took = time.perf_counter() - started
                log.info("serving mount %s (pid %d) ready in %.3fs", self.mountpoint, self.pid, took)
                device = device_at(self.mountpoint)
        if device is None:
            raise SessionError("the serving mount is not mounted")
        return device


class ServingPool:
    """Every class a view of a serving mount at `<root>/serving` (`serving-<i>` for the i-th of
    `processes`). Every class of a site is in the same process (a page the classes share is one
    inode); a new site goes to the process serving the fewest."""

    def __init__(self, root: str, start_member: StartMember, processes: int = 1, warm_wait_s: float = 0.0) -> None:
        """`warm_wait_s`: how long a new class's first session waits for its pages to be read
        into the kernel (its first grep then finds them there)."""
        self.root = root
        self.warm_wait_s = warm_wait_s
        self.processes = [PoolMember(root, index, start_member) for index in range(processes)]
        self._placing = threading.Lock()

    def _process_of(self, path: str) -> PoolMember | None:
        return next((p for p in self.processes if os.path.dirname(os.path.dirname(path)) == p.mountpoint), None)

    def _place(self, config: MountConfig) -> PoolMember:
        """`config` as the process is sent it: the site's directory there is named by its settings."""
        directory = site_dir_name(site_key(config))
        with self._placing:
            placed = next((p for p in self.processes if directory in p.sites), None)
            process = placed or min(self.processes, key=lambda p: (len(p.sites), p.index))
            process.sites.add(directory)  # reserved now: the site's next classes go here too
        return process

    def start(self, key: str, config: MountConfig, reader: Principal, host: HostSnapshot) -> ClassMount:
        served = dataclasses.replace(
            config.without_keys(), warm_kernel=True, warm_wait_s=self.warm_wait_s
        )  # read into the kernel once; tokens are verified here, never there
        process = self._place(served)
        request = AddView(served.to_dict(), reader.authenticated, sorted(reader.groups))
        for attempt in range(1, START_ATTEMPTS + 1):
            device = process.ensure_running(host)
            process.sites.add(site_dir_name(site_key(served)))  # a restarted process serves nothing yet
            asked_pid, asked_start = process.pid, process.pid_start
            try:  # its refusal passes with its kind (a site that does not exist, a backend down)
                reply = process.control.ask(request, config.session.backend_timeout_s * 3 + self.warm_wait_s + 60)
                break
            except OSError as exc:
                # killed while it was asked (a crash, an operator): the class goes to the process
                # started in its place, as a heal would, rather than failing its sessions
                if attempt == START_ATTEMPTS or asked_pid is None or not _died(asked_pid, asked_start):
                    raise SessionError(f"the serving process did not answer: {exc}") from exc
                log.warning("serving mount %s: pid %d died while asked for a class (%s): serving it in a new one",
                            process.mountpoint, asked_pid, exc)  # fmt: skip
                host = HostSnapshot.take()
        pid, pid_start = process.pid, process.pid_start
        assert pid is not None
        path = os.path.join(process.mountpoint, str(reply["path"]))
        return ClassMount(
            key,
            path,
            pid,
            pid_start,
            config.site,
            reader.describe(),
            device,
            time.time(),
            config=config.to_dict(),
            reader_class=[reader.authenticated, sorted(reader.groups)],
        )

    def open_session(self, mount: ClassMount, session: Session) -> str:
        """The session's own directory in the class's serving process (owner, expiry), to bind."""
        process = self._process_of(mount.path)
        if process is None:
            raise SessionError("the class's serving process is not in the pool")
        path = os.path.relpath(mount.path, process.mountpoint)
        request = OpenViewSession(path, session.uid, session.gid, session.expires_at, session.allow_other)
        try:
            reply = process.control.ask(request)
        except OSError as exc:
            raise SessionError(f"the serving process did not answer: {exc}") from exc
        return os.path.join(process.mountpoint, str(reply["path"]))

    def renew_session(self, mount: ClassMount, source: str, expires_at: float) -> None:
        """The session at `source` expires at `expires_at` in its serving process from now on."""
        process = self._process_of(mount.path)
        if process is None or not source or process_start(mount.pid) != mount.pid_start:
            raise SessionError("the session's serving process is gone")
        try:
            reply = process.control.ask(RenewViewSession(os.path.relpath(source, process.mountpoint), expires_at))
        except OSError as exc:
            raise SessionError(f"the serving process did not answer: {exc}") from exc
        if not reply.get("renewed"):
            raise SessionError("the session has ended in its serving process")

    def end_session(self, mount: ClassMount, source: str) -> None:
        process = self._process_of(mount.path)
        if process is None or not source or process_start(mount.pid) != mount.pid_start:
            return  # that process is gone, and its sessions with it
        try:
            process.control.ask(EndViewSession(os.path.relpath(source, process.mountpoint)))
        except (FileNotFoundError, ConnectionError):
            # refused, or closed without an answer: the process is stopping (it closes a control
            # connection unanswered only then), and its sessions end with it
            log.debug("ending the session %s: its serving process is gone", source)
        except (OSError, ChromafsError) as exc:  # it serves on: the session lives there until its expiry
            log.warning("ending the session %s: %s", source, exc)

    def adopt(self, mount: ClassMount) -> None:
        """A class a previous server left standing: its site stays in its process."""
        process = self._process_of(mount.path)
        if process is not None:
            process.sites.add(os.path.basename(os.path.dirname(mount.path)))

    def stop(self, mount: ClassMount) -> None:
        process = self._process_of(mount.path)
        if process is None or process_start(mount.pid) != mount.pid_start:
            return  # that process is gone, and its views with it
        try:
            reply = process.control.ask(RemoveView(os.path.relpath(mount.path, process.mountpoint)))
        except (OSError, ChromafsError) as exc:
            log.warning("removing the view %s: %s", mount.path, exc)
            return
        if reply.get("site_gone"):
            with self._placing:
                process.sites.discard(os.path.basename(os.path.dirname(mount.path)))

    def alive(self, mount: ClassMount, host: HostSnapshot) -> bool:
        process = self._process_of(mount.path)
        return (
            process is not None
            and host.runs(mount.pid, mount.pid_start)
            and host.device_at(process.mountpoint) == mount.device
        )

    def owns(self, path: str) -> bool:
        return any(path == p.mountpoint for p in self.processes)


def _died(pid: int, start: int | None) -> bool:
    """Whether the process (pid and start time) is gone or a zombie within DEATH_WAIT_S."""
    deadline = time.monotonic() + DEATH_WAIT_S
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                after = f.read().rpartition(b")")[2].split()
            if after[0] in (b"Z", b"X") or int(after[19]) != start:
                return True
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
