"""Processes the benchmark starts: `chroma run`, `redis-server`, and timed commands.

Every server is started on a free loopback port and stopped by its PID; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
CMD_TIMEOUT_S = 1800.0


def child_env() -> dict[str, str]:
    """The environment of every child: no token or backend taken from ours, no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHROMAFS_", "CHROMA_", "AWS_"))}
    env["ANONYMIZED_TELEMETRY"] = "False"
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["LC_ALL"] = "C"
    return env


def become_subreaper() -> None:
    """Adopt the mount daemons once their `chromafs-mount` parent exits, so we can reap them and
    read their exit status (PR_SET_CHILD_SUBREAPER)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Timed:
    seconds: float
    returncode: int
    stdout: bytes
    stderr: bytes


def run_timed(argv: list[str], timeout: float = CMD_TIMEOUT_S) -> Timed:
    """Run a command to completion; wall time from spawn to exit."""
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, timeout=timeout, env=child_env(), stdin=subprocess.DEVNULL)
    return Timed(time.perf_counter() - started, proc.returncode, proc.stdout, proc.stderr)


def run_checked(argv: list[str], what: str, timeout: float = CMD_TIMEOUT_S) -> Timed:
    result = run_timed(argv, timeout)
    if result.returncode != 0:
        tail = result.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {tail}")
    return result


def stop_pid(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process we started, then SIGKILL it if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


class ChromaServer:
    def __init__(self, data: Path, log: Path) -> None:
        self.data, self.log = data, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 60.0) -> None:
        argv = [str(BIN / "chroma"), "run", "--path", str(self.data), "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env()
            )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/api/v2/heartbeat", timeout=1):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"chroma run exited with {self.proc.returncode}; see {self.log}")
            time.sleep(0.2)
        raise RuntimeError(f"chroma run did not answer within {wait_s:.0f}s")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)


class RedisServer:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 20.0) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.folder)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.cli("ping") == "PONG":
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer within {wait_s:.0f}s")

    def cli(self, *args: str) -> str:
        argv = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

    def flushall(self) -> None:
        if self.cli("flushall") != "OK":
            raise RuntimeError("redis-cli flushall failed")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)


class MountServer:
    """chromafs-mountd on a Unix socket in the run's temp dir."""

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "mountd.sock"
        self.log = folder / "mountd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 60.0) -> None:
        argv = [str(BIN / "chromafs-mountd"), "--socket", str(self.socket), "--log-file", str(self.log)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=child_env())
        deadline = time.monotonic() + wait_s
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromafs-mountd did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)
