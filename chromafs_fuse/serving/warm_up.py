"""Warming a mount's pages into the kernel's page cache (`--warm-kernel`; a mount server's classes
always), so that a first `grep -r` finds them there instead of paying a request per file: one
warmer for a standalone mount and for each view of a serving process.

A view (a standalone mount's root, or `<site>/<view>` of a serving process's mount) is read
through the mount once, in the background, by a thread reading as a user would: every directory
listed, every file read in name order (the order the read-ahead batches, so its pages come from
the stores a batch at a time). The kernel keeps what was read (no-open mode, or keep_cache), and a
page that several views of a site show is one inode, so a page read once through any view is held
for every view of its site: a site's second class reads only the pages the first one did not
show, and after a re-ingest a view reads only its new and changed pages (new inodes). No page is
pushed (a read, unlike a kernel store, needs no patched pyfuse3); reading its own mount, a process
needs its watchdog (serving/watchdog.py): killed while such a read waits in the kernel, it
could never close its FUSE descriptor. Views are warmed a few at a time; views of up to
`--warm-max-bytes` visible bytes (default: a sixteenth of the machine's memory); the kernel evicts
what it needs. A view removed or switched to a new tree meanwhile stops its warm-up.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from chromafs_fuse.config import MountConfig
from chromafs_fuse.inodes import InodeTable

log = logging.getLogger("chromafs.serving")
UNKNOWN_SIZE_ESTIMATE = 16 * 1024  # bytes assumed for a file whose tree gives no size
MEMORY_SHARE = 16  # default budget: this fraction of the machine's memory
READ_BYTES = 1 << 20
QUEUE_VIEWS = 100_000  # views waiting for their warm-up (a few hundred bytes each)
WARMERS = 4  # views warmed at once, each by a thread reading through the mount
MIN_SAMPLE = 200  # files or entries: fewer tell little of the pace


def visible_bytes(table: InodeTable) -> int:
    return table.total_bytes + table.unknown_sizes * UNKNOWN_SIZE_ESTIMATE


def warm_budget(config: MountConfig) -> int:
    if config.warm_max_bytes:
        return config.warm_max_bytes
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MEMORY_SHARE


def should_warm_kernel(config: MountConfig, table: InodeTable) -> bool:
    """--warm-kernel, and the view fits the budget."""
    if not config.warm_kernel:
        return False
    total, budget = visible_bytes(table), warm_budget(config)
    if total > budget:
        log.info("not warming: %d visible bytes, over --warm-max-bytes %d", total, budget)
        return False
    return True


@dataclass
class WarmPace:
    """How fast this process's warm-ups and listings went, so that a new class's first session
    waits for its view to be read or listed only when that can end within the wait: a view too
    big to finish in time is warmed in the background and its session answered at once. The
    priors are this project's VM (a few thousand files a second through the mount); each warm-up
    or listing of MIN_SAMPLE files or more moves them halfway to what it took."""

    file_s: float = 1 / 2000  # a file read through the mount, beside its bytes
    byte_s: float = 1 / 50e6
    entry_s: float = 1 / 40000  # an entry of a listed directory

    def warm_s(self, files: int, size: int) -> float:
        return files * self.file_s + size * self.byte_s

    def list_s(self, entries: int) -> float:
        return entries * self.entry_s

    def saw_warm(self, files: int, size: int, seconds: float) -> None:
        expected = self.warm_s(files, size)
        if files >= MIN_SAMPLE and expected > 0:
            factor = (1 + seconds / expected) / 2
            self.file_s *= factor
            self.byte_s *= factor

    def saw_listing(self, entries: int, seconds: float) -> None:
        if entries >= MIN_SAMPLE:
            self.entry_s = (self.entry_s + seconds / entries) / 2


@dataclass(frozen=True)
class WarmJob:
    path: str  # the view's directory: a standalone mount's mountpoint, or a view's in a serving mount
    warmed: set[int]  # inode numbers of the site read already (one set per site, shared by its views)
    current: Callable[[], bool]  # False once the view is removed or switched to another tree
    done: trio.Event = field(default_factory=trio.Event)  # set once warmed, stopped or failed


@dataclass
class WarmResult:
    directories: int = 0
    files_read: int = 0
    bytes_read: int = 0
    stopped: str = ""  # why it stopped early ("" when it walked everything)


def warm_view(job: WarmJob) -> WarmResult:
    """In a worker thread: list every directory of the view and read every file not read yet
    through another view of its site, in name order (the order the read-ahead batches)."""
    result = WarmResult()
    # Relative to each directory's descriptor: a path from a serving process's mount's root would ask the
    # top directories (never cached: views come and go) again for every file.
    for directory, dirs, files, dir_fd in os.fwalk(job.path):
        dirs.sort()
        result.directories += 1
        for name in sorted(files):
            if not job.current():
                result.stopped = "the view was removed or switched to another tree"
                return result
            try:
                inode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
                if inode in job.warmed:
                    continue
                fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
                try:
                    while chunk := os.read(fd, READ_BYTES):
                        result.bytes_read += len(chunk)
                finally:
                    os.close(fd)
            except OSError as exc:  # a page whose backend fails now: its reader sees the error
                log.debug("warming %s: %s", os.path.join(directory, name), exc)
                continue
            job.warmed.add(inode)
            result.files_read += 1
    return result


class ViewWarmer:
    """Warms the views it is given, one after another, on its own worker thread."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[WarmJob](QUEUE_VIEWS)
        self.warmed_views = 0
        self.pace = WarmPace()

    def offer(self, job: WarmJob) -> bool:
        """On the loop: warm this view once the ones before it are warm (dropped when too many
        wait). True when it is the only view warming: no other view's warm-up is ahead of it or
        shares the machine with it (in a burst of new classes, none is worth waiting for)."""
        alone = self._send.statistics().tasks_waiting_receive == WARMERS
        try:
            self._send.send_nowait(job)
        except trio.WouldBlock:
            log.warning("not warming %s: %d views wait for their warm-up", job.path, QUEUE_VIEWS)
            return False
        return alone

    async def run(self) -> None:
        """WARMERS views at a time (a burst of new classes must not queue behind one view)."""
        async with trio.open_nursery() as nursery:
            for _ in range(WARMERS):
                nursery.start_soon(self._warm_each)

    async def _warm_each(self) -> None:
        async for job in self._receive:
            started = time.monotonic()
            try:
                result = await trio.to_thread.run_sync(warm_view, job, abandon_on_cancel=True)
            except Exception:  # a warm-up is an optimisation: whatever stops it, the view serves
                log.exception("warming %s failed", job.path)
                continue
            finally:
                job.done.set()
            self.warmed_views += 1
            self.pace.saw_warm(result.files_read, result.bytes_read, time.monotonic() - started)
            log.info(
                "warm %s in %.2fs: %d directories listed, %d files (%d bytes) read%s",
                job.path,
                time.monotonic() - started,
                result.directories,
                result.files_read,
                result.bytes_read,
                f"; stopped: {result.stopped}" if result.stopped else "",
            )
