"""The Redis adapter: the cache every mount of a site shares, across machines.

Blocking calls with short timeouts, run off the trio loop. Redis is an
optimisation only: when it fails, the cache reports a miss, logs one warning
per outage, and is skipped for a few seconds before it is tried again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence

import redis

log = logging.getLogger(__name__)
DEFAULT_TTL_S = 24 * 3600
DEFAULT_TREE_TTL_S = 300
RETRY_AFTER_S = 5.0


class RedisCache:
    def __init__(
        self,
        url: str,
        prefix: str = "chromafs",
        ttl_s: int = DEFAULT_TTL_S,
        tree_ttl_s: int = DEFAULT_TREE_TTL_S,
        timeout_s: float = 0.5,
    ) -> None:
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.tree_ttl_s = tree_ttl_s
        self._down_until = 0.0
        self._down = False
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.errors = 0

    # -- keys: namespaced by site, pages by their content ---------------------

    def tree_key(self, site: str, collection: str) -> str:
        return f"{self.prefix}:{site}:{collection}:tree"

    def tree_version_key(self, site: str, collection: str) -> str:
        return f"{self.prefix}:{site}:{collection}:tree-version"

    def tree_channel(self, site: str, collection: str) -> str:
        return f"{self.prefix}:{site}:{collection}:tree-updates"

    def publish_tree(self, site: str, collection: str, document: bytes, version: str, ttl_s: int) -> None:
        """The tree and its version in one MULTI/EXEC, so a reader never sees one without the
        other, and a mount server checks freshness with a tiny GET of the version; the version
        is announced on the site's channel in the same step, so running mounts switch at once."""
        if not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.tree_key(site, collection), document, ex=ttl_s)
            pipe.set(self.tree_version_key(site, collection), version.encode(), ex=ttl_s)
            pipe.publish(self.tree_channel(site, collection), version.encode())
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(exc)
            return
        self._succeeded()

    def listen_for_trees(self, site: str, collection: str) -> TreeAnnouncements:
        return TreeAnnouncements(self.client, self.tree_channel(site, collection))

    def page_key(self, site: str, content_version: str, page: str) -> str:
        """A page's bytes, under its sha256 (a tree's pages without one: the tree version)."""
        return f"{self.prefix}:{site}:{content_version}:page:{page}"

    # -- health ------------------------------------------------------------

    def _usable(self) -> bool:
        return not self._down or time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            if not self._down:
                log.warning("Redis unavailable, reading from the backend instead: %s", exc)
            self._down = True
            self._down_until = time.monotonic() + RETRY_AFTER_S

    def _succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    log.info("Redis is reachable again")
                self._down = False

    # -- operations --------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        if not self._usable():
            return None
        try:
            value = self.client.get(key)
        except redis.RedisError as exc:
            self._failed(exc)
            return None
        self._succeeded()
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return bytes(value)  # type: ignore[arg-type]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or not self._usable():
            return [None] * len(keys)
        try:
            values = self.client.mget(list(keys))
        except redis.RedisError as exc:
            self._failed(exc)
            return [None] * len(keys)
        self._succeeded()
        out = [None if v is None else bytes(v) for v in values]  # type: ignore[union-attr]
        self.hits += sum(1 for v in out if v is not None)
        self.misses += sum(1 for v in out if v is None)
        return out

    def set(self, key: str, value: bytes, ttl_s: int | None = None) -> None:
        self.set_many({key: value}, ttl_s)

    def set_many(self, items: dict[str, bytes], ttl_s: int | None = None) -> None:
        if not items or not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_s or self.ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(exc)
            return
        self._succeeded()


class TreeAnnouncements:
    """New tree versions announced on a site's channel. One thread at a time calls `wait`; a
    message sent while nobody waits is buffered on the subscription, so none is missed once
    subscribed. Polling the version key stays the fallback for everything else."""

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.client = client
        self.channel = channel
        self._pubsub: redis.client.PubSub | None = None

    def wait(self, timeout_s: float) -> bool:
        """Blocking: True as soon as a new version is announced, False after `timeout_s`
        without one (also when Redis is down: the caller then polls as before)."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._pubsub is None:
                self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self.channel)
            while (left := deadline - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    return True
        except (redis.RedisError, OSError) as exc:
            log.debug("tree announcements unavailable: %s", exc)
            self.close()  # subscribe again on the next wait
            time.sleep(max(0.0, deadline - time.monotonic()))
        return False

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()
