"""Which Redis a `--redis-url` names (pure: a bad URL is a flag error before anything starts).

    redis://[user:password@]host:port[/db]          one server (rediss:// over TLS)
    unix:///path/to/redis.sock[?db=N]               one server on a Unix socket
    redis+cluster://[user:password@]host:port,host:port,...
                                                    a cluster, found from any of these nodes
    redis+sentinel://[user:password@]host:port,host:port,.../service[/db]
                                                    the master of `service`, asked of these Sentinels

`rediss+cluster://` and `rediss+sentinel://` speak TLS to every node (and Sentinel). A private
CA is given with `--redis-ca FILE`. The credentials are the data nodes' (Sentinels without
authentication). The client for a target is backends/redis_topology.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from chromafs_fuse.errors import UsageError

Kind = Literal["single", "cluster", "sentinel"]
REDIS_PORT = 6379
SENTINEL_PORT = 26379


class RedisURLError(UsageError, ValueError):
    """A --redis-url that names no Redis."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    kind: Kind
    url: str  # as given, without the password when shown
    tls: bool = False
    nodes: tuple[tuple[str, int], ...] = ()  # cluster: startup nodes; sentinel: the Sentinels
    service: str = ""  # sentinel: the master's name
    db: int = 0
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        if self.kind == "single":
            parts = urlsplit(self.url)
            host = parts.hostname or parts.path
            return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
        nodes = ",".join(f"{host}:{port}" for host, port in self.nodes)
        return f"{self.kind} {nodes}" + (f" {self.service}" if self.service else "")


def parse_redis_url(url: str) -> RedisTarget:
    try:
        return _parse(url)
    except RedisURLError as exc:  # the message names the URL: never with its password
        secret = urlsplit(url).password if "://" in url else None
        if secret:
            raise RedisURLError(str(exc).replace(secret, "***")) from None
        raise


def _parse(url: str) -> RedisTarget:
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise RedisURLError(
            f"{url!r}: not a Redis URL (redis://host:port/db, redis+cluster://..., redis+sentinel://...)"
        )
    scheme = scheme.lower()
    if scheme in ("redis", "rediss", "unix"):
        return RedisTarget("single", url, tls=scheme == "rediss")
    base, _, topology = scheme.partition("+")
    if base not in ("redis", "rediss") or topology not in ("cluster", "sentinel"):
        raise RedisURLError(
            f"{url!r}: unknown scheme {scheme!r} (redis, rediss, unix, redis+cluster, redis+sentinel, "
            "rediss+cluster, rediss+sentinel)"
        )
    rest = url[len(scheme) + 3 :]
    authority, _, path = rest.partition("/")
    path = path.partition("?")[0]
    userinfo, at, hosts = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    default_port = SENTINEL_PORT if topology == "sentinel" else REDIS_PORT
    nodes = tuple(_host_port(item, default_port, url) for item in hosts.split(",") if item.strip())
    if not nodes:
        raise RedisURLError(f"{url!r}: no host:port given")
    segments = [unquote(s) for s in path.split("/") if s]
    if topology == "cluster":
        if segments and segments != ["0"]:
            raise RedisURLError(f"{url!r}: a Redis Cluster has only database 0")
        return RedisTarget("cluster", url, base == "rediss", nodes, username=username, password=password)
    if not segments or len(segments) > 2:
        raise RedisURLError(f"{url!r}: give the master's service name: redis+sentinel://host:port/service[/db]")
    db = _number(segments[1], "database", url) if len(segments) == 2 else 0
    return RedisTarget("sentinel", url, base == "rediss", nodes, segments[0], db, username, password)


def _host_port(item: str, default_port: int, url: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, _, tail = item[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise RedisURLError(f"{url!r}: {item!r} has no host")
    return host, _number(port, "port", url) if port else default_port


def _number(text: str, what: str, url: str) -> int:
    if not text.isdigit():
        raise RedisURLError(f"{url!r}: {what} {text!r} is not a number")
    return int(text)
