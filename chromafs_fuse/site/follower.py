"""Following one site's re-ingests: the tree published now, loaded once per new version and
handed to every holder of a view of the site.

`TreeFollower` is the whole logic and blocking throughout. How it is driven is the runtime's:
- a trio process (a standalone mount, a serving process of the mount server): a `SiteWatch`
  (site/watch.py) checks every site it follows after each announcement or interval (the checks
  in worker threads) and hands new trees out on the loop; `new_trees` makes that a channel;
- the threaded MCP server: `follow_in_thread`, a loop in a thread of its own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import trio

from chromafs_fuse.tree import SiteTree

if TYPE_CHECKING:
    from chromafs_fuse.backends.chroma_store import ChromaPages
    from chromafs_fuse.backends.redis_cache import TreeAnnouncements

log = logging.getLogger("chromafs.site")
OpenChroma = Callable[[], "ChromaPages"]
TreeListener = Callable[[SiteTree], None]


class PublishedTrees(Protocol):
    """Where a site's published tree is read (site/loader.SiteLoader)."""

    def tree_from_redis(self) -> SiteTree | None: ...

    def current_version(self, chroma: OpenChroma) -> str: ...

    def reload_tree(self, chroma: OpenChroma) -> SiteTree: ...

    def announcements(self) -> TreeAnnouncements | None: ...

    def version_key_and_channel(self) -> tuple[str, str] | None: ...


class TreeFollower:
    """One site's published tree, followed. `chroma` opens the site's Chroma client; without it
    the tree is had from Redis only (the mount server never opens Chroma: its client's threads
    do not survive a fork). `tree` is the one the holders of views serve when it starts."""

    def __init__(
        self,
        trees: PublishedTrees,
        chroma: OpenChroma | None,
        tree: SiteTree | None = None,
        interval_s: float = 5.0,
    ) -> None:
        self.trees = trees
        self.chroma = chroma
        self.tree = tree  # the tree handed out last
        self.interval_s = interval_s
        self._listeners: list[TreeListener] = []
        self._checking = threading.Lock()  # one check at a time
        self._handing_out = threading.Lock()  # each tree handed out once
        self.failures = 0  # checks that failed (a backend down): the tree held stays
        self.announced = 0  # checks made because Redis announced a version
        self.handed_out = 0  # new trees handed out

    @functools.cached_property
    def announcements(self) -> TreeAnnouncements | None:
        """Redis's announcements of new versions, made at first use and subscribed at the first
        wait (a follower that a SiteWatch drives never uses them)."""
        return self.trees.announcements()

    def describe(self) -> dict[str, object]:
        return {
            "refresh_interval_s": self.interval_s,
            "refresh_failures": self.failures,
            "tree_announcements": self.announced,
        }

    def subscribe(self, listener: TreeListener) -> Callable[[], None]:
        """Call `listener` with each new tree, where the driver hands it out (on the trio loop
        for a `SiteWatch`, in the follower's thread for `follow_in_thread`, in the caller's
        for `refresh`); on the loop it must not block. Returns what unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # -- the steps a driver takes ------------------------------------------------------------

    def published(self) -> SiteTree | None:
        """Blocking: the tree published now (the one held when its version is unchanged: a GET
        of a few bytes), or None when it cannot be had without Chroma and there is none."""
        with self._checking:
            if self.chroma is None:
                return self.trees.tree_from_redis()  # loads the document only for a new version
            held = self.tree
            if held is not None and self.trees.current_version(self.chroma) == held.version:
                return held
            return self.trees.reload_tree(self.chroma)

    def hand_out(self, tree: SiteTree) -> bool:
        """Follow `tree` from now on and give it to every subscriber, unless it is the tree
        followed already; True if it was new."""
        with self._handing_out:
            if self.tree is not None and tree.version == self.tree.version:
                return False
            previous, self.tree = self.tree, tree
            self.handed_out += 1
            if previous is not None:
                log.info("tree %s -> %s", previous.version, tree.version)
            for listener in list(self._listeners):
                listener(tree)
            return True

    def hand_out_again(self) -> None:
        """A subscriber could not switch to the tree handed out: the next check hands the tree
        published then out again (a subscriber ignores a tree of the version it serves)."""
        with self._handing_out:
            self.tree = None

    def failed(self, exc: Exception) -> None:
        self.failures += 1
        log.warning("checking for a new tree failed: %s", exc)

    def wait_for_announcement(self) -> bool:
        """Blocking, up to `interval_s`: True when Redis announced a new version. Only for a
        follower with announcements (without, a driver sleeps its own way)."""
        assert self.announcements is not None
        if self.announcements.wait(self.interval_s):
            self.announced += 1
            return True
        return False

    def refresh(self) -> SiteTree | None:
        """Check now, in the caller's thread, and hand out a new tree; the tree published now
        (None: none without Chroma, see `published`). Raises what the backend raised."""
        tree = self.published()
        if tree is not None:
            self.hand_out(tree)
        return tree


# -- the drivers -------------------------------------------------------------------------------


@contextlib.contextmanager
def new_trees(follower: TreeFollower) -> Iterator[trio.MemoryReceiveChannel[SiteTree]]:
    """The trees a follower hands out, as a channel, for a subscriber whose switch awaits
    (a mount's): trees that came while it switched wait in order; the last one is the newest."""
    send: trio.MemorySendChannel[SiteTree]
    receive: trio.MemoryReceiveChannel[SiteTree]
    send, receive = trio.open_memory_channel(math.inf)
    with send, receive:
        unsubscribe = follower.subscribe(send.send_nowait)
        try:
            yield receive
        finally:
            unsubscribe()


def follow_in_thread(follower: TreeFollower) -> threading.Event:
    """Follow in a daemon thread of its own until the returned event is set."""
    if not follower.interval_s > 0:
        raise ValueError("a follower's thread needs an interval of more than 0 seconds")
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            if follower.announcements is None:
                stop.wait(follower.interval_s)
            else:
                follower.wait_for_announcement()
            if stop.is_set():
                return
            try:
                follower.refresh()
            except Exception as exc:  # a backend failure of any kind: the follower logs it and keeps its tree
                follower.failed(exc)

    threading.Thread(target=follow, name="chromafs-tree-follower", daemon=True).start()
    return stop
