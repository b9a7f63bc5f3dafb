"""This process as a service: systemd readiness, glibc's malloc arenas, and naming a process
for good (pid and start time)."""

from __future__ import annotations

import contextlib
import os
import socket

M_ARENA_MAX = -8  # mallopt parameters, glibc's malloc.h
M_MMAP_THRESHOLD = -3


def limit_malloc_arenas(arenas: int = 1) -> None:
    """Keep glibc from giving each worker thread its own malloc arena. Pages pass through the
    backend threads; with an arena per thread, memory they free stays reserved in that arena,
    and an idle mount holds tens of megabytes it no longer uses. Call before threads start."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas)


def fixed_mmap_threshold(threshold: int = 1 << 20) -> None:
    """Blocks of `threshold` bytes and more are always mapped on their own and unmapped when
    freed. glibc otherwise raises the threshold each time such a block is freed (up to 32 MiB),
    after which the ingest's megabytes of piece and request buffers come from the heap, which
    fragments: its peak grew with the site's binary bytes (+63 MiB for 144 MiB more)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)


def sd_notify(message: str) -> None:
    """Tell systemd about our state when run as a Type=notify unit."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode("utf-8"))


def process_start(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None if there is no such process.
    With the pid it names one process for good: a pid alone is reused.
    A shortage of descriptors is not an answer: it raises (OSError EMFILE), never None, so that
    nothing is taken for dead because the asker could not look."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[19])  # field 22; the split starts at field 3
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
