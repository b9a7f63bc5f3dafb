"""Following the re-ingests of many sites from one process (a serving process, issue 30; a standalone
mount watches its one site the same way, serving/tree_switch.py), at a
cost that does not grow with them per second: per Redis ONE subscription to every site's channel
and ONE batched read of every site's version key per interval, where a follower per site on a thread of its own
would hold a thread, a connection and a version read each.

Each site is still a `TreeFollower` with its subscribers; the watch only decides when each one
checks: a site whose channel announced, or whose version key differs from the tree it holds, is
checked at once (its tree loaded in a worker thread, within the backend timeout); a site whose
version Redis does not hold asks Chroma: every interval without Redis, as a mount does; at most
every `CHROMA_POLL_S` when Redis is down or its key expired (a thousand sites must not turn an
expired key into a thousand Chroma queries a second).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from chromafs_fuse.site.follower import TreeFollower

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache

log = logging.getLogger("chromafs.site")
WATCH_INTERVAL_S = 1.0
CHROMA_POLL_S = 5.0  # the interval of a mount without Redis
ANNOUNCEMENT_WAIT_S = 1.0  # how soon a channel added is subscribed to
CHECKS_AT_ONCE = 4  # trees loaded at the same time (a re-ingest of many sites at once)


class Announcements(Protocol):
    """Many sites' channels through one subscription (backends/redis_cache.ManyTreeAnnouncements)."""

    def want(self, channels: set[str]) -> None: ...

    def wait(self, timeout_s: float) -> set[str]: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class Watched:
    name: str
    follower: TreeFollower
    redis: RedisCache | None
    version_key: str | None
    channel: str | None
    timeout_s: float  # the site's backend timeout: a check that takes longer is abandoned
    chroma_checked: float = -math.inf  # when Chroma was last asked for the version (monotonic)


class SiteWatch:
    """Every watched site's follower driven from one trio task (`run`, until cancelled)."""

    def __init__(self) -> None:
        self.sites: dict[str, Watched] = {}
        self._announcements: dict[int, tuple[RedisCache, Announcements]] = {}  # by id of the RedisCache
        self._announced: set[str] = set()  # names of sites announced since the last check
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._threads = trio.CapacityLimiter(CHECKS_AT_ONCE)
        self._pending_listeners: list[Watched] = []  # sites on a Redis Cluster, listened to once running
        self.rounds = 0  # checks of every site
        self.version_reads = 0  # batched reads of version keys (one per Redis per round)

    @property
    def interval_s(self) -> float:
        """Every site is checked at the shortest interval asked for (a batched read costs the
        same for one site or all)."""
        return min((w.follower.interval_s for w in self.sites.values()), default=WATCH_INTERVAL_S)

    def add(self, name: str, follower: TreeFollower, redis: RedisCache | None, timeout_s: float) -> None:
        """Watch a site (its follower's `interval_s` > 0) under a name of the caller's."""
        keys = follower.trees.version_key_and_channel() if redis is not None else None
        version_key, channel = keys if keys is not None else (None, None)
        watched = self.sites[name] = Watched(name, follower, redis, version_key, channel, timeout_s)
        if redis is not None and channel is not None and redis.clustered:
            # a cluster's channels live on their shards: each site listens on its own (sharded
            # pub/sub where the cluster has it, through the follower's own subscription)
            self._pending_listeners.append(watched)
            if self._nursery is not None:
                self._start_site_listeners()
        elif redis is not None and channel is not None:
            listening = self._announcements.get(id(redis))
            if listening is None:
                from chromafs_fuse.backends.redis_cache import ManyTreeAnnouncements

                listening = self._announcements[id(redis)] = (redis, ManyTreeAnnouncements(redis.announcements_client))
                if self._nursery is not None:
                    self._nursery.start_soon(self._listen, listening[1])
            self._want(redis)
        self._announced.add(name)  # checked at once: a re-ingest may have come while its tree loaded
        self._wake.set()

    def remove(self, name: str) -> None:
        watched = self.sites.pop(name, None)
        if watched is not None and watched.redis is not None and id(watched.redis) in self._announcements:
            self._want(watched.redis)

    def _want(self, redis: RedisCache) -> None:
        channels = {w.channel for w in self.sites.values() if w.redis is redis and w.channel is not None}
        self._announcements[id(redis)][1].want(channels)

    # -- the task --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for _redis, listening in self._announcements.values():
                    nursery.start_soon(self._listen, listening)
                self._start_site_listeners()
                await self._check_forever()
        finally:
            for _redis, listening in self._announcements.values():
                listening.close()

    async def _check_forever(self) -> None:
        next_round = trio.current_time() + self.interval_s
        while True:
            with trio.move_on_at(next_round):
                await self._wake.wait()
            self._wake = trio.Event()
            if trio.current_time() >= next_round:
                next_round = trio.current_time() + self.interval_s
                due, self._announced = list(self.sites.values()), set()
                self.rounds += 1
            else:
                names, self._announced = self._announced, set()
                due = [w for name, w in self.sites.items() if name in names]
            if due:
                try:
                    await self.check(due)
                except Exception:  # nothing here may end the process: the sites keep their trees
                    log.exception("checking %d sites for new trees failed", len(due))

    def _start_site_listeners(self) -> None:
        assert self._nursery is not None
        for watched in self._pending_listeners:
            self._nursery.start_soon(self._listen_to_site, watched)
        self._pending_listeners = []

    async def _listen_to_site(self, watched: Watched) -> None:
        """One site's announcements on a Redis Cluster (a thread of its own waits), until the site
        is no longer watched."""
        own = trio.CapacityLimiter(1)
        follower = watched.follower
        while self.sites.get(watched.name) is watched:
            try:
                announced = await trio.to_thread.run_sync(
                    follower.wait_for_announcement, abandon_on_cancel=True, limiter=own
                )
            except Exception:  # the poll of the version key goes on meanwhile
                log.exception("waiting for %s's tree announcements failed", watched.name)
                await trio.sleep(ANNOUNCEMENT_WAIT_S)
                continue
            if announced:
                self._announced.add(watched.name)
                self._wake.set()

    async def _listen(self, announcements: Announcements) -> None:
        own = trio.CapacityLimiter(1)  # the one waiting thread, outside trio's default limiter
        while True:
            try:
                channels = await trio.to_thread.run_sync(
                    announcements.wait, ANNOUNCEMENT_WAIT_S, abandon_on_cancel=True, limiter=own
                )
            except Exception:  # the poll of the version keys goes on meanwhile
                log.exception("waiting for tree announcements failed")
                announcements.close()
                await trio.sleep(ANNOUNCEMENT_WAIT_S)
                continue
            if channels:
                for watched in self.sites.values():
                    if watched.channel in channels:
                        watched.follower.announced += 1
                        self._announced.add(watched.name)
                self._wake.set()

    # -- a check ---------------------------------------------------------------------------

    async def check(self, due: Sequence[Watched]) -> None:
        """Load and hand out the new tree of every site in `due` whose published version moved."""
        moved = await self._moved(due)
        async with trio.open_nursery() as nursery:
            for watched in moved:
                nursery.start_soon(self._reload, watched)

    async def _moved(self, due: Sequence[Watched]) -> list[Watched]:
        """The sites whose version is not the one held, and those Redis cannot tell about and
        whose turn to ask Chroma has come."""
        now = time.monotonic()
        moved: list[Watched] = []
        unknown: list[Watched] = []
        by_redis: dict[int, list[Watched]] = {}
        for watched in due:
            if watched.redis is None or watched.version_key is None:
                unknown.append(watched)
            else:
                by_redis.setdefault(id(watched.redis), []).append(watched)
        for group in by_redis.values():
            redis = group[0].redis
            assert redis is not None
            keys = [str(w.version_key) for w in group]  # grouped above: each has one
            try:
                with trio.fail_after(max(w.timeout_s for w in group)):
                    versions = await trio.to_thread.run_sync(redis.get_each, keys, abandon_on_cancel=True)
            except trio.TooSlowError:
                versions = None
            self.version_reads += 1
            if versions is None:  # Redis down or hanging: as if it held no version
                unknown += group
                continue
            for watched, version in zip(group, versions, strict=True):
                held = watched.follower.tree
                if version is None:
                    unknown.append(watched)
                elif held is None or version.decode() != held.version:
                    moved.append(watched)
        for watched in unknown:
            every_s = watched.follower.interval_s
            if watched.redis is not None:  # Redis down or its key expired: slower than a version read
                every_s = max(every_s, CHROMA_POLL_S)
            if now - watched.chroma_checked >= every_s:
                watched.chroma_checked = now
                moved.append(watched)
        return moved

    async def _reload(self, watched: Watched) -> None:
        follower = watched.follower
        try:
            with trio.fail_after(watched.timeout_s):
                tree = await trio.to_thread.run_sync(follower.published, abandon_on_cancel=True, limiter=self._threads)
        except Exception as exc:  # a backend down or hanging (TooSlowError): keep the tree held, try later
            follower.failed(exc)
            return
        if tree is not None and self.sites.get(watched.name) is watched:  # not removed meanwhile
            follower.hand_out(tree)
