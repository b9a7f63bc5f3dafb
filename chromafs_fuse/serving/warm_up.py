"""Warming a mount before its first reader: list its directories, then stream its pages through
to the kernel's page cache, so that a cold `grep -r` reads like one on a local disk.

What is filled is the kernel's page cache, not the process's: pages are loaded a batch at a
time, handed to the kernel, and dropped from memory once it holds them, so a site much larger
than `--cache-bytes` is warmed with one batch in memory. Sites up to `--warm-max-bytes` are
warmed (default: a sixteenth of the machine's memory); the kernel evicts what it needs.

After a re-ingest only the pages that changed (or appeared) are warmed again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from functools import partial

import trio

from chromafs_fuse.config import MountConfig
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving.fuse_adapter import Filesystem, FuseAdapter
from chromafs_fuse.serving.kernel_push import walk_directories
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.tree import PathEntry

log = logging.getLogger("chromafs.mount")
PUSH_POLL_S = 0.005
BATCH_PAGES = 200
UNKNOWN_SIZE_ESTIMATE = 16 * 1024  # bytes assumed for a file whose tree gives no size
MEMORY_SHARE = 16  # default budget: this fraction of the machine's memory


def visible_bytes(table: InodeTable) -> int:
    return table.total_bytes + table.unknown_sizes * UNKNOWN_SIZE_ESTIMATE


def warm_budget(config: MountConfig) -> int:
    if config.warm_max_bytes:
        return config.warm_max_bytes
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MEMORY_SHARE


def should_warm_kernel(config: MountConfig, pushing: bool, table: InodeTable) -> bool:
    """--warm-kernel, pages can be pushed (a watchdog runs), and the site fits the budget."""
    if not (config.warm_kernel and pushing):
        return False
    total, budget = visible_bytes(table), warm_budget(config)
    if total > budget:
        log.info("not warming: %d visible bytes, over --warm-max-bytes %d", total, budget)
        return False
    return True


def all_files(table: InodeTable) -> list[int]:
    return [table.file_order[order] for order in range(len(table.file_order))]


def changed_files(old: InodeTable, new: InodeTable) -> list[int]:
    """Files of `new` whose bytes the kernel cannot hold yet: new paths and new versions."""
    return [
        index
        for index in all_files(new)
        if (entry := new.entries.get(new.key_at(index))) is not None and old.entries.get(entry.key) != entry
    ]


def batches(table: InodeTable, files: Sequence[int], max_bytes: int) -> Iterator[list[int]]:
    """`files` in runs of at most BATCH_PAGES pages and `max_bytes` (one page may be more)."""
    batch: list[int] = []
    size = 0
    for index in files:
        page_size = table.size_at(index) or UNKNOWN_SIZE_ESTIMATE
        if batch and (len(batch) >= BATCH_PAGES or size + page_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(index)
        size += page_size
    if batch:
        yield batch


async def warm_kernel(
    mountpoint: str, ops: FuseAdapter[Filesystem], source: PageSource, files: Sequence[int], batch_bytes: int
) -> int:
    """List every directory and hand every page of `files` to the kernel; returns how many
    pages were loaded. Stops early when the mount switches to another tree."""
    started = time.monotonic()
    fs = ops.fs
    table, scheduler = fs.table, fs.scheduler
    pages = [index for index in files if not table.is_blob_at(index)]  # blobs: read by range, when read
    runs = batches(table, pages, batch_bytes)
    first = next(runs, [])
    walked: list[int] = []

    def entries(batch: list[int]) -> list[PathEntry]:
        return [entry for index in batch if (entry := table.node(index).entry) is not None]

    async def drained() -> None:
        while scheduler.pushes_pending():
            await trio.sleep(PUSH_POLL_S)

    # the first batch loads while the directories are listed; stores wait for the listing
    walk = partial(trio.to_thread.run_sync, abandon_on_cancel=True)
    async with trio.open_nursery() as nursery:
        # every directory: the kernel then holds each listing, and accepts a store for any file
        nursery.start_soon(walk, walk_directories, mountpoint, table, walked.append)
        loaded = await source.preload(entries(first))
    for index in walked:
        scheduler.holds_directory(index)
    await drained()
    for batch in runs:
        if ops.fs is not fs:
            log.info("warm-up stopped: the mount switched to another tree")
            break
        loaded += await source.preload(entries(batch))
        scheduler.offer_loaded(batch)
        await drained()
    log.info(
        "warm in %.2fs: %d directories listed, %d pages loaded and handed to the kernel's page cache",
        time.monotonic() - started,
        len(walked),
        loaded,
    )
    return loaded
