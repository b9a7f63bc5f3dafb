"""Cold reads per second, 16 readers at once: per-site daemons against the mount server's pool.

Measured on sites copied for this figure and read by no one before (no page in Redis, a daemon's
memory or the kernel's page cache), side by side in one run, in ROUNDS alternated rounds (each
on sites of its own):
- 16 standalone daemons (`chromafs-mount --no-mountd`), one per site, one reader each: the way a
  host serves 16 sites without a mount server (and what the old per-class daemons were);
- chromafs-mountd's pool (its default: one serving process per core, unless `scripts/bench
  --serving-processes`) serving 16 other sites, one session and one reader each, the same file lists.
Before them, for scale: one standalone daemon with 16 readers of different files of its site.
A read is open + read to the end + close of one file. Every mount is made with
`--warm-max-bytes 1 --preload off`: no warm-up or preload reads the pages ahead of the readers;
read-ahead stays as it is by default.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_lib.mounts import Mounter
from bench_lib.sessions import Sessions, describe_pool
from bench_lib.site_copies import SiteCopier

READERS = 16
ROUNDS = 2
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


def _daemons(workdir: Path, sites: list[str], backend: list[str], lists: list[list[str]]) -> dict[str, Any]:
    """A standalone daemon per site (len(lists) readers spread over them) and the reads."""
    mounters = [Mounter(site, [*backend, *COLD_FLAGS], workdir, site) for site in sites]
    workdir.mkdir(exist_ok=True)
    try:
        roots = [mounter.mount()[0] for mounter in mounters]
        jobs = [(roots[i % len(roots)], files) for i, files in enumerate(lists)]
        return {**concurrent_reads(jobs), "serving_processes": len(mounters)}
    finally:
        for mounter in mounters:
            mounter.unmount_all()


def _pool(
    workdir: Path, base: str, sites: list[str], backend: list[str], lists: list[list[str]], processes: int | None
) -> dict[str, Any]:
    """chromafs-mountd's pool serving `sites`, a session and a reader each, and the reads."""
    workdir.mkdir()
    sessions = Sessions(workdir, base, backend, serving_processes=processes)
    try:
        sessions.server.start()
        roots = [sessions.open(site=site, flags=COLD_FLAGS)[0] for site in sites]
        result = concurrent_reads(list(zip(roots, lists, strict=True)))
        result["serving_processes"] = len(describe_pool(sessions.server.class_root))
        return result
    finally:
        sessions.close()


def measure(
    workdir: Path, copier: SiteCopier, base: str, backend: list[str], keys: list[str], processes: int | None = None
) -> dict[str, Any]:
    workdir.mkdir()
    names = iter(f"{base}-cold{i}" for i in range(1 + 2 * ROUNDS * READERS))

    def fresh(count: int) -> list[str]:
        sites = [next(names) for _ in range(count)]
        for site in sites:
            copier.copy(site)
        return sites

    lists = [sorted(keys)[i::READERS] for i in range(READERS)]
    out: dict[str, Any] = {"readers": READERS, "flags": " ".join(COLD_FLAGS), "rounds": ROUNDS}
    out["one_daemon"] = _daemons(workdir / "one", fresh(1), backend, lists)
    out["sixteen_daemons_rounds"], out["pool_rounds"] = [], []
    for number in range(ROUNDS):
        out["sixteen_daemons_rounds"].append(_daemons(workdir / f"daemons-{number}", fresh(READERS), backend, lists))
        out["pool_rounds"].append(_pool(workdir / f"pool-{number}", base, fresh(READERS), backend, lists, processes))
    for name in ("sixteen_daemons", "pool"):
        rounds = out[f"{name}_rounds"]
        out[name] = {
            "reads_per_s": statistics.mean(r["reads_per_s"] for r in rounds),
            "mb_per_s": statistics.mean(r["mb_per_s"] for r in rounds),
            "serving_processes": rounds[0]["serving_processes"],
        }
    out["pool_to_daemons"] = out["pool"]["reads_per_s"] / out["sixteen_daemons"]["reads_per_s"]
    out["bar_pool_ge_daemons"] = out["pool_to_daemons"] >= 1.0
    return out


def text_line(result: dict[str, Any]) -> str:
    one, many, pool = result["one_daemon"], result["sixteen_daemons"], result["pool"]
    rounds = "/".join(f"{r['reads_per_s']:.0f}" for r in result["sixteen_daemons_rounds"])
    pool_rounds = "/".join(f"{r['reads_per_s']:.0f}" for r in result["pool_rounds"])
    return (
        f"cold reads, {result['readers']} concurrent readers ({one['files']} files, {one['bytes'] / 1e6:.1f} MB "
        f"a run): one standalone daemon, 16 readers of its site {one['reads_per_s']:.0f} reads/s; "
        f"16 standalone daemons of 16 sites {many['reads_per_s']:.0f} reads/s (rounds {rounds}); "
        f"chromafs-mountd's pool ({pool['serving_processes']} serving processes), 16 sites "
        f"{pool['reads_per_s']:.0f} reads/s (rounds {pool_rounds}): {result['pool_to_daemons']:.2f}x "
        f"(bar >= 1: {'PASS' if result['bar_pool_ge_daemons'] else 'FAIL'})"
    )
