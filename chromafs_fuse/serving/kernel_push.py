"""Hands loaded pages to the kernel's page cache before anyone reads them (FUSE notify_store).

In no-open mode the kernel keeps a file's pages across opens, so a page stored this way is
read by `grep`, `cat` or `rg` without a request ever reaching the daemon: a cold reader that
follows the read-ahead pays no round trip per file. The kernel accepts a page only for an
inode it already holds (one it has listed or looked up); for any other it answers ENOENT and
the daemon keeps its own copy until the file is read.

Stores run on one thread of their own, never on the trio loop: the kernel makes a store wait
while a read of the same file is in flight, and that read is answered by the trio loop.
Outcomes come back through a deque that the loop drains; the loop never waits for this
thread, so the two cannot deadlock.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from queue import Empty, SimpleQueue

import pyfuse3

from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.tree_diff import TreeChange

log = logging.getLogger(__name__)

# Stores whole files: [(inode, data)] -> [0 or -errno] (the patched pyfuse3's store_pages).
StorePages = Callable[[list[tuple[int, bytes]]], Sequence[int]]
MAX_BATCH = 64


class KernelPusher:
    def __init__(self, store: StorePages, on_outcomes: Callable[[], None], tags: int) -> None:
        """`on_outcomes` is called from the pushing thread when the queue runs dry: it must
        only schedule a drain on the loop (e.g. TrioToken.run_sync_soon), never do work.
        Tags are 0 <= tag < `tags`; the loop sets `being_read[tag]` when the kernel asks for
        that page itself, and a queued store of it is then skipped."""
        self._store = store
        self._on_outcomes = on_outcomes
        self._queue: SimpleQueue[tuple[int, int, bytes] | None] = SimpleQueue()
        self.outcomes: deque[tuple[int, bool]] = deque()  # (tag, stored)
        self.being_read = bytearray(tags)
        self.stored = 0
        self.refused = 0  # ENOENT: the kernel holds no inode for the file (yet)
        self.skipped = 0  # read by the kernel before its turn came
        self._thread = threading.Thread(target=self._run, name="chromafs-push", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, tag: int, inode: int, data: bytes) -> None:
        self._queue.put((tag, inode, data))

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop before the FUSE session is closed: a store after that would use a freed session."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    def _next_batch(self) -> list[tuple[int, int, bytes]] | None:
        item = self._queue.get()
        if item is None:
            return None
        batch = [item]
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(item)
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            being_read = self.being_read
            todo = [item for item in batch if not being_read[item[0]]]
            for tag, _inode, _data in batch:
                if being_read[tag]:
                    self.skipped += 1
                    self.outcomes.append((tag, False))
            results = self._store([(inode, data) for _tag, inode, data in todo]) if todo else []
            for (tag, inode, _data), result in zip(todo, results, strict=True):
                if result == 0:
                    self.stored += 1
                else:
                    self.refused += 1
                    if result == -errno.ENODEV:  # the mount is going away
                        return
                    if result != -errno.ENOENT:
                        log.debug("storing inode %d in the kernel's cache failed: %s", inode, errno.errorcode[-result])
                self.outcomes.append((tag, result == 0))
            if self._queue.empty():
                try:
                    self._on_outcomes()
                except Exception:  # the loop has finished: nobody is left to drain
                    return


def walk_directories(root: str, table: InodeTable, listed: Callable[[int], None], threads: int = 4) -> int:
    """List each directory of `table` under `root` (a mount of this daemon: call it off the
    loop) in the order `grep -r` enters them, and call `listed(index)` once the kernel holds
    its entries, so that a store for any file of it is accepted. Several threads list at once:
    a round trip's latency, not the daemon's work, is most of a listing's cost. Returns how
    many were listed; a directory that cannot be listed (gone after a re-ingest) is skipped."""
    pending = iter(table.directories_depth_first())
    take = threading.Lock()
    done: list[int] = []

    def work() -> None:
        while True:
            with take:
                index = next(pending, None)
            if index is None:
                return
            try:
                with os.scandir(os.path.join(root, table.key_at(index))) as entries:
                    for _entry in entries:
                        pass
            except OSError:
                continue
            listed(index)
            done.append(index)

    helpers = [threading.Thread(target=work, name="chromafs-walk", daemon=True) for _ in range(threads - 1)]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()
    return len(done)


def tell_kernel(old_pusher: KernelPusher | None, change: TreeChange) -> None:
    """In a worker thread: stop pushing old pages (queued ones go first), then drop what the
    kernel caches of changed files and listings, and its lookups of names that came or went.
    An inode or name the kernel does not hold answers ENOENT: nothing to drop."""
    if old_pusher is not None:
        old_pusher.stop()
    for inode in change.stale_inodes:
        try:
            pyfuse3.invalidate_inode(inode, attr_only=False)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("invalidating inode %d: %s", inode, exc)
    for parent, name in change.stale_names:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("invalidating %r in inode %d: %s", name, parent, exc)


def forget_attributes(inodes: Sequence[int]) -> None:
    """In a worker thread: drop the kernel's cached attributes of these inodes, so that the next
    permission check on each (every path walk through a directory) asks the daemon again."""
    for inode in inodes:
        try:
            pyfuse3.invalidate_inode(inode, attr_only=True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("invalidating inode %d: %s", inode, exc)
