"""One site's tree pruned per reader class, for its current tree version only.

Readers whose `access.visibility_key` is equal may read exactly the same pages, so they share
one pruned table: the mount server hands it to the mounts it forks, the MCP server answers
every reader of the class from it. A tree of another version drops every table of the old one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from cachetools import LRUCache

from chromafs_fuse.access import Principal, VisibilityKey, visibility_key, visible_entries
from chromafs_fuse.inodes import InodeScope, InodeTable
from chromafs_fuse.tree import SiteTree

V = TypeVar("V")
MAX_TABLES = 64
OWN_MOUNT = InodeScope()  # a mount of its own: the root is inode 1
WHOLE_TABLE_FILES = 5_000  # a smaller tree's view is pruned directly as fast: no whole table kept


def prune(
    tree: SiteTree, principal: Principal, scope: InodeScope = OWN_MOUNT, whole: InodeTable | None = None
) -> InodeTable:
    """The tree as this reader may see it (its directories' inodes in `scope`: a serving
    process's view's own), filtered from `whole` (the tree's `whole_table` for scope's site)
    when there is one, else built."""
    visible = visible_entries(tree.entries, principal)
    return InodeTable(visible, scope) if whole is None else InodeTable.pruned_from(whole, visible, scope)


def whole_table(tree: SiteTree, site: str) -> InodeTable:
    """Every file of `tree` in a table numbered for `site`, ready for `prune` to filter: a view
    of a 100,000-page tree is then about half the work of building its own table."""
    whole = InodeTable(tree.entries, InodeScope(site=site))
    whole.prepare_pruning()
    return whole


class PrunedTables(Generic[V]):
    """What is kept per reader class of one site's current tree: the pruned `InodeTable`
    (`build=prune`), or whatever `build` makes of the tree and a reader of the class (the mount
    server keeps a table's listing attributes with it). At most `max_tables` classes, the least
    recently used dropped first. Thread-safe; building blocks (a trio caller runs it in a thread)."""

    def __init__(self, build: Callable[[SiteTree, Principal], V], max_tables: int = MAX_TABLES) -> None:
        self.build = build
        self.version: str | None = None  # the tree version of every entry kept
        self._by_class: LRUCache[VisibilityKey, V] = LRUCache(maxsize=max_tables)
        self._lock = threading.Lock()
        self.builds = 0

    def __len__(self) -> int:
        return len(self._by_class)

    def get(self, tree: SiteTree, principal: Principal) -> V:
        """The reader's class's entry for `tree`, built on first use."""
        key = visibility_key(principal)
        with self._lock:
            self._follow(tree.version)
            kept = self._by_class.get(key)
            if kept is None:
                kept = self._by_class[key] = self.build(tree, principal)
                self.builds += 1
            return kept

    def keep_only(self, tree: SiteTree) -> None:
        """Forget every entry of a version other than `tree`'s (a follower's subscriber: the old
        tables go as soon as a new tree is known, not at the next reader)."""
        with self._lock:
            self._follow(tree.version)

    def _follow(self, version: str) -> None:
        if version != self.version:
            self._by_class.clear()
            self.version = version
