"""What the tests run and check against, in one place.

- Processes and servers: scripts/harness, which the benchmarks use too (its names are importable
  from here): the servers (`chroma run`, `redis-server`, moto's S3 server, chromafs-csi,
  `chromafs-mountd`), each on a free loopback port or a socket of its own and stopped by its PID;
  unmounting; waiting for a daemon to exit; the chromafs mounts under a directory; ingesting and
  mounting with the real CLIs. Here: a mount server with one serving process (SharedServer),
  `redis-cli monitor`, and `wait_until`, the one bounded wait.
- The daemons' logs, checked when each test ends; where a site is kept (`Backend`: as the CLIs'
  flags spell it).
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
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self, TypeVar

import yaml

# scripts/harness: the processes and servers the tests share with the benchmarks
_SCRIPTS = str(Path(__file__).resolve().parent.parent / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.append(_SCRIPTS)

# the tests import these from here too (pyproject.toml: F401 is not checked in this file)
from harness.processes import (  # noqa: E402
    BIN,
    HOST,
    INGEST,
    MOUNT,
    REPO,
    SAMPLE_SITE,
    child_env,
    free_port,
    ingest,
    is_mounted,
    mounted,
    mounts_under,
    poll_until,
    stop_pid,
    try_mount,
    unmount,
    wait_gone,
    watched_log_files,
)
from harness.servers import (  # noqa: E402
    ChromaServer,
    CsiPlugin,
    MountServer,
    RedisServer,
    S3Server,
    Server,
    running_mount_server,
)

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


class SharedServer(MountServer):
    """chromafs-mountd with one serving process: every reader class a view of ONE mount, `serving`."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--serving-processes", "1"]

    @property
    def shared(self) -> Path:
        return self.class_root / "serving"


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
        shared = [p for p in mounts_under(server.class_root) if p.parent == server.class_root]  # serving, serving-1..
        for root in (*also, folder):
            for path in mounts_under(root):
                if path not in shared:
                    unmount(path)
        for path in [server.shared, *shared]:
            unmount(path)


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


def in_child_as(uid: int, gid: int, cwd: Path, job: Callable[[], tuple[int, bytes]]) -> tuple[int, bytes]:
    """`job` run in a forked child as `uid` and group `gid` (no supplementary groups), in `cwd`:
    its exit status and the bytes it handed back (a traceback's text when it raised)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code, out = 99, b""
        try:
            os.close(reader)
            os.chdir(cwd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            code, out = job()
        except BaseException:
            out += traceback.format_exc().encode()
        finally:
            with contextlib.suppress(BaseException):
                os.write(writer, out)
            os._exit(code)
    os.close(writer)
    with os.fdopen(reader, "rb") as answer:
        out = answer.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out
