"""A running mount follows re-ingests: wait for a new tree version to be announced (Redis
pub/sub) or poll the published version; on a change, load the new tree, prune it for this
mount's reader, switch to it and tell the kernel what to forget.

Everything blocking (Redis, Chroma, building the table, the kernel notifications) runs in
worker threads; the switch itself is one synchronous step on the trio loop, so a request sees
either the old tree or the new one, never part of each. Kernel notifications never run on the
loop: the kernel may make them wait for a request in flight, which the loop answers.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import pyfuse3
import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.filesystem import DocsFilesystem
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving.fuse_adapter import FuseAdapter
from chromafs_fuse.serving.kernel_push import KernelPusher
from chromafs_fuse.site.loader import SiteLoader
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.tree import PathEntry
from chromafs_fuse.tree_diff import TreeChange, diff_tables

log = logging.getLogger("chromafs.refresh")
T = TypeVar("T")


class TreeRefresher:
    def __init__(
        self,
        loader: SiteLoader,
        principal: Principal,
        ops: FuseAdapter,
        source: PageSource,
        make_fs: Callable[[InodeTable, dict[int, PathEntry]], DocsFilesystem],
        interval_s: float,
    ) -> None:
        self.loader = loader
        self.principal = principal
        self.ops = ops
        self.source = source
        self.make_fs = make_fs
        self.interval_s = interval_s
        self.switches = 0
        self.applied_at = time.time()  # when the tree served now was applied
        self.last_switch_s = 0.0
        self.failures = 0
        self.announcements = loader.announcements()
        self.announced = 0  # switches checked because Redis announced a version
        # (old table, new table), on the loop after each switch: the daemon warms what changed
        self.after_switch: Callable[[InodeTable, InodeTable], None] | None = None

    def describe(self) -> dict[str, object]:
        return {
            "refresh_interval_s": self.interval_s,
            "tree_applied_at": self.applied_at,
            "tree_switches": self.switches,
            "last_switch_s": round(self.last_switch_s, 4),
            "refresh_failures": self.failures,
            "tree_announcements": self.announced,
        }

    async def _next_check(self) -> None:
        """Until a version is announced, or `interval_s` has passed (a poll)."""
        if self.announcements is None:
            await trio.sleep(self.interval_s)
        elif await trio.to_thread.run_sync(self.announcements.wait, self.interval_s, abandon_on_cancel=True):
            self.announced += 1

    async def run(self, token: trio.lowlevel.TrioToken) -> None:
        while True:
            await self._next_check()
            try:
                await self.check(token)
            except Exception as exc:  # a backend down: keep serving the tree we have, try again later
                self.failures += 1
                log.warning("checking for a new tree failed: %s", exc)

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        with trio.fail_after(self.source.timeout_s):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def check(self, token: trio.lowlevel.TrioToken) -> bool:
        """Switch to the published tree if it is not the one served; True if it switched."""
        version = await self._off_loop(self.loader.current_version, self.source.chroma)
        if version == self.source.tree_version:
            return False
        started = time.perf_counter()
        tree = await self._off_loop(self.loader.reload_tree, self.source.chroma)
        if tree.version == self.source.tree_version:
            return False
        table = await trio.to_thread.run_sync(SiteLoader.prune, tree, self.principal)
        old_table = self.ops.table
        change = await trio.to_thread.run_sync(diff_tables, old_table, table)
        previous = self.source.tree_version
        replaced, dropped = self.ops.fs.carry_replaced(change.replaced, table)
        change.stale_inodes += dropped
        old_pusher = self.ops.switch(self.make_fs(table, replaced))
        self.source.switch(tree.version)
        await trio.to_thread.run_sync(tell_kernel, old_pusher, change)
        self.ops.start_pushing(token)
        self.switches += 1
        if self.after_switch is not None:
            self.after_switch(old_table, table)
        self.applied_at = time.time()
        self.last_switch_s = time.perf_counter() - started
        log.info(
            "tree %s -> %s in %.3fs: %d files changed, %d added, %d removed; %d inodes and %d names invalidated",
            previous,
            self.source.tree_version,
            self.last_switch_s,
            change.changed,
            change.added,
            change.removed,
            len(change.stale_inodes),
            len(change.stale_names),
        )
        return True


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
