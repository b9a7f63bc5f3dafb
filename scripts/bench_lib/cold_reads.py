"""Cold reads per second through chromafs-mountd class mounts, 16 readers at once (issue 30).

Measured on sites copied for this figure and read by no one before (no page in Redis, the
daemon's memory or the kernel's page cache), side by side in one run:
- one class daemon (`--class-mode process`), 16 concurrent readers of different files of its
  site: what one serving process sustains on one site;
- 16 class daemons of 16 sites, one reader each, the same 16 file lists;
- the shared mount (`--class-mode shared`): ONE process serving 16 sites, one reader each, the
  same 16 file lists: what one serving process sustains for readers of different sites;
- `--shared-processes 2`: two shared processes serving 16 other sites (8 each), the same lists.
A read is open + read to the end + close of one file. The class mounts are made with
`--warm-max-bytes 1 --preload off` (sessions of their own class): no warm-up or preload reads
the pages ahead of the readers; read-ahead stays as it is by default.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_lib.sessions import Sessions
from bench_lib.site_copies import SiteCopier

READERS = 16
COLD_FLAGS = ("--warm-max-bytes", "1", "--preload", "off")


def _read_all(root: Path, keys: list[str], start: threading.Barrier) -> int:
    start.wait()
    total = 0
    for key in keys:
        with open(root / key, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def concurrent_reads(jobs: list[tuple[Path, list[str]]]) -> dict[str, Any]:
    """Each (root, keys) read by its own thread, all started together; files and bytes per second."""
    start = threading.Barrier(len(jobs) + 1)
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(_read_all, root, keys, start) for root, keys in jobs]
        start.wait()
        began = time.perf_counter()
        total = sum(f.result() for f in futures)
        took = time.perf_counter() - began
    files = sum(len(keys) for _, keys in jobs)
    return {
        "files": files,
        "bytes": total,
        "seconds": took,
        "reads_per_s": files / took,
        "mb_per_s": total / took / 1e6,
    }


def measure(workdir: Path, copier: SiteCopier, base: str, backend: list[str], keys: list[str]) -> dict[str, Any]:
    workdir.mkdir()
    sites = [f"{base}-cold{i}" for i in range(3 * READERS + 1)]
    for site in sites:
        copier.copy(site)
    lists = [sorted(keys)[i::READERS] for i in range(READERS)]
    sessions = Sessions(workdir, base, backend)
    out: dict[str, Any] = {"readers": READERS, "flags": " ".join(COLD_FLAGS)}
    try:
        sessions.server.start()
        one, _ = sessions.open(site=sites[0], flags=COLD_FLAGS)
        out["one_daemon"] = concurrent_reads([(one, files) for files in lists])
        roots = [sessions.open(site=site, flags=COLD_FLAGS)[0] for site in sites[1 : READERS + 1]]
        out["sixteen_daemons"] = concurrent_reads(list(zip(roots, lists, strict=True)))
    finally:
        sessions.close()
    pools = (("one_shared_process", 1, READERS + 1), ("two_shared_processes", 2, 2 * READERS + 1))
    for name, processes, first in pools:
        (workdir / name).mkdir()
        shared = Sessions(workdir / name, base, backend, class_mode="shared", shared_processes=processes)
        try:
            shared.server.start()
            roots = [shared.open(site=site, flags=COLD_FLAGS)[0] for site in sites[first : first + READERS]]
            out[name] = concurrent_reads(list(zip(roots, lists, strict=True)))
            out[name]["serving_processes"] = len(shared.serving_pids()) - 1  # less the mount server
        finally:
            shared.close()
    return out


def text_line(result: dict[str, Any]) -> str:
    one, many = result["one_daemon"], result["sixteen_daemons"]
    return (
        f"cold reads, {result['readers']} concurrent readers ({one['files']} files, {one['bytes'] / 1e6:.1f} MB): "
        f"one class daemon {one['reads_per_s']:.0f} reads/s ({one['mb_per_s']:.1f} MB/s); "
        f"16 class daemons of 16 sites {many['reads_per_s']:.0f} reads/s ({many['mb_per_s']:.1f} MB/s)"
        + (
            f"; one shared process, 16 sites {shared['reads_per_s']:.0f} reads/s ({shared['mb_per_s']:.1f} MB/s)"
            if (shared := result.get("one_shared_process"))
            else ""
        )
        + (
            f"; two shared processes (--shared-processes 2), 16 sites {pool['reads_per_s']:.0f} reads/s"
            if (pool := result.get("two_shared_processes"))
            else ""
        )
    )
