"""Many sites' re-ingests followed from one process against a real redis-server (issue 30): one
subscription and one batched version read per Redis, whatever the number of sites, and each new
tree reaches its own site's subscriber only."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from chromafs_fuse.backends.chroma_store import ChromaLocation
from chromafs_fuse.backends.redis_cache import RedisCache
from chromafs_fuse.config import RedisSettings, SessionConfig
from chromafs_fuse.names import CHUNK_INDEX_FIELD, PAGE_FIELD
from chromafs_fuse.site.follower import TreeFollower, new_trees
from chromafs_fuse.site.loader import SiteLoader
from chromafs_fuse.site.watch import SiteWatch
from chromafs_fuse.tree import SiteTree, parse_tree
from infra import trio_hold_for, trio_wait_until

if TYPE_CHECKING:
    from infra import RedisServer

SITES = 30
Scenario = Callable[[RedisCache, SiteWatch, dict[str, list[str]]], Awaitable[None]]


def listened(redis_server: RedisServer, site: str) -> bool:
    """The watch's subscription listens on the site's channel."""
    return redis_server.cli("PUBSUB", "NUMSUB", f"chromafs:{{{site}}}:{site}:tree-updates").split()[-1] == "1"


def document(text: str) -> bytes:
    return json.dumps({"index.md": {"isPublic": True, "size": len(text)}, f"{text}.md": {"isPublic": True}}).encode()


def publish(redis: RedisCache, site: str, text: str, announce: bool = True) -> SiteTree:
    raw = document(text)
    tree = parse_tree(raw.decode())
    if announce:
        assert redis.publish_tree(site, site, raw, tree.version, 600)
    else:  # a tree written by a tool that does not announce: only the poll finds it
        redis.client.set(redis.tree_key(site, site), raw, ex=600)
        redis.client.set(redis.tree_version_key(site, site), tree.version.encode(), ex=600)
    return tree


def follower(site: str, redis: RedisCache, interval_s: float) -> TreeFollower:
    config = SessionConfig(
        site=site,
        chroma=ChromaLocation(path="/nonexistent", collection=site),  # never opened: the tree is in Redis
        page_field=PAGE_FIELD,
        chunk_index_field=CHUNK_INDEX_FIELD,
        redis=RedisSettings(redis.target.describe()),
    )
    loader = SiteLoader(config, redis)
    tree = loader.tree_from_redis()
    assert tree is not None
    return TreeFollower(loader, None, tree, interval_s)


def stat(redis_server: RedisServer, command: str) -> int:
    """How many times redis-server ran `command` (INFO commandstats)."""
    for line in redis_server.cli("INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def watch_sites(redis_server: RedisServer, interval_s: float, scenario: Scenario) -> None:
    redis = RedisCache(redis_server.url)
    names = [f"site{n:02d}" for n in range(SITES)]
    for name in names:
        publish(redis, name, "one")
    watch = SiteWatch()
    received: dict[str, list[str]] = {name: [] for name in names}
    followers = {name: follower(name, redis, interval_s) for name in names}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        for name, each in followers.items():
            watch.add(name, each, redis, 5.0)

            async def collect(name: str = name, each: TreeFollower = each) -> None:
                with new_trees(each) as trees:
                    async for tree in trees:
                        received[name].append(tree.version)

            nursery.start_soon(collect)
        await scenario(redis, watch, received)
        nursery.cancel_scope.cancel()


def test_one_subscription_hears_every_site_and_hands_each_tree_to_its_own_site(redis_server: RedisServer) -> None:
    async def scenario(redis: RedisCache, watch: SiteWatch, received: dict[str, list[str]]) -> None:
        await trio_wait_until(lambda: listened(redis_server, "site29"), 10, "the watch subscribed", 0.05)
        clients = redis_server.cli("CLIENT", "LIST", "TYPE", "pubsub").splitlines()
        assert len(clients) == 1, clients  # one subscription for 30 sites
        gets_before = stat(redis_server, "get")
        new = publish(redis, "site17", "two")
        started = trio.current_time()
        await trio_wait_until(lambda: received["site17"], 5, "site17's new tree")
        assert trio.current_time() - started < 2.0  # the interval is 60 s: the announcement did it
        assert received["site17"] == [new.version]
        await trio_hold_for(0.3, "no other site may receive a tree meanwhile")
        assert {name: got for name, got in received.items() if got} == {"site17": [new.version]}
        assert stat(redis_server, "get") - gets_before <= 3  # only the announced site read its version

    trio.run(watch_sites, redis_server, 60.0, scenario)


def test_a_tree_nobody_announced_is_found_by_one_batched_read_per_interval(redis_server: RedisServer) -> None:
    async def scenario(redis: RedisCache, watch: SiteWatch, received: dict[str, list[str]]) -> None:
        await trio_wait_until(lambda: watch.rounds >= 2, 5, "a few rounds of nothing new")
        gets, mgets, rounds = stat(redis_server, "get"), stat(redis_server, "mget"), watch.rounds
        await trio_wait_until(lambda: watch.rounds - rounds >= 4, 5, "four more rounds")
        rounds = watch.rounds - rounds
        assert stat(redis_server, "get") == gets  # no site read its version on its own
        # one read of 30 versions per round (a round counts itself before its read: one may be in flight
        # at either end of the window)
        assert rounds - 1 <= stat(redis_server, "mget") - mgets <= rounds + 1
        new = publish(redis, "site05", "two", announce=False)
        await trio_wait_until(lambda: received["site05"], 5, "site05's new tree")
        assert received["site05"] == [new.version]
        assert all(not got for name, got in received.items() if name != "site05")

    trio.run(watch_sites, redis_server, 0.25, scenario)


def test_a_redis_that_stops_and_comes_back_is_subscribed_to_again(redis_server: RedisServer) -> None:
    async def scenario(redis: RedisCache, watch: SiteWatch, received: dict[str, list[str]]) -> None:
        await trio_wait_until(lambda: listened(redis_server, "site03"), 10, "the watch subscribed", 0.05)
        redis_server.cli("CLIENT", "KILL", "TYPE", "pubsub")  # the subscription is lost
        assert not listened(redis_server, "site03")
        await trio_wait_until(lambda: listened(redis_server, "site03"), 5, "the watch subscribed again", 0.05)
        new = publish(redis, "site03", "three")
        await trio_wait_until(lambda: received["site03"], 5, "site03's new tree")
        assert received["site03"] == [new.version]

    trio.run(watch_sites, redis_server, 60.0, scenario)
