"""A site's views for readers without a mount (the MCP tools, `chromafs search` through the mount
server): the site's tree followed across re-ingests, pruned once per reader class, its pages read
through one page source, and each class's search index kept warm between calls."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from chromafs_fuse.access import Principal
from chromafs_fuse.config import SessionConfig
from chromafs_fuse.site.follower import TreeFollower, follow_in_thread
from chromafs_fuse.site.loader import LoadedSite, SiteLoader
from chromafs_fuse.site.tables import PrunedTables, prune
from chromafs_fuse.site.view import ReaderView
from chromafs_fuse.tree import SiteTree

if TYPE_CHECKING:
    from chromafs_fuse.site.page_source import PageSource
    from chromafs_fuse.site.searcher import Searcher

log = logging.getLogger("chromafs.views")


class SiteViews:
    """The reader's view for a call: the site's tree followed across re-ingests (checked every
    `refresh_s`, at once when Redis announces one; 0: on every call), pruned once per reader
    class, its pages read through one page source. Thread-safe."""

    def __init__(self, config: SessionConfig, refresh_s: float = 5.0) -> None:
        self.config = config
        self.loader = SiteLoader(config)
        self.refresh_s = refresh_s
        self.tables = PrunedTables(prune)
        self.follower: TreeFollower | None = None  # once the site is loaded
        self._serving: tuple[SiteTree, PageSource] | None = None  # the tree followed now, the pages' source
        self._loading = threading.Lock()
        self._pages = threading.Lock()  # every view's page loads: they share the page source
        self._searchers: dict[int, Searcher] = {}  # per reader class's table of the tree followed now
        self._searchers_of: SiteTree | None = None

    def view_for(self, principal: Principal) -> ReaderView:
        """The view of a verified reader (site/loader.verify_reader). Blocking: the site's first
        load, a refresh with `refresh_s` 0."""
        if self._serving is None:
            self._load(principal)
        elif self.refresh_s == 0:
            self._refresh()
        assert self._serving is not None
        tree, source = self._serving
        table = self.tables.get(tree, principal)
        with self._pages:
            if self._searchers_of is not tree:  # a new tree: its searches start afresh
                self._searchers_of, self._searchers = tree, {}
            warm = self._searchers.get(id(table))
        view = ReaderView(LoadedSite(tree, table, source), self.config, principal, page_lock=self._pages, warm=warm)
        if warm is None:
            searcher = view.searcher  # (takes the page lock itself)
            with self._pages:
                self._searchers[id(table)] = searcher  # kept warm for the class's next calls
        return view

    def _load(self, principal: Principal) -> None:
        """The site, loaded by its first reader; from then on it follows re-ingests."""
        with self._loading:
            if self._serving is not None:
                return
            site = self.loader.load(principal)
            self.follower = TreeFollower(self.loader, site.source.chroma, site.tree, self.refresh_s)
            self.follower.subscribe(self._switch)
            self.follower.subscribe(self.tables.keep_only)
            self._serving = (site.tree, site.source)
            if self.refresh_s > 0:
                follow_in_thread(self.follower)

    def _refresh(self) -> None:
        assert self.follower is not None
        try:
            self.follower.refresh()
        except Exception as exc:  # a backend failure of any kind: the follower logs it and keeps its tree
            self.follower.failed(exc)

    def _switch(self, tree: SiteTree) -> None:
        """A new tree from the follower: the next call reads it."""
        assert self._serving is not None
        with self._pages:
            source = self._serving[1]
            if tree.version == source.tree_version:
                return
            source.switch(tree.version)
            self._serving = (tree, source)
        log.info("the site's tree is now %s: views follow it", tree.version)
