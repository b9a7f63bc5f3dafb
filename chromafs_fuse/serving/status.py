"""A status file per mount for `chromafs status`, in a runtime directory. No token or page
content ever goes into it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chromafs_fuse.serving.mounttable import mounts
from chromafs_fuse.serving.process import process_start

if TYPE_CHECKING:
    from chromafs_fuse.access import Principal
    from chromafs_fuse.inodes import InodeTable

log = logging.getLogger("chromafs.status")


STATUS_EVERY_S = 2.0  # how often a mount's or a serving process's status file is written
RUNTIME_ENV = "CHROMAFS_RUNTIME_DIR"  # instead of /run/chromafs: a test run, a second server's world


def runtime_bases() -> list[str]:
    """Where runtime state goes, first choice first: $CHROMAFS_RUNTIME_DIR alone when set, else
    /run/chromafs, else a per-user temp dir."""
    given = os.environ.get(RUNTIME_ENV)
    if given:
        return [given]
    return ["/run/chromafs", os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chromafs-{os.getuid()}")]


def runtime_dir() -> str:
    """Where mounts publish their status: <runtime base>/mounts (runtime_bases)."""
    for base in runtime_bases():
        path = os.path.join(base, "mounts")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    return ""


def session_status_path(mountpoint: str) -> str:
    """Where the mount server keeps the status of its session at `mountpoint` ("" when nowhere)."""
    directory = runtime_dir()
    digest = hashlib.sha256(mountpoint.encode()).hexdigest()[:16]
    return os.path.join(directory, f"session-{digest}.json") if directory else ""


def write_private_json(path: str, data: object) -> None:
    """Replace `path` with `data` as JSON in one step, readable by its owner only."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        # one C-encoded string (json.dump writes piece by piece); the newline lets lines follow
        f.write(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def utc_text(seconds: float | None) -> str:
    """A time for a log line: ISO 8601 in UTC, "-" for none."""
    return "-" if seconds is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class StatusFile:
    """A small JSON file describing this mount, rewritten every few seconds."""

    def __init__(self, describe: Callable[[], dict[str, Any]]) -> None:
        self.describe = describe
        directory = runtime_dir()
        self.path = os.path.join(directory, f"{os.getpid()}.json") if directory else ""
        self.pid_start = process_start(os.getpid())

    def described(self) -> dict[str, Any]:
        """The mount's status now, with `written_at`: the moment it was described (what a reader of the
        file, such as a test, can wait for to be past)."""
        return {**self.describe(), "written_at": time.time()}

    def write(self) -> None:
        if self.path:
            self.write_described(self.described())

    def write_described(self, status: dict[str, Any]) -> None:
        """Write a status already described (blocking: a process serving many views encodes and
        writes it off its loop)."""
        if not self.path:
            return
        try:
            write_private_json(self.path, {**status, "pid_start": self.pid_start})
        except OSError as exc:
            log.debug("cannot write status file %s: %s", self.path, exc)

    def remove(self) -> None:
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


async def keep_written(status: StatusFile) -> None:
    """Until cancelled, every STATUS_EVERY_S: the status described on the loop (one moment) and
    encoded and written off it (with a thousand views that is tens of milliseconds)."""
    import trio

    while True:
        await trio.sleep(STATUS_EVERY_S)
        await trio.to_thread.run_sync(status.write_described, status.described())


def read_statuses() -> list[dict[str, Any]]:
    """Status of every live chromafs mount of this machine that this user can see."""
    mounted = {entry.target: entry.source for entry in mounts() if entry.fstype == "fuse.chromafs"}
    statuses = []
    seen = set()
    directory = runtime_dir()
    for name in sorted(os.listdir(directory)) if directory else []:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                status = json.load(f)
            pid = int(status["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a file being written
        started = process_start(pid)
        if started is None or status.get("pid_start", started) != started:
            # Left by a daemon that was killed; its pid may belong to another process by now.
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if status.get("mountpoint") in mounted:
            statuses.append(status)
            seen.add(status["mountpoint"])
    for mountpoint, source in mounted.items():
        if mountpoint not in seen:
            statuses.append({"mountpoint": mountpoint, "site": source.partition(":")[2], "pid": None})
    return statuses


def view_status(
    site: str,
    reader: Principal,
    table: InodeTable,
    tree_version: str,
    requests: dict[str, int],
    refresh: dict[str, Any],
) -> dict[str, Any]:
    """One view's status, in one shape: a standalone mount's (its whole status, with its process's
    figures) and each view's of a serving process (under "views", by its path). `refresh`:
    `TreeSwitches.describe`."""
    return {
        "site": site,
        "reader": reader.describe(),
        "visible_files": table.file_count,
        "tree_version": tree_version,
        "requests": requests,
        **refresh,
    }


def uptime_since(started: float) -> float:
    return round(time.time() - started, 1)
