"""One follower of a site's re-ingests (in-process, a fake site in place of Redis and Chroma):
a new version is loaded once and handed to every subscriber, an unchanged one costs a version
read only, and the three ways of driving it (per request, a thread, a trio task) behave alike."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import trio

from chromafs_fuse.site.follower import TreeFollower, follow_in_thread, new_trees
from chromafs_fuse.site.watch import SiteWatch
from chromafs_fuse.tree import SiteTree, parse_tree
from infra import hold_for, trio_wait_until, wait_until


def tree(text: str) -> SiteTree:
    return parse_tree(json.dumps({"index.md": {"isPublic": True, "size": len(text)}, f"{text}.md": {"isPublic": True}}))


class Announcements:
    """Redis's channel of new versions: `wait` returns True once per `announce`."""

    def __init__(self) -> None:
        self._news = threading.Event()

    def announce(self) -> None:
        self._news.set()

    def wait(self, timeout_s: float) -> bool:
        if self._news.wait(timeout_s):
            self._news.clear()
            return True
        return False


class FakeSite:
    """The published tree as SiteLoader reads it, counting what each read costs."""

    def __init__(self, announcements: Announcements | None = None) -> None:
        self.published = tree("one")
        self.in_redis = True
        self.channel = announcements
        self.version_reads = 0
        self.tree_loads = 0
        self.failing: Exception | None = None
        self.hang_s = 0.0

    def tree_from_redis(self) -> SiteTree | None:
        self.version_reads += 1
        return self.published if self.in_redis else None

    def current_version(self, chroma: Callable[[], object]) -> str:
        self.version_reads += 1
        hold_for(self.hang_s, "a Chroma that hangs")
        if self.failing is not None:
            raise self.failing
        return self.published.version

    def reload_tree(self, chroma: Callable[[], object]) -> SiteTree:
        self.tree_loads += 1
        return self.published

    def announcements(self) -> Announcements | None:
        return self.channel

    def reingest(self, text: str) -> None:
        self.published = tree(text)
        if self.channel is not None:
            self.channel.announce()


def no_chroma() -> object:
    raise AssertionError("the fake site never opens Chroma")


def test_per_request_a_new_version_is_handed_to_every_subscriber_once() -> None:
    """The mount server's way: refresh() on each request, from Redis only."""
    site = FakeSite()
    follower = TreeFollower(site, chroma=None)
    first: list[str] = []
    second: list[str] = []
    follower.subscribe(lambda t: first.append(t.version))
    unsubscribe = follower.subscribe(lambda t: second.append(t.version))
    one = site.published
    assert follower.refresh() is one and follower.refresh() is one
    assert first == second == [one.version] and site.version_reads == 2
    site.reingest("two")
    unsubscribe()
    assert follower.refresh() is site.published is follower.tree
    assert first == [one.version, site.published.version] and second == [one.version]
    site.in_redis = False  # the tree expired from Redis: the caller loads it from Chroma itself
    assert follower.refresh() is None and follower.tree is not None


def test_an_unchanged_version_costs_a_version_read_and_a_changed_one_loads_the_tree_once() -> None:
    site = FakeSite()
    follower = TreeFollower(site, no_chroma, site.published)
    handed: list[SiteTree] = []
    follower.subscribe(handed.append)
    for _ in range(3):
        assert follower.refresh() is site.published
    assert (site.version_reads, site.tree_loads, handed) == (3, 0, [])
    site.reingest("two")
    follower.refresh()
    follower.refresh()
    assert (site.tree_loads, handed) == (1, [site.published])
    follower.hand_out_again()  # the subscriber could not switch: the next check hands it out again
    follower.refresh()
    assert (site.tree_loads, handed) == (2, [site.published, site.published])


def test_in_a_thread_an_announcement_wakes_the_follower_long_before_its_interval() -> None:
    site = FakeSite(Announcements())
    follower = TreeFollower(site, no_chroma, site.published, interval_s=60)
    arrived = threading.Event()
    follower.subscribe(lambda _: arrived.set())
    stop = follow_in_thread(follower)
    try:
        site.reingest("two")
        assert arrived.wait(2.0), "not handed out within 2 s of the announcement"
        assert follower.tree is site.published and follower.announced == 1 and site.tree_loads == 1
    finally:
        stop.set()


def test_in_a_thread_a_failing_backend_keeps_the_tree_and_polling_goes_on() -> None:
    site = FakeSite()
    follower = TreeFollower(site, no_chroma, site.published, interval_s=0.02)
    held = site.published
    site.failing = ConnectionError("Chroma is down")
    stop = follow_in_thread(follower)
    try:
        deadline = time.monotonic() + 5
        wait_until(lambda: follower.failures >= 2, 5, "two failed polls", 0.01)
        assert follower.tree is held
        site.failing = None
        site.reingest("two")
        left_s = deadline - time.monotonic()
        wait_until(lambda: follower.tree is site.published, left_s, "the new tree once the backend is back", 0.01)
    finally:
        stop.set()


def test_on_trio_a_site_watch_hands_new_trees_to_the_loop_in_order_and_abandons_a_hanging_check() -> None:
    """A standalone mount's follower, driven by a SiteWatch of one site with no Redis (polled)."""
    site = FakeSite()
    follower = TreeFollower(site, no_chroma, site.published, interval_s=0.02)
    on_loop: list[bool] = []
    follower.subscribe(lambda _: on_loop.append(trio.lowlevel.in_trio_task()))

    async def main() -> list[str]:
        got: list[str] = []
        async with trio.open_nursery() as nursery:
            with new_trees(follower) as trees:
                watch = SiteWatch()
                nursery.start_soon(watch.run)
                watch.add("site", follower, None, 0.2)
                site.reingest("two")
                got.append((await trees.receive()).version)
                site.hang_s = 0.5  # longer than the check's timeout: abandoned, counted, tried again
                await trio_wait_until(lambda: follower.failures, 5, "a check abandoned")
                site.hang_s = 0.0
                site.reingest("three")
                got.append((await trees.receive()).version)
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) == [tree("two").version, tree("three").version]
    assert on_loop == [True, True] and follower.tree is site.published and follower.handed_out == 2
