"""What every part of scripts/containers shares: the repository's paths, the cache and state
directories, the containers' name prefix and label, `log`, `sh` (a command's stdout, a failure a
StackError), `answers` (whether a command succeeds) and `mounts_under`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SITE = REPO / "chromafs_fuse" / "sample_site"
CACHE = Path("/var/tmp/chromafs-containers")
# this script's state in /run, like dockerd's own: what a run killed halfway leaves for the next
# (a dockerd it started and the firewall before it, engine.py; the firewall before podman, main)
STATE = Path("/run/chromafs-containers")
LABEL = "org.chromafs.containers"  # on every container this script starts
P = "chromafs-demo"  # every container this script starts is named P-...
STARTED = time.monotonic()


class StackError(Exception):
    pass


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


def sh(argv: list[str], check: bool = True, timeout: float | None = None, quiet: bool = False) -> str:
    """Run a command; its stdout. A failure raises StackError with its stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{' '.join(argv[:4])} ...: no answer in {timeout:.0f}s") from exc
    if check and done.returncode != 0:
        raise StackError(f"{' '.join(argv)}: exit {done.returncode}\n{(done.stderr or done.stdout)[-3000:]}")
    if not quiet and done.returncode != 0:
        log(f"({' '.join(argv[:3])} ...: exit {done.returncode})")
    return done.stdout


def answers(argv: list[str], timeout: float = 20) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def mounts_under(roots: tuple[str, ...]) -> list[str]:
    """Mount points under these directories, deepest first."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if any(p == r or p.startswith(r + "/") for r in roots)), key=len, reverse=True)
