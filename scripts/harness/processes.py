"""Processes, mounts and the real CLIs: where they are (BIN), a child's environment, stopping a
process (stop_pid) and waiting for it to go (wait_gone, wait_exit), the chromafs mounts under a
directory (mounts_under) and unmounting them (unmount, unmount_daemon), chromafs-ingest (ingest)
and chromafs-mount (try_mount, mounted), and the log files of the chromafs daemons started
(watch_log: tests/infra.py checks them when each test ends). Every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from chromafs_fuse.serving.mounttable import is_mounted, mounts

BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
SAMPLE_SITE = REPO / "chromafs_fuse" / "sample_site"
MOUNT = str(BIN / "chromafs-mount")
INGEST = str(BIN / "chromafs-ingest")

T = TypeVar("T")


def child_env() -> dict[str, str]:
    """The environment of a child: no token or backend taken from ours, no telemetry; the runtime
    folder the caller chose (CHROMAFS_RUNTIME_DIR) kept."""
    kept = ("CHROMAFS_RUNTIME_DIR",)
    env = {k: v for k, v in os.environ.items() if k in kept or not k.startswith(("CHROMAFS_", "CHROMA_", "AWS_"))}
    env["ANONYMIZED_TELEMETRY"] = "False"
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["LC_ALL"] = "C"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def stop_pid(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM a process we started, then SIGKILL it if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


def log_tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n    ".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def poll_until(
    predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.1, ignoring: tuple[type[Exception], ...] = ()
) -> T | None:
    """Call `predicate` every `interval_s` until it returns something true, for at most `timeout_s`: its
    last answer (None if that call raised one of `ignoring`, exceptions that count as "not yet")."""
    deadline = time.monotonic() + timeout_s
    answer: T | None = None
    while True:
        try:
            answer = predicate()
        except ignoring:
            answer = None
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(interval_s)


# the log files of the chromafs daemons started, which tests/infra.py checks when each test ends
_watched_logs: list[Path] = []  # a chromafs daemon's log file, or a folder whose *.log are (serving processes)


def watch_log(path: Path | str) -> None:
    """Check the log file (or every *.log in the folder) `path` of a chromafs daemon when tests end."""
    path = Path(path)
    if str(path) != os.devnull and path not in _watched_logs:
        _watched_logs.append(path)


def watched_log_files() -> list[Path]:
    files: list[Path] = []
    for path in _watched_logs:
        files += sorted(path.glob("*.log")) if path.is_dir() else [path]
    return files


def mounts_under(root: Path) -> list[Path]:
    prefix = os.path.realpath(root) + "/"
    return [Path(entry.target) for entry in mounts() if entry.target.startswith(prefix)]


def _fusermount(*args: str) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["fusermount3", *args], capture_output=True, check=False, timeout=30)


def unmount(path: Path) -> None:
    """fusermount3 -u, retried for about five seconds, then -uz as the fallback."""
    for _ in range(50):
        if not is_mounted(path):
            return
        _fusermount("-u", str(path))
        if not is_mounted(path):
            return
        time.sleep(0.1)
    _fusermount("-u", "-z", str(path))


def _exited(pid: int) -> bool:
    """The process has exited (a zombie counts: only its parent's wait is left)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def wait_gone(pid: int, timeout_s: float = 15.0) -> bool:
    """True once the process has exited, False if it still runs after `timeout_s`."""
    return poll_until(lambda: _exited(pid), timeout_s, 0.02) is True


def wait_exit(pid: int, timeout_s: float = 10.0) -> int | None:
    """Wait for a daemon to exit (after its unmount), SIGKILL it if it does not; its exit status when
    we could reap it (our child, or adopted because we are a subreaper), else None."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours to reap: watch it instead
            if wait_gone(pid, max(0.0, deadline - time.monotonic())):
                return None
            break
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return -signal.SIGKILL


def unmount_daemon(path: Path, pid: int | None, timeout_s: float = 10.0) -> int | None:
    """Unmount `path` and wait for its daemon `pid` as `wait_exit` does."""
    unmount(path)
    return None if pid is None else wait_exit(pid, timeout_s)


def ingest(source: Path, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    """Run chromafs-ingest; its exit status must be `status` (0 clean, 3 with errors, 4 nothing ingested)."""
    proc = subprocess.run([INGEST, str(source), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == status, proc.stderr
    return proc


def try_mount(mountpoint: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if "--log-file" in args[:-1]:
        watch_log(args[args.index("--log-file") + 1])
    full_env = {k: v for k, v in os.environ.items() if k != "CHROMAFS_TOKEN"}
    full_env.update(env or {})
    return subprocess.run(
        [MOUNT, str(mountpoint), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def mounted(mountpoint: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Path]:
    """Mount with the real CLI (background daemon); unmount even if the test fails."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_file = mountpoint.parent / f"{mountpoint.name}.log"
    pid_file = mountpoint.parent / f"{mountpoint.name}.pid"
    proc = try_mount(mountpoint, *args, "--log-file", str(log_file), "--pid-file", str(pid_file), env=env)
    try:
        assert proc.returncode == 0, f"mount failed: {proc.stderr}"
        assert is_mounted(mountpoint)
        yield mountpoint
    finally:
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
        unmount_daemon(mountpoint, pid, 5)
