"""chromafs-mountd as the "mountd" figure runs it: with the server's own defaults (its pool of
serving processes, one per core, unless `scripts/bench --serving-processes`), sessions opened by
the real client (`chromafs-mount --mountd`) under a deadline each, the serving processes under the
server found (and killed), and everything it started taken down again: sessions unmounted, the
server stopped, its serving processes' mounts unmounted, every process that was under it waited
for (SIGKILL to those left).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import jwt

from bench_lib.procs import run_timed, subtree
from bench_lib.sessions import SECRET, PoolServer, stop_server
from harness.processes import BIN, child_env

CLASS_IDLE_S = 600.0
# the processes serving FUSE mounts, by setproctitle: the pool's, and a daemon of a session's own (--isolated)
SERVING_TITLES = ("chromafs-serving", "chromafs-mount")


def token(site: str, groups: list[str], exp: float) -> str:
    return jwt.encode({"sub": "bench", "site": site, "exp": int(exp), "groups": groups}, SECRET, algorithm="HS256")


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    return ""


def mount_counts(paths: list[Path]) -> dict[Path, int]:
    """How many times each path is a mount point in /proc/self/mountinfo (stacked mounts count each)."""
    from chromafs_fuse.serving.mounttable import unescape

    wanted = {os.path.realpath(p): p for p in paths}
    counts = dict.fromkeys(paths, 0)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and (path := wanted.get(unescape(fields[4]))) is not None:
                counts[path] += 1
    return counts


@dataclass
class Opened:
    """A session request: its mountpoint, and the seconds from starting `chromafs-mount --mountd`
    until `ls` of it was done (None when it failed: `error` says why)."""

    mountpoint: Path
    seconds: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Host:
    """One chromafs-mountd in `folder`, its sessions in `folder`/sessions."""

    def __init__(self, folder: Path, serving_processes: int | None = None) -> None:
        folder.mkdir(parents=True)
        self.folder = folder
        self.sessions = folder / "sessions"
        self.sessions.mkdir()
        self.server = PoolServer(folder, CLASS_IDLE_S, serving_processes)
        self.secret = folder / "secret"
        self.secret.write_text(SECRET)
        self._count = 0
        self._lock = threading.Lock()
        self._clients: set[subprocess.Popen[bytes]] = set()

    def start(self) -> None:
        self.server.start()

    @property
    def pid(self) -> int | None:
        proc = self.server.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _request(
        self, site: str, backend: list[str], groups: list[str] | None, exp: float | None, flags: tuple[str, ...]
    ) -> tuple[Path, list[str]]:
        """A new mountpoint and the chromafs-mount argv of a session there: anonymous (groups None)
        or a token of `groups` expiring at `exp` (default in 12 hours)."""
        with self._lock:
            self._count += 1
            number = self._count
        mountpoint = self.sessions / f"s{number:04d}"
        mountpoint.mkdir()
        argv = [str(BIN / "chromafs-mount"), str(mountpoint), "--site", site, *backend, *flags]
        argv += ["--mountd", str(self.server.socket), "--jwt-secret-file", str(self.secret)]
        if groups is not None:
            token_file = self.sessions / f"s{number:04d}.jwt"
            token_file.write_text(token(site, groups, exp or time.time() + 12 * 3600))
            argv += ["--token-file", str(token_file)]
        return mountpoint, argv

    def open(
        self,
        site: str,
        backend: list[str],
        groups: list[str] | None = None,
        exp: float | None = None,
        flags: tuple[str, ...] = (),
        timeout_s: float = 60.0,
    ) -> Opened:
        """A session, timed to the end of an `ls` of it; a client still waiting after `timeout_s`
        is killed (its request may still be served later: `close` unmounts whatever is there)."""
        mountpoint, argv = self._request(site, backend, groups, exp, flags)
        started = time.perf_counter()
        proc = self.popen(argv)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop_client(proc)
            return Opened(mountpoint, None, f"no answer within {timeout_s:.0f} s")
        finally:
            with self._lock:
                self._clients.discard(proc)
        if proc.returncode != 0:
            return Opened(mountpoint, None, err.decode(errors="replace").strip() or f"exit {proc.returncode}")
        left = max(1.0, timeout_s - (time.perf_counter() - started))
        try:
            listed = run_timed(["ls", str(mountpoint)], timeout=left)
        except subprocess.TimeoutExpired:
            return Opened(mountpoint, None, "mounted, but `ls` did not answer")
        took = time.perf_counter() - started
        if listed.returncode != 0:
            return Opened(mountpoint, None, f"mounted, but `ls` failed: {listed.stderr.decode().strip()}")
        return Opened(mountpoint, took)

    def open_in_background(
        self, site: str, backend: list[str], groups: list[str] | None = None, flags: tuple[str, ...] = ()
    ) -> tuple[Path, subprocess.Popen[bytes]]:
        """A session request left running: its mountpoint and client (stop it with `stop_client`)."""
        mountpoint, argv = self._request(site, backend, groups, None, flags)
        return mountpoint, self.popen(argv)

    def popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()
        )
        with self._lock:
            self._clients.add(proc)
        return proc

    def stop_client(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        with self._lock:
            self._clients.discard(proc)

    def serving_processes(self) -> list[int]:
        """Every process under the server (not the server itself): what serves its mounts."""
        pid = self.pid
        return [] if pid is None else subtree(pid)

    def serving_children(self) -> list[tuple[int, str]]:
        """The processes under the server (its children, or their children: a forker's) that serve
        FUSE mounts under its class root, with their titles (`chromafs-serving <class root>...`,
        `chromafs-mount <class root>/...`)."""
        root = str(self.server.class_root)
        out = []
        for pid in sorted(set(self.serving_processes())):
            title = cmdline(pid)
            if title.startswith(SERVING_TITLES) and root in title:
                out.append((pid, title))
        return out

    def close(self) -> None:
        """Stop the clients still waiting, unmount every session, stop the server, unmount its
        serving processes' mounts and wait for every process that was under it (SIGKILL after 30 s)."""
        with self._lock:
            clients = list(self._clients)
        for proc in clients:
            self.stop_client(proc)
        stop_server(self.server, self.folder, self.sessions)
