"""A running mount follows re-ingests: the site's `TreeFollower` (site/follower.py), driven by a
`SiteWatch` (site/watch.py) as each site of a serving process is, notices a new version
(announced through Redis pub/sub, or polled) and loads its tree in worker threads; the
refresher hands each new tree to the mount (serving/daemon/mount.py `Mount.switch_to`), which prunes it
for its reader, switches to it and tells the kernel what to forget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

from chromafs_fuse.site.follower import TreeFollower, new_trees
from chromafs_fuse.site.loader import SiteLoader
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.site.watch import SiteWatch
from chromafs_fuse.tree import SiteTree
from chromafs_fuse.tree_diff import TreeChange

log = logging.getLogger("chromafs.refresh")


class TreeRefresher:
    def __init__(
        self,
        loader: SiteLoader,
        source: PageSource,
        tree: SiteTree,
        interval_s: float,
        switch_to: Callable[[SiteTree], Awaitable[TreeChange]],
    ) -> None:
        """`tree` is the one served now; `switch_to` serves a new one (on the loop) and says what changed."""
        self.source = source
        self.redis = loader.redis
        self.follower = TreeFollower(loader, source.chroma, tree, interval_s)
        self.switch_to = switch_to
        self.switches = 0
        self.applied_at = time.time()  # when the tree served now was applied
        self.last_switch_s = 0.0
        self.failed_switches = 0

    def describe(self) -> dict[str, object]:
        follower = self.follower
        return {
            "refresh_interval_s": follower.interval_s,
            "tree_applied_at": self.applied_at,
            "tree_switches": self.switches,
            "last_switch_s": round(self.last_switch_s, 4),
            "refresh_failures": follower.failures + self.failed_switches,
            "tree_announcements": follower.announced,
        }

    async def run(self) -> None:
        """Follow until cancelled; of the trees that came while a switch ran, only the newest is served."""
        watch = SiteWatch()
        with new_trees(self.follower) as trees:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run)
                watch.add(self.source.site, self.follower, self.redis, self.source.timeout_s)
                async for tree in trees:
                    while True:
                        try:
                            tree = trees.receive_nowait()
                        except trio.WouldBlock:
                            break
                    await self.check(tree)

    async def check(self, tree: SiteTree) -> bool:
        """Switch to `tree` unless it is the one served; True if it switched."""
        previous = self.source.tree_version
        if tree.version == previous:
            return False
        started = time.perf_counter()
        try:
            change = await self.switch_to(tree)
        except Exception as exc:  # keep serving the tree we have; the next check hands the tree out again
            self.failed_switches += 1
            self.follower.hand_out_again()
            log.warning("switching to tree %s failed: %s", tree.version, exc)
            return False
        self.switches += 1
        self.applied_at = time.time()
        self.last_switch_s = time.perf_counter() - started
        log.info(
            "tree %s -> %s in %.3fs: %d files changed, %d added, %d removed; %d inodes and %d names invalidated",
            previous,
            tree.version,
            self.last_switch_s,
            change.changed,
            change.added,
            change.removed,
            len(change.stale_inodes),
            len(change.stale_names),
        )
        return True
