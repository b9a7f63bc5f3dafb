"""A client for the Redis a `--redis-url` names (the URL's parsing is the core's: redis_url.py):
one server, a Redis Cluster, or the master a set of Sentinels points at."""

from __future__ import annotations

from typing import Any

from chromafs_fuse.redis_url import RedisTarget, RedisURLError, parse_redis_url

__all__ = ["RedisTarget", "RedisURLError", "open_client", "parse_redis_url"]


def open_client(target: RedisTarget, timeout_s: float, ca_file: str | None = None) -> Any:
    """A redis-py client for `target`. Connects lazily for one server and Sentinel; a cluster
    client asks a node for the slot map here, so this raises while no node answers."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    timeouts: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    # No CLIENT SETINFO on connect: a server before Redis 7.2 answers it with an error, and
    # redis-py pipelines it with the handshake, so a handshake cut short by a timeout can leave
    # that error to be read as the answer of the next command.
    timeouts |= _no_client_setinfo(redis.Redis)
    tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": ca_file} if target.tls else {}
    if target.kind == "single":
        extra = {"ssl_ca_certs": ca_file} if target.tls and ca_file else {}
        return redis.Redis.from_url(target.url, retry_on_timeout=False, **timeouts, **extra)
    if target.kind == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            require_full_coverage=False,  # a master down costs its slots, not the whole cache
            retry=Retry(NoBackoff(), 1),  # one more try after the slot map is refreshed, no more
            username=target.username,
            password=target.password,
            **timeouts,
            **tls,
        )
    from redis.sentinel import Sentinel

    sentinel_timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    sentinels = Sentinel(list(target.nodes), sentinel_kwargs={**sentinel_timeouts, **tls}, **timeouts, **tls)
    return sentinels.master_for(
        target.service,
        db=target.db,
        retry=Retry(NoBackoff(), 0),
        username=target.username,
        password=target.password,
        **timeouts,
    )


def _no_client_setinfo(client: Any) -> dict[str, Any]:
    """The keywords that turn CLIENT SETINFO off for this redis-py: `driver_info=None` from 7.x
    on, `lib_name` and `lib_version` None before (deprecated since)."""
    import inspect

    if "driver_info" in inspect.signature(client.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}
