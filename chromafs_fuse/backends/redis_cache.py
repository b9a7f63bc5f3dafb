"""The Redis adapter: the cache every mount of a site shares, across machines.

Blocking calls with short timeouts, run off the trio loop. Redis is an
optimisation only: when it fails, the cache reports a miss, logs one warning
per outage (and one when it is back), and is skipped for a few seconds before
it is tried again.

One server, a Redis Cluster or a Sentinel-managed master (backends/redis_topology.py).
Every key and the channel of a site carry the hash tag `{site}`, so in a cluster a
site lives in one slot: MGET, the tree's MULTI/EXEC and its sharded announcement work
there as on one server.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from chromafs_fuse.backends.redis_topology import RedisTarget, open_client, parse_redis_url
from chromafs_fuse.options import DEFAULTS

if TYPE_CHECKING:
    from chromafs_fuse.config import RedisSettings

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5.0
RESUBSCRIBE_AFTER_S = 0.5
# what a failing Redis raises: a cluster's own errors are not RedisErrors
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)


class RedisCache:
    def __init__(
        self,
        url: str,
        prefix: str = "chromafs",
        ttl_s: int = DEFAULTS["--redis-ttl"],
        tree_ttl_s: int = DEFAULTS["--tree-ttl"],
        timeout_s: float = 0.5,
        ca_file: str | None = None,
    ) -> None:
        self.target: RedisTarget = parse_redis_url(url)
        self.timeout_s = timeout_s
        self.ca_file = ca_file
        self._client: Any = None
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.tree_ttl_s = tree_ttl_s
        self._down_until = 0.0
        self._down = False
        self._down_since = 0.0
        self.sharded_pubsub = self.clustered  # until the cluster turns out not to have it
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.errors = 0

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisCache:
        return cls(settings.url, settings.prefix, settings.page_ttl_s, settings.tree_ttl_s, ca_file=settings.ca_file)

    @property
    def client(self) -> Any:
        """The redis-py client, made on first use (a cluster's needs a node that answers)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = open_client(self.target, self.timeout_s, self.ca_file)
        return self._client

    @property
    def clustered(self) -> bool:
        return self.target.kind == "cluster"

    # -- keys: namespaced by site (one hash slot), pages by their content -----

    def _site(self, site: str) -> str:
        return f"{self.prefix}:{{{site}}}"

    def tree_key(self, site: str, collection: str) -> str:
        return f"{self._site(site)}:{collection}:tree"

    def tree_version_key(self, site: str, collection: str) -> str:
        return f"{self._site(site)}:{collection}:tree-version"

    def tree_channel(self, site: str, collection: str) -> str:
        return f"{self._site(site)}:{collection}:tree-updates"

    def publish_tree(self, site: str, collection: str, document: bytes, version: str, ttl_s: int) -> bool:
        """The tree and its version in one MULTI/EXEC, so a reader never sees one without the
        other, and a mount server checks freshness with a tiny GET of the version; the version
        is announced on the site's channel in the same step, so running mounts switch at once.
        False if Redis did not take it."""
        if not self._usable():
            return False
        channel = self.tree_channel(site, collection)
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.tree_key(site, collection), document, ex=ttl_s)
            pipe.set(self.tree_version_key(site, collection), version.encode(), ex=ttl_s)
            if self.sharded_pubsub:  # delivered by the slot's own nodes, not every node
                pipe.spublish(channel, version.encode())
            elif not self.clustered:
                pipe.publish(channel, version.encode())
            pipe.execute()
            if self.clustered and not self.sharded_pubsub:  # not in a cluster's MULTI: PUBLISH has no slot
                self.client.publish(channel, version.encode())
        except redis.RedisError as exc:
            if self.sharded_pubsub and _unknown_command(exc):
                log.warning("this Redis Cluster has no sharded pub/sub (Redis before 7.0): announcing with PUBLISH")
                self.sharded_pubsub = False
                return self.publish_tree(site, collection, document, version, ttl_s)
            self._failed(exc)
            return False
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return False
        self._succeeded()
        return True

    def listen_for_trees(self, site: str, collection: str) -> TreeAnnouncements:
        return TreeAnnouncements(self.announcements_client, self.tree_channel(site, collection), self.clustered)

    def announcements_client(self) -> Any:
        """A new client for one subscription to tree announcements, never the cache's: a
        subscription closed by one thread while another waits on it must not hand its connection
        to the cache's reads (seen as a read answered with another command's reply, or EBADF),
        and one made again after a failover asks the cluster where the slots are now."""
        return open_client(self.target, self.timeout_s, self.ca_file)

    def page_key(self, site: str, content_version: str, page: str) -> str:
        """A page's bytes, under its sha256 (a tree's pages without one: the tree version)."""
        return f"{self._site(site)}:{content_version}:page:{page}"

    # -- health ------------------------------------------------------------

    def _usable(self) -> bool:
        return not self._down or time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            if not self._down:
                log.warning("Redis (%s) unavailable, reading from the backend instead: %s", self.target.describe(), exc)
                self._down_since = time.monotonic()
            self._down = True
            self._down_until = time.monotonic() + RETRY_AFTER_S
            if self.clustered:  # not every failure refreshes a cluster client's slot map (a MULTI's does not)
                self._client = None

    def _succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    log.warning(
                        "Redis (%s) is reachable again after %.1fs",
                        self.target.describe(),
                        time.monotonic() - self._down_since,
                    )
                self._down = False

    # -- operations --------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        if not self._usable():
            return None
        try:
            value = self.client.get(key)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return None
        self._succeeded()
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return bytes(value)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or not self._usable():
            return [None] * len(keys)
        try:
            values = self.client.mget(list(keys))
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return [None] * len(keys)
        self._succeeded()
        out = [None if v is None else bytes(v) for v in values]
        self.hits += sum(1 for v in out if v is not None)
        self.misses += sum(1 for v in out if v is None)
        return out

    def get_each(self, keys: Sequence[str]) -> list[bytes | None] | None:
        """Many small values across sites (a cluster's slots: one pipeline per node, not atomic);
        None when Redis is down, where `get_many` would report misses."""
        if not keys or not self._usable():
            return None if keys else []
        try:
            read = self.client.mget_nonatomic if self.clustered else self.client.mget
            values = read(list(keys))
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return None
        self._succeeded()
        return [None if v is None else bytes(v) for v in values]

    def set(self, key: str, value: bytes, ttl_s: int | None = None) -> None:
        self.set_many({key: value}, ttl_s)

    def set_if_absent(self, key: str, value: bytes, ttl_s: int) -> None:
        """SET NX: never over what another writer put there first (Redis down: nothing)."""
        if not self._usable():
            return
        try:
            self.client.set(key, value, ex=ttl_s, nx=True)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return
        self._succeeded()

    def set_many(self, items: dict[str, bytes], ttl_s: int | None = None) -> None:
        if not items or not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_s or self.ttl_s)
            pipe.execute()
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return
        self._succeeded()


class TreeAnnouncements:
    """New tree versions announced on a site's channel. One thread at a time calls `wait`; a
    message sent while nobody waits is buffered on the subscription, so none is missed once
    subscribed. Polling the version key stays the fallback for everything else. In a cluster
    the channel is sharded (SSUBSCRIBE to the nodes of the site's slot)."""

    def __init__(self, client_of: Callable[[], Any], channel: str, sharded: bool = False) -> None:
        self.client_of = client_of  # a new client per subscription, closed with it
        self.channel = channel
        self.sharded = sharded
        self._client: Any = None
        self._pubsub: Any = None

    def _subscribed(self) -> Any:
        if self._pubsub is None:
            self._client = self.client_of()
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            if self.sharded:
                try:
                    pubsub.ssubscribe(self.channel)
                except redis.RedisError as exc:
                    if not _unknown_command(exc):
                        raise
                    self.sharded = False  # a cluster before Redis 7.0: the ingest announces with PUBLISH
            if not self.sharded:
                pubsub.subscribe(self.channel)
            self._pubsub = pubsub
        return self._pubsub

    def _next_message(self, timeout_s: float) -> dict | None:
        pubsub = self._subscribed()
        if self.sharded:
            return pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=timeout_s)
        return pubsub.get_message(timeout=timeout_s)

    def wait(self, timeout_s: float) -> bool:
        """Blocking: True as soon as a new version is announced, False after `timeout_s`
        without one (also when Redis is down: the caller then polls as before)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self._next_message(left)
            except REDIS_ERRORS as exc:  # lost (a failover): subscribe again, to the new master
                if self.sharded and _unknown_command(exc):  # the answer to SSUBSCRIBE comes with the messages
                    self.sharded = False  # a cluster before Redis 7.0: the ingest announces with PUBLISH
                    self.close()
                    continue
                log.debug("tree announcements unavailable: %s", exc)
                self.close()
                time.sleep(min(RESUBSCRIBE_AFTER_S, max(0.0, deadline - time.monotonic())))
                continue
            if message is not None and message.get("type") in ("message", "smessage"):
                return True
        return False

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        client, self._client = self._client, None
        _close(pubsub, client)


class ManyTreeAnnouncements:
    """New tree versions of many sites announced on their channels, through ONE subscription and
    one waiting thread (a process serving a thousand sites must not hold a connection and a
    thread per site). The loop says which channels it wants (`want`, any thread); the waiting
    thread applies that at its next `wait`, so a channel added meanwhile is heard from then on
    (the caller's poll of the version keys covers the moment between). Not for a cluster: its
    announcements are sharded per slot (the caller polls there)."""

    def __init__(self, client_of: Callable[[], Any]) -> None:
        self.client_of = client_of  # a new client per subscription, closed with it
        self._client: Any = None
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()
        self._lock = threading.Lock()
        self._pubsub: Any = None

    def want(self, channels: set[str]) -> None:
        with self._lock:
            self._wanted = set(channels)

    def _apply(self) -> Any:
        with self._lock:
            wanted = set(self._wanted)
        if self._pubsub is None:
            if not wanted:
                return None
            self._client = self.client_of()
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            self._subscribed = set()
        if wanted - self._subscribed:
            self._pubsub.subscribe(*sorted(wanted - self._subscribed))
        if self._subscribed - wanted:
            self._pubsub.unsubscribe(*sorted(self._subscribed - wanted))
        self._subscribed = wanted
        return self._pubsub if wanted else None

    def wait(self, timeout_s: float) -> set[str]:
        """Blocking, one thread at a time: the channels announced, as soon as one is (with any
        that came with it), or an empty set after `timeout_s` (also while Redis is down)."""
        deadline = time.monotonic() + timeout_s
        heard: set[str] = set()
        while not heard and (left := deadline - time.monotonic()) > 0:
            try:
                pubsub = self._apply()
                if pubsub is None:
                    time.sleep(left)
                    break
                message = pubsub.get_message(timeout=left)
                while message is not None:
                    if message.get("type") == "message":
                        channel = message.get("channel")
                        heard.add(channel.decode() if isinstance(channel, bytes) else str(channel))
                    message = pubsub.get_message(timeout=0)
            except REDIS_ERRORS as exc:  # lost (a failover): subscribe again, to the new master
                log.debug("tree announcements unavailable: %s", exc)
                self.close()
                time.sleep(min(RESUBSCRIBE_AFTER_S, max(0.0, deadline - time.monotonic())))
        return heard & self._subscribed

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        client, self._client = self._client, None
        self._subscribed = set()
        _close(pubsub, client)


def _close(pubsub: Any, client: Any) -> None:
    for part in (pubsub, client):
        if part is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                part.close()


def _unknown_command(exc: Exception) -> bool:
    """The server's answer, or redis-py's own (it asks a cluster for its commands to route them)."""
    text = str(exc).lower()
    return any(sign in text for sign in ("unknown command", "execabort", "doesn't exist in redis commands"))
