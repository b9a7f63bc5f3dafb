"""A running mount follows re-ingests: wait for a new tree version to be announced (Redis
pub/sub) or poll the published version; on a change, load the new tree and hand it to the
mount (serving/mount.py `Mount.switch_to`), which prunes it for its reader, switches to it
and tells the kernel what to forget (`tell_kernel`).

Everything blocking (Redis, Chroma) runs in worker threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from chromafs_fuse.site.loader import SiteLoader
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.tree import SiteTree
from chromafs_fuse.tree_diff import TreeChange

log = logging.getLogger("chromafs.refresh")
T = TypeVar("T")


class TreeRefresher:
    def __init__(
        self,
        loader: SiteLoader,
        source: PageSource,
        interval_s: float,
        switch_to: Callable[[SiteTree], Awaitable[TreeChange]],
    ) -> None:
        """`switch_to` serves a new tree (on the loop) and says what changed."""
        self.loader = loader
        self.source = source
        self.interval_s = interval_s
        self.switch_to = switch_to
        self.switches = 0
        self.applied_at = time.time()  # when the tree served now was applied
        self.last_switch_s = 0.0
        self.failures = 0
        self.announcements = loader.announcements()
        self.announced = 0  # switches checked because Redis announced a version

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

    async def run(self) -> None:
        while True:
            await self._next_check()
            try:
                await self.check()
            except Exception as exc:  # a backend down: keep serving the tree we have, try again later
                self.failures += 1
                log.warning("checking for a new tree failed: %s", exc)

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        with trio.fail_after(self.source.timeout_s):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def check(self) -> bool:
        """Switch to the published tree if it is not the one served; True if it switched."""
        previous = self.source.tree_version
        version = await self._off_loop(self.loader.current_version, self.source.chroma)
        if version == previous:
            return False
        started = time.perf_counter()
        tree = await self._off_loop(self.loader.reload_tree, self.source.chroma)
        if tree.version == previous:
            return False
        change = await self.switch_to(tree)
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
