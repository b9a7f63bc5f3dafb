"""What the tests (and `scripts/`) run and check against, in one place.

- Processes: the servers (`chroma run`, `redis-server`, moto's S3 server, `chromafs-mountd`), each on a
  free loopback port or a socket of its own and stopped by its PID; unmounting; waiting for a daemon to
  exit; the chromafs mounts under a directory; `wait_until`, the one bounded wait.
- Mounting and ingesting with the real CLIs (`Backend`: where a site is kept, as their flags), always
  unmounting.
- The sample site as each reader should see it, derived independently of the ingest code.

Every wait is bounded. A server that exits or does not answer in time is stopped, and the error carries
the tail of its log (its stdout and stderr).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self, TypeVar

import yaml

from chromafs_fuse.serving.mounttable import is_mounted, mounts

BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
SAMPLE_SITE = REPO / "chromafs_fuse" / "sample_site"
MOUNT = str(BIN / "chromafs-mount")
INGEST = str(BIN / "chromafs-ingest")

CORPORA = REPO.parent / "shared" / "corpora"  # real docs repositories beside the checkout, read-only

T = TypeVar("T")


def need_corpus(path: Path) -> Path:
    """`path` (under CORPORA), or the test ends: it fails in CI (CI set, as .ci/run and GitHub Actions
    set it), where a missing corpus must not pass silently, and is skipped, saying why, elsewhere."""
    import pytest

    if not path.is_dir():
        why = f"no corpus at {path} (the real repositories beside the checkout: tests/data/README.md)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI is set: the corpus tests must run", pytrace=False)
        pytest.skip(why)
    return path


def child_env() -> dict[str, str]:
    """The environment of a child: no token or backend taken from ours, no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHROMAFS_", "CHROMA_", "AWS_"))}
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


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


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


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """`poll_until`, and an AssertionError naming `what` (what was waited for) if it timed out."""
    answer = poll_until(predicate, timeout_s, interval_s, ignoring)
    if not answer:
        raise AssertionError(f"not within {timeout_s:.3g}s: {what}")
    return answer


def hold_for(seconds: float, why: str) -> None:
    """Let `seconds` pass on purpose: the time itself is what is tested or simulated (a slow backend, the
    pace of a load, "nothing happens for a while"), never a wait for something to be ready (`wait_until`).
    `why` says which, for the reader."""
    assert why
    time.sleep(seconds)


async def trio_hold_for(seconds: float, why: str) -> None:
    """`hold_for` in a trio task (the other tasks run meanwhile)."""
    import trio

    assert why
    await trio.sleep(seconds)


async def trio_wait_until(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.01
) -> None:
    """`wait_until` in a trio task: check `predicate` every `interval_s` (the other tasks run meanwhile)
    for at most `timeout_s`."""
    import trio

    deadline = trio.current_time() + timeout_s
    while not predicate():
        if trio.current_time() > deadline:
            raise AssertionError(f"not within {timeout_s:.3g}s: {what}")
        await trio.sleep(interval_s)


def file_changed(path: Path, timeout_s: float, what: str) -> bytes:
    """Wait until `path` holds other bytes than now (it is rewritten: a status file, a state journal);
    its new content."""
    try:
        before: bytes | None = path.read_bytes()
    except OSError:
        before = None

    def fresh() -> bytes | None:
        now = path.read_bytes()
        return now if now != before else None

    return wait_until(fresh, timeout_s, what, 0.05, ignoring=(OSError,))


def fresh_status(pid: int, after: float, timeout_s: float = 15.0) -> dict[str, object]:
    """The status file of the daemon or serving process `pid` once it describes the process later
    than `after` (a time.time()): its `written_at` is past it. A writer that stalls fails the wait."""
    from chromafs_fuse.serving.status import runtime_dir

    path = Path(runtime_dir()) / f"{pid}.json"

    def fresh() -> dict[str, object] | None:
        status = json.loads(path.read_text())
        return status if float(status.get("written_at", 0)) > after else None

    return wait_until(fresh, timeout_s, f"a status of {pid} written after {after:.2f}", 0.05, (OSError, ValueError))


# -- the daemons' logs, checked when each test ends (conftest's `_daemon_logs`) --------------------

# A line that fails a test unless the test expects it: a traceback, or a record at WARNING or above,
# in the text format of chromafs_fuse/logs.py or its JSON lines.
BAD_LOG_LINE = re.compile(
    r"Traceback \(most recent call last\)|chromafs\[\d+\] (WARNING|ERROR|CRITICAL) "
    r'|"level": "(warning|error|critical)"'
)
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


def log_sizes() -> dict[Path, int]:
    """How far each watched log is written now: the next check reads from there."""
    sizes = {}
    for path in watched_log_files():
        with contextlib.suppress(OSError):
            sizes[path] = path.stat().st_size
    return sizes


def unexpected_log_lines(since: dict[Path, int], expected: list[re.Pattern[str]]) -> list[str]:
    """The bad lines written to the watched logs after `since` (a `log_sizes()`) that no pattern of
    `expected` matches, each named by its file; a traceback counts as one line with its last line
    (the exception) appended, so that an expectation can name the exception."""
    found = []
    for path in watched_log_files():
        try:
            with path.open("rb") as f:
                f.seek(since.get(path, 0))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if not BAD_LOG_LINE.search(line):
                continue
            if "Traceback (most recent call last)" in line:
                end = i + 1
                while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
                    end += 1
                line = f"{line} ... {lines[end] if end < len(lines) else ''}"
            if not any(pattern.search(line) for pattern in expected):
                found.append(f"{path}: {line}")
    return found


class Server(ABC):
    """A server process we start, wait for until it answers, and stop by its PID."""

    name: str
    wait_s: float

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env: dict[str, str] = {}  # on top of child_env(): an S3 endpoint's credentials

    @abstractmethod
    def argv(self) -> list[str]: ...

    @abstractmethod
    def ready(self) -> bool: ...

    def start(self) -> None:
        self.watch_logs()
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # logs name pages and groups
        try:
            env = {**child_env(), **self.extra_env}
            self.proc = subprocess.Popen(
                self.argv(), stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        finally:
            os.close(fd)
        deadline = time.monotonic() + self.wait_s
        while not self.ready():
            if self.proc.poll() is not None:
                failure = f"exited with {self.proc.returncode}"
            elif time.monotonic() > deadline:
                failure = f"did not answer within {self.wait_s:.0f}s"
            else:
                time.sleep(0.1)
                continue
            self.stop()
            raise RuntimeError(f"{self.name} {failure}; {self.log}:\n    {log_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)

    def watch_logs(self) -> None:
        """Which of its logs the tests check (`watch_log`): none of a server that is not chromafs's."""
        return None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ChromaServer(Server):
    """`chroma run` on its data directory `data`; it logs to `data` + ".log"."""

    name = "chroma run"
    wait_s = 60.0

    def __init__(self, data: Path) -> None:
        super().__init__(data.with_name(f"{data.name}.log"))
        self.data = data
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [str(BIN / "chroma"), "run", "--path", str(self.data), "--host", HOST, "--port", str(self.port)]

    def ready(self) -> bool:
        return _answers(f"{self.url}/api/v2/heartbeat")


class RedisServer(Server):
    """`redis-server` without persistence, its files in `folder`."""

    name = "redis-server"
    wait_s = 20.0

    def __init__(self, folder: Path, *options: str, cli_options: tuple[str, ...] = ()) -> None:
        """`options`: more of redis-server's own (cluster mode, TLS); `cli_options`: what redis-cli
        then needs to reach it."""
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder / "redis.log")
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self.options = options
        self.cli_options = cli_options

    def argv(self) -> list[str]:
        argv = ["redis-server", "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        return [*argv, "--dir", str(self.folder), *self.options]

    def ready(self) -> bool:
        return self.cli("ping") == "PONG"

    def kill(self) -> None:
        """SIGKILL, as a crashed or lost node."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def cli(self, *args: str) -> str:
        argv = ["redis-cli", "-h", HOST, "-p", str(self.port), *self.cli_options, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()

    def flushall(self) -> None:
        if self.cli("flushall") != "OK":
            raise RuntimeError("redis-cli flushall failed")


def redis_subscribed(*servers: RedisServer) -> bool:
    """Someone (a mount) listens on a channel of one of `servers`, sharded or not."""
    return any(server.cli("PUBSUB", kind, "*").strip() for server in servers for kind in ("CHANNELS", "SHARDCHANNELS"))


class RedisMonitor:
    """`redis-cli monitor` on `server`: the commands it ran between `with` and `seen()`."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = b""

    def _read_until(self, token: bytes, timeout_s: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while token not in self.out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"redis-cli monitor: no {token!r} within {timeout_s:.3g}s")
            if select.select([fd], [], [], left)[0]:
                more = os.read(fd, 65536)
                if not more:
                    raise AssertionError(f"redis-cli monitor ended before {token!r}")
                self.out += more

    def __enter__(self) -> Self:
        argv = ["redis-cli", "-h", HOST, "-p", str(self.server.port), *self.server.cli_options, "monitor"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self._read_until(b"OK", 10)  # monitoring from now on
        return self

    def seen(self) -> str:
        """Every command seen so far: up to a marker the test sends now, so none before it is missed."""
        marker = f"chromafs-monitor-mark-{time.monotonic_ns()}"
        self.server.cli("echo", marker)
        self._read_until(marker.encode(), 10)
        return self.out.decode(errors="replace")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_pid(self.proc)  # type: ignore[arg-type]
            if self.proc.stdout is not None:
                self.proc.stdout.close()


class S3Server(Server):
    """moto's S3 server; `env` points the AWS SDK of a child at it."""

    name = "moto_server"
    wait_s = 30.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "moto.log")
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }

    def argv(self) -> list[str]:
        return [str(BIN / "moto_server"), "-H", HOST, "-p", str(self.port)]

    def ready(self) -> bool:
        return _answers(f"{self.url}/moto-api/")

    def client(self) -> object:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )


class CsiPlugin(Server):
    """chromafs-csi on the unix socket `folder`/csi.sock, asking the mount server on `mountd`."""

    name = "chromafs-csi"
    wait_s = 30.0

    def __init__(self, folder: Path, mountd: Path, *flags: str, node_id: str = "node-1") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder / "csi.log")
        self.socket = folder / "csi.sock"
        self.mountd = mountd
        self.flags = flags
        self.node_id = node_id

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "chromafs_fuse.cli.csi", "--endpoint", f"unix://{self.socket}"]
        return [*argv, "--mountd", str(self.mountd), "--node-id", self.node_id, *self.flags]

    def ready(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True


class MountServer(Server):
    """chromafs-mountd on the Unix socket `folder`/mountd.sock, its class mounts in
    `folder`/classes (as root; `isolated`: a daemon per mount instead)."""

    name = "chromafs-mountd"
    wait_s = 60.0

    def __init__(
        self, folder: Path, isolated: bool = False, class_idle_s: float = 300.0, metrics_port: int | None = None
    ) -> None:
        super().__init__(folder / "mountd.log")
        self.socket = folder / "mountd.sock"
        self.class_root = folder / "classes"
        self.isolated = isolated
        self.class_idle_s = class_idle_s
        self.metrics_port = metrics_port

    def watch_logs(self) -> None:
        watch_log(self.log)
        watch_log(self.class_root)  # the serving processes'

    def argv(self) -> list[str]:
        argv = [str(BIN / "chromafs-mountd"), "--socket", str(self.socket), "--log-file", str(self.log)]
        argv += ["--class-root", str(self.class_root), "--class-idle", str(self.class_idle_s)]
        if self.metrics_port is not None:
            argv += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        return [*argv, "--isolated-only"] if self.isolated else argv

    def ready(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))  # not just the file: a killed server leaves it
            except OSError:
                return False
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would: class mounts and sessions stay."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def unmount_classes(self) -> None:
        """Unmount what the server's class mounts left (sessions are the test's own)."""
        for path in mounts_under(self.class_root):
            unmount(path)


@contextlib.contextmanager
def running_mount_server(
    folder: Path,
    *also: Path,
    isolated: bool = False,
    class_idle_s: float = 300.0,
    metrics_port: int | None = None,
) -> Iterator[MountServer]:
    """chromafs-mountd in `folder` (options as MountServer's); afterwards every mount under `folder` and
    `also` is unmounted, the test's sessions and the server's class mounts alike."""
    server = MountServer(folder, isolated=isolated, class_idle_s=class_idle_s, metrics_port=metrics_port)
    try:
        with server:
            yield server
    finally:
        for root in (*also, folder):
            for path in mounts_under(root):
                unmount(path)


class SharedServer(MountServer):
    """chromafs-mountd with one serving process: every reader class a view of ONE mount, `shared`."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--serving-processes", "1"]

    @property
    def shared(self) -> Path:
        return self.class_root / "shared"


@contextlib.contextmanager
def running_shared_server(
    folder: Path, *also: Path, class_idle_s: float = 300.0, metrics_port: int | None = None
) -> Iterator[SharedServer]:
    """A SharedServer in `folder` (made if missing); afterwards every mount under `also` and `folder` is
    unmounted, the sessions (binds of the shared mount) before the shared mount itself."""
    folder.mkdir(parents=True, exist_ok=True)
    server = SharedServer(folder, class_idle_s=class_idle_s, metrics_port=metrics_port)
    try:
        with server:
            yield server
    finally:
        shared = [p for p in mounts_under(server.class_root) if p.parent == server.class_root]  # shared, shared-1..
        for root in (*also, folder):
            for path in mounts_under(root):
                if path not in shared:
                    unmount(path)
        for path in [server.shared, *shared]:
            unmount(path)


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


def blocked_in_fuse(pid: int) -> bool:
    """The process sleeps in the kernel waiting for a FUSE daemon's answer (where /proc hides the
    kernel function it waits in: sleeps in an open, a stat or a read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    if state not in ("S", "D"):
        return False
    if wchan not in ("", "0"):
        return "fuse" in wchan or wchan == "request_wait_answer"
    return syscall in ("0", "257", "262", "332")  # read, openat, newfstatat, statx (x86-64)


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


# -- mounting and ingesting with the real CLIs ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Backend:
    """Where a site is kept, as chromafs-ingest's and chromafs-mount's flags spell it (`args`): an
    embedded Chroma (`chroma_path`) or a `chroma run` (`chroma_url`), and a Redis in front (`redis_url`)."""

    site: str
    chroma_path: Path | None = None
    chroma_url: str | None = None
    redis_url: str | None = None

    @property
    def args(self) -> list[str]:
        args = ["--site", self.site]
        if self.chroma_path is not None:
            args += ["--chroma-path", str(self.chroma_path)]
        if self.chroma_url is not None:
            args += ["--chroma-url", self.chroma_url]
        if self.redis_url is not None:
            args += ["--redis-url", self.redis_url]
        return args


def reader_args(token: Path | None, secret_file: Path) -> list[str]:
    """The flags of a reader with the token in the file `token`, checked with `secret_file`; none for
    an anonymous reader (token None)."""
    return [] if token is None else ["--token-file", str(token), "--jwt-secret-file", str(secret_file)]


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


# Shared objects that `import chromadb` maps into a process. chromadb itself is pure Python, so
# its own name alone would never show in the maps.
CHROMADB_FOOTPRINT = ("chromadb", "/numpy/", "pydantic_core", "/grpc/")


def chromadb_libraries_loaded(mnt: Path) -> list[str]:
    """The chromadb-related shared objects mapped into the daemon of `mnt` (mounted by `mounted`)."""
    pid = int((mnt.parent / f"{mnt.name}.pid").read_text())
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "pyfuse3" in maps  # the right process, and its maps are readable
    return sorted({line.split()[-1] for line in maps.splitlines() if any(s in line for s in CHROMADB_FOOTPRINT)})


def kernel_open_mode(mnt: Path) -> str:
    """What `chromafs status` says of the mount: "skipped" (no-open mode) or "per open"."""
    out = run([str(BIN / "chromafs"), "status", "--json"])
    (mine,) = [s for s in json.loads(out.stdout) if s["mountpoint"] == str(mnt)]
    return str(mine["kernel_open"])


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def tree_listing(root: Path) -> set[str]:
    """Every file and directory under root, relative, via the real `find`."""
    out = subprocess.run(["find", ".", "-mindepth", "1"], cwd=root, capture_output=True, timeout=120, check=True)
    return {p[2:] for p in out.stdout.decode("utf-8").split("\n") if p}


# -- what the sample site should look like, derived independently of the ingest code --

NAVIGATION_PUBLIC = {"index", "quickstart", "guides/migration"}  # public groups of sample_site/docs.json


def sample_access(site: Path, default: str) -> dict[str, tuple[bool, frozenset[str]]]:
    """relative path -> (public, groups) for every file of the sample site."""
    table: dict[str, tuple[bool, frozenset[str]]] = {}
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(site).as_posix()
        public, groups, said = False, frozenset(), False
        if path.suffix in (".md", ".mdx"):
            text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
            if text.startswith("---\n"):
                front = yaml.safe_load(text.split("---\n")[1]) or {}
                if "public" in front or "groups" in front:
                    said = True
                    public = bool(front.get("public", False))
                    groups = frozenset(front.get("groups") or [])
            if not said and rel.rsplit(".", 1)[0] in NAVIGATION_PUBLIC:
                said, public = True, True
        if not said:
            public = default == "public"
        table[rel] = (public, groups)
    return table


def expected_visible(site: Path, default: str, user_groups: set[str] | None) -> set[str]:
    """user_groups None = anonymous; a set = a valid token with those groups."""
    visible = set()
    for rel, (public, groups) in sample_access(site, default).items():
        if public or (user_groups is not None and (not groups or groups & user_groups)):
            visible.add(rel)
    return visible


def copy_subset(site: Path, files: set[str], dest: Path) -> Path:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, target)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def source_files(root: Path) -> dict[str, Path]:
    """Every regular file a default ingest takes (dot files and dot folders are skipped)."""
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def expand(spec: str | list[str], everything: set[str], errors: set[str]) -> set[str]:
    if isinstance(spec, list):
        return set(spec)
    if spec == "all":
        return everything
    if spec == "all but errors":
        return everything - errors
    assert spec.startswith("all but "), spec
    return everything - set(spec.removeprefix("all but ").split(", "))
