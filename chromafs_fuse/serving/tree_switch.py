"""A re-ingest, served: the one path every site takes, through `ServedSites`
(serving/serving_process/sites.py), a serving process's sites and a mount of its own's one site.

- `follow_site`: the site's `TreeFollower`, driven by a `SiteWatch` (site/watch.py), hands out
  each new tree; of the trees that came while a switch ran only the newest is served; a switch
  that fails keeps the tree served and has the follower hand the newest out again.
- `next_filesystem`: a view's next filesystem: the tree pruned for the view's reader in the
  view's inode scope, diffed against the one served, carrying the old versions readers hold;
  the caller installs it, then `kernel_push.tell_kernel` makes the kernel forget the change.
- `TreeSwitches`: the switches counted and timed, for the status (the keys of `describe`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import ChromafsError
from chromafs_fuse.filesystem import DocsFilesystem
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.site.follower import TreeFollower, new_trees
from chromafs_fuse.site.tables import prune
from chromafs_fuse.site.watch import SiteWatch
from chromafs_fuse.tree import PathEntry, SiteTree
from chromafs_fuse.tree_diff import TreeChange, diff_tables

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache

log = logging.getLogger("chromafs.refresh")
A = TypeVar("A")


async def next_filesystem(
    old: DocsFilesystem[A],
    tree: SiteTree,
    reader: Principal,
    build: Callable[[InodeTable, dict[int, PathEntry]], DocsFilesystem[A]],
    whole: InodeTable | None = None,
) -> tuple[DocsFilesystem[A], TreeChange]:
    """`tree` for the view `old` serves now (pruned, from `whole` if given, and diffed in worker
    threads): its filesystem, made by `build` from the pruned table and the old versions it keeps
    serving, and what the kernel must forget once it is installed (the old inodes no longer
    served included)."""
    table = await trio.to_thread.run_sync(prune, tree, reader, old.table.scope, whole)
    change = await trio.to_thread.run_sync(diff_tables, old.table, table)
    replaced, dropped = old.carry_replaced(change.replaced, table)
    change.stale_inodes += dropped
    return build(table, replaced), change


class TreeSwitches:
    """A site's switches to re-ingested trees, for its status."""

    def __init__(self) -> None:
        self.count = 0
        self.failed = 0
        self.applied_at = time.time()  # when the tree served now was applied
        self.last_s = 0.0

    def describe(self, follower: TreeFollower | None) -> dict[str, Any]:
        """Its status keys (None: the site is not followed, no --refresh-interval)."""
        if follower is None or follower.interval_s <= 0:
            return {"refresh_interval_s": 0}
        return {
            **follower.describe(),
            "tree_applied_at": self.applied_at,
            "tree_switches": self.count,
            "last_switch_s": round(self.last_s, 4),
            "refresh_failures": follower.failures + self.failed,
        }


async def follow_site(
    watch: SiteWatch,
    name: str,
    follower: TreeFollower,
    redis: RedisCache | None,
    timeout_s: float,
    served_version: Callable[[], str],
    switch: Callable[[SiteTree], Awaitable[object]],
    switches: TreeSwitches,
) -> None:
    """Until cancelled: the site watched under `name`, each new tree its follower hands out
    served by `switch` (on the loop; it runs its blocking parts in worker threads), unless it is
    the version served already. `timeout_s`: a check of the published tree that takes longer is
    abandoned."""
    with new_trees(follower) as trees:
        watch.add(name, follower, redis, timeout_s)
        try:
            async for handed_out in trees:
                tree = handed_out
                while True:  # only the newest of the trees that came meanwhile
                    try:
                        tree = trees.receive_nowait()
                    except trio.WouldBlock:
                        break
                if tree.version == served_version():
                    continue
                started = time.perf_counter()
                try:
                    await switch(tree)
                except Exception as exc:  # keep serving the tree we have; the next check hands the tree out again
                    switches.failed += 1
                    follower.hand_out_again()
                    if isinstance(exc, ChromafsError):
                        log.warning("%s: switching to tree %s failed: %s", name, tree.version, exc.message)
                    else:  # a bug: with its traceback
                        log.exception("%s: switching to tree %s failed", name, tree.version)
                    continue
                switches.count += 1
                switches.applied_at = time.time()
                switches.last_s = time.perf_counter() - started
        finally:
            watch.remove(name)
