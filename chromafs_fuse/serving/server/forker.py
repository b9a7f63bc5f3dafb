"""The mount server's forker: one single-threaded process that forks every serving process.

The mount server answers requests on threads, and a fork from a threaded process copies only
the forking thread: a lock another thread held at that moment (a Redis pool, stdio, the import
lock) stays locked in the child for good. So the server forks this process once, before any
thread starts, with every module already imported, and asks it over a socketpair to fork the
real children (a serving process of the pool, an `--isolated` session's daemon). Each child
still shares the server's imported modules copy-on-write.

A job is a request of serving/protocol.py's FORKER_JOBS, one line of its codec, plus at most a
few file descriptors sent with it (SCM_RIGHTS); the child runs the function the server's table
names for it (`jobs`), and the answer is the child's pid. The forker ends when the server's end
of the socketpair closes, whatever way the server ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from chromafs_fuse.errors import Unavailable
from chromafs_fuse.serving.process import process_start
from chromafs_fuse.serving.protocol import FORKER_JOBS, Request, decode, encode

log = logging.getLogger("chromafs.mountd")
MAX_JOB_BYTES = 1 << 20
MAX_FDS = 4
PID = struct.Struct("i")


class Closable(Protocol):
    def close(self) -> None: ...


# a job's op -> what the child runs: run(*fds, job), its return value the exit status
Jobs = Mapping[str, Callable[..., int]]


class ForkerGone(Unavailable):
    """The forker process is gone: no child can be started."""


class Forker:
    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.pid_start = process_start(pid)
        self._lock = threading.Lock()  # one job on the socketpair at a time
        self.gone = threading.Event()  # set once a job finds it gone: the server must restart

    @classmethod
    def start(cls, jobs: Jobs, close_in_child: Sequence[Closable] = ()) -> Forker:
        """Fork the forker (call before any thread starts); `jobs`: what a child runs for each
        job; `close_in_child`: the server's listeners, which no serving process may hold."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                for listener in close_in_child:
                    listener.close()
                code = _serve_jobs(theirs, jobs)
            finally:
                os._exit(code)
        theirs.close()
        return cls(ours, pid)

    def spawn(self, job: Request, fds: Sequence[int] = ()) -> int:
        """Fork a child for `job`, handing it `fds` (duplicated into it); its pid."""
        payload = encode(job)
        with self._lock:
            try:
                socket.send_fds(self._sock, [payload], list(fds))
                answer = self._sock.recv(PID.size)
            except OSError as exc:
                self.gone.set()
                raise ForkerGone(f"the mount server's forker is gone: {exc.strerror or exc}") from exc
        if len(answer) != PID.size:
            self.gone.set()
            raise ForkerGone("the mount server's forker is gone")
        (pid,) = PID.unpack(answer)
        if pid <= 0:
            raise ForkerGone("the mount server's forker could not fork")
        return int(pid)

    def alive(self) -> bool:
        try:
            return process_start(self.pid) == self.pid_start
        except OSError:  # short of descriptors: it cannot be told, so it is not taken for dead
            return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _serve_jobs(sock: socket.socket, jobs: Jobs) -> int:
    """The forker's loop: fork a child per job until the server's end closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # it ends with the server, never before
    while True:
        try:
            payload, fds, _flags, _addr = socket.recv_fds(sock, MAX_JOB_BYTES, MAX_FDS)
        except OSError:
            return 1
        if not payload:
            return 0
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:
            sock.close()
            _run_child(payload, fds, jobs)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(PID.pack(pid))
        except OSError:
            return 1


def _run_child(payload: bytes, fds: list[int], jobs: Jobs) -> None:
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        job = decode(payload, FORKER_JOBS)
        code = jobs[job.op](*fds, job)
    except BaseException:  # the child must never return into the forker's loop
        log.exception("a forked serving process failed to start")
    finally:
        logging.shutdown()
        os._exit(code)
