"""Mounting and unmounting chromafs with the real CLI, and reading a daemon's memory."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.processes import BIN, child_env, unmount_daemon

# chromafs-mount asks the host's mount server listening here unless told --no-mountd (older
# versions, as --baseline runs them, know no such flag: it is given only when one listens)
HOST_MOUNTD_SOCKET = "/run/chromafs/mountd.sock"


def _smaps_rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                out[name.lower()] = int(rest.split()[0])
    return out


def memory_kb(pid: int) -> dict[str, int]:
    """Rss of the daemon and Pss (kB) of the daemon plus every process under it (the watchdog
    a mount starts when it pushes pages), from /proc/PID/smaps_rollup. Pss splits shared pages
    between the processes that map them, so the sum counts each page once."""
    out = _smaps_rollup(pid)
    for child in _descendants(pid):
        with contextlib.suppress(OSError):
            out["pss"] += _smaps_rollup(child).get("pss", 0)
    return out


def _descendants(pid: int) -> list[int]:
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [grandchild for child in children for grandchild in _descendants(child)]


@dataclass
class Mounter:
    """Mounts one backend's site; remembers every mountpoint and daemon so cleanup can find them."""

    site: str
    backend_args: list[str]
    workdir: Path
    label: str
    live: dict[Path, int | None] = field(default_factory=dict)
    count: int = 0
    incidents: list[str] = field(default_factory=list)

    def mount(self, attempts: int = 2) -> tuple[Path, float]:
        """A fresh mount; returns (mountpoint, seconds chromafs-mount took). A failed mount is
        recorded as an incident (with the daemon's log) and tried again, up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            self.count += 1
            point = self.workdir / f"{self.label}-{self.count}"
            point.mkdir(parents=True)
            log, pid_file = point.with_suffix(".log"), point.with_suffix(".pid")
            argv = [str(BIN / "chromafs-mount"), str(point), "--site", self.site, *self.backend_args]
            argv += ["--log-file", str(log), "--pid-file", str(pid_file)]
            if "--mountd" not in self.backend_args and os.path.exists(HOST_MOUNTD_SOCKET):
                argv.append("--no-mountd")  # a daemon of its own, not a session of the host's mount server
            self.live[point] = None
            started = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, timeout=180, env=child_env(), stdin=subprocess.DEVNULL)
            took = time.perf_counter() - started
            if proc.returncode == 0:
                self.live[point] = int(pid_file.read_text())
                return point, took
            tail = "\n    ".join(self.log_text(point).splitlines()[-15:])
            err = proc.stderr.decode(errors="replace").strip()
            self.incidents.append(f"{point.name}: chromafs-mount failed after {took:.2f}s: {err}; daemon log: {tail}")
            print(f"INCIDENT: {self.incidents[-1]}", file=sys.stderr, flush=True)
            self.unmount(point)
            if attempt == attempts:
                raise RuntimeError(self.incidents[-1])
        raise AssertionError("unreachable")

    def pid(self, point: Path) -> int:
        pid = self.live[point]
        assert pid is not None
        return pid

    def log_text(self, point: Path) -> str:
        with contextlib.suppress(OSError):
            return point.with_suffix(".log").read_text(errors="replace")
        return ""

    def unmount(self, point: Path) -> None:
        pid = self.live.pop(point, None)
        status = unmount_daemon(point, pid)
        if status not in (0, None):
            self.incidents.append(f"{point.name}: daemon {pid} exited with status {status} after its unmount")
        with contextlib.suppress(OSError):
            point.rmdir()

    def unmount_all(self) -> None:
        for point in list(self.live):
            self.unmount(point)
