"""Revocations kept in a site's Redis (`chromafs revoke --redis-url`), read by every host of the site.

A revocation is one key under the site's prefix, in the site's hash slot like all its keys
(backends/redis_cache.py): `<prefix>:{<site>}:revoked:<sub|jti>:<name>`, its value when it was
made, its TTL how long it lasts. Blocking calls, run off the trio loop. Redis down: nothing is
found revoked (Redis is a cache everywhere else; a revocation that cannot be read must not stop
every reader of the site), and the cache says so once per outage.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chromafs_fuse.backends.redis_cache import REDIS_ERRORS, RedisCache
from chromafs_fuse.errors import Unavailable
from chromafs_fuse.revocation import Revocation, covering, decode_value, encode_value, names_of

if TYPE_CHECKING:
    from chromafs_fuse.config import RedisSettings

_caches: dict[tuple[str, str | None], RedisCache] = {}
_caches_lock = threading.Lock()


def cache_of(settings: RedisSettings) -> RedisCache:
    """One client per Redis for this process's revocation checks (a session's check must not
    open a connection)."""
    key = (settings.url, settings.ca_file)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = RedisCache(settings.url, settings.prefix, ca_file=settings.ca_file)
        return cache


def revoked_key(prefix: str, site: str, kind: str, name: str) -> str:
    return f"{prefix}:{{{site}}}:revoked:{kind}:{name}"


def record(settings: RedisSettings, revocation: Revocation, now: float | None = None) -> None:
    """Keep `revocation` in Redis until its `until`; Unavailable when Redis does not take it."""
    now = time.time() if now is None else now
    ttl_s = max(1, math.ceil(revocation.until - now))
    key = revoked_key(settings.prefix, revocation.site, revocation.kind, revocation.name)
    cache = RedisCache(settings.url, settings.prefix, ca_file=settings.ca_file, timeout_s=5.0)
    try:
        # a later revocation of the same name revokes more (a subject's: the tokens issued until
        # then) and lasts as long as the longer of the two asks
        ttl_s = max(ttl_s, int(cache.client.ttl(key)))
        cache.client.set(key, encode_value(revocation), ex=ttl_s)
    except REDIS_ERRORS as exc:
        raise Unavailable(f"Redis ({cache.target.describe()}) did not take the revocation: {exc}") from None


# one token to check: (its site, subject, token id, issued at)
Reader = tuple[str, str | None, str | None, float | None]


def find_many(settings: RedisSettings, readers: Sequence[Reader], now: float | None = None) -> list[Revocation | None]:
    """For each reader, the revocation that covers its token, or None: one MGET for them all
    (in a cluster, a pipeline per node). All None when Redis cannot be read."""
    now = time.time() if now is None else now
    keys: list[str] = []
    spans: list[list[tuple[str, str, str]]] = []
    for site, subject, token_id, _issued_at in readers:
        names = [(site, kind, name) for kind, name in names_of(subject, token_id)]
        spans.append(names)
        keys.extend(revoked_key(settings.prefix, *name) for name in names)
    unique = list(dict.fromkeys(keys))  # sessions of one subject share its key
    read = cache_of(settings).get_each(unique) if unique else []
    if read is None:
        return [None] * len(readers)
    by_key = dict(zip(unique, read, strict=True))
    values = [by_key[key] for key in keys]
    found: list[Revocation | None] = []
    position = 0
    for (_site, subject, token_id, issued_at), names in zip(readers, spans, strict=True):
        # its end is the key's TTL, not read: `until` is now
        kept = [decode_value(*name, values[position + i], now) for i, name in enumerate(names)]
        position += len(names)
        found.append(covering(kept, subject, token_id, issued_at))
    return found
