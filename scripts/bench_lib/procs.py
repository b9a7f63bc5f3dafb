"""Timed commands of the benchmark, and adopting the mount daemons it starts.

The servers it starts (`chroma run`, `redis-server`, `chromafs-mountd`) are in scripts/harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.processes import child_env

CMD_TIMEOUT_S = 1800.0


def become_subreaper() -> None:
    """Adopt the mount daemons once their `chromafs-mount` parent exits, so we can reap them and
    read their exit status (PR_SET_CHILD_SUBREAPER)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


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


def subtree(pid: int) -> list[int]:
    """Every process under `pid` (children of any of its threads, theirs, and so on): under
    chromafs-mountd, its forker and the serving processes the forker started."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                children += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return children + [below for child in children for below in subtree(child)]
