"""Typed, frozen configuration, built once from flags, environment and mount options.

`SessionConfig` is what any reader of a site needs (a mount, `chromafs grep`);
`MountConfig` adds what a mount needs. The CLIs build them from their argparse
Namespace with `from_args` and pass them down; nothing below the CLI reads the Namespace.
The flags, and the defaults of the fields they set, are declared once, in options.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from chromafs_fuse.backends.chroma_store import ChromaLocation
from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import DEFAULTS


def chroma_location(args: argparse.Namespace) -> ChromaLocation:
    path = args.chroma_path
    url = (args.chroma_url or os.environ.get("CHROMAFS_CHROMA_URL")) if not path else None
    if not path and not url:
        path = os.environ.get("CHROMAFS_CHROMA_PATH")
    if not path and not url:
        raise UsageError("no Chroma given: use --chroma-path DIR or --chroma-url URL")
    headers = {}
    api_key = os.environ.get("CHROMAFS_CHROMA_API_KEY") or os.environ.get("CHROMA_API_KEY")
    if url and api_key:
        headers["x-chroma-token"] = api_key  # Chroma Cloud / token auth; never taken from argv
    return ChromaLocation(
        path=os.path.abspath(path) if path else None,
        url=url,
        collection=args.collection or args.site,
        headers=headers,
        tenant=args.chroma_tenant,
        database=args.chroma_database,
    )


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    prefix: str = DEFAULTS["--redis-prefix"]
    page_ttl_s: int = DEFAULTS["--redis-ttl"]
    tree_ttl_s: int = DEFAULTS["--tree-ttl"]
    ca_file: str | None = None  # the CA of a rediss:// server, else the system's


def redis_settings(
    url: str, prefix: str, ca_file: str | None, tree_ttl_s: int, page_ttl_s: int = DEFAULTS["--redis-ttl"]
) -> RedisSettings:
    """Checked settings of --redis-url and its flags (chromafs-ingest has no --redis-ttl: it writes no pages)."""
    from chromafs_fuse.backends.redis_topology import RedisURLError, parse_redis_url

    try:
        parse_redis_url(url)
    except RedisURLError as exc:
        raise UsageError(f"--redis-url: {exc}") from exc
    if ca_file and not os.path.isfile(ca_file):
        raise UsageError(f"--redis-ca {ca_file}: no such file")
    return RedisSettings(url, prefix, page_ttl_s, tree_ttl_s, os.path.abspath(ca_file) if ca_file else None)


@dataclass(frozen=True, slots=True)
class SessionConfig:
    site: str
    chroma: ChromaLocation
    page_field: str
    chunk_index_field: str
    chunk_joiner: str = DEFAULTS["--chunk-joiner"]
    cache_bytes: int = DEFAULTS["--cache-bytes"]
    backend_timeout_s: float = DEFAULTS["--backend-timeout"]
    s3_endpoint_url: str | None = None
    redis: RedisSettings | None = None
    jwt_secret_file: str | None = None
    jwt_public_key: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SessionConfig:
        if args.backend_timeout <= 0:
            raise UsageError("--backend-timeout must be more than 0 seconds")
        if args.cache_bytes < 0:
            raise UsageError("--cache-bytes must not be negative")
        redis = None
        if args.redis_url:
            redis = redis_settings(args.redis_url, args.redis_prefix, args.redis_ca, args.tree_ttl, args.redis_ttl)
        return cls(
            site=args.site,
            chroma=chroma_location(args),
            page_field=args.page_field,
            chunk_index_field=args.chunk_index_field,
            chunk_joiner=args.chunk_joiner,
            cache_bytes=args.cache_bytes,
            backend_timeout_s=args.backend_timeout,
            s3_endpoint_url=args.s3_endpoint_url,
            redis=redis,
            jwt_secret_file=args.jwt_secret_file,
            jwt_public_key=args.jwt_public_key,
        )


Preload = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class MountConfig:
    session: SessionConfig
    mountpoint: str  # absolute
    fuse_options: tuple[str, ...] = ()  # from -o, as given; the daemon adds its own and drops rw
    cache_timeout_s: float = DEFAULTS["--cache-timeout"]
    preload: Preload = DEFAULTS["--preload"]
    preload_max_bytes: int = DEFAULTS["--preload-max-bytes"]
    readahead_pages: int = DEFAULTS["--readahead-pages"]
    push_pages: bool = DEFAULTS["--push-pages"]
    warm_kernel: bool = DEFAULTS["--warm-kernel"]  # after mounting: list every directory, push every page
    warm_wait_s: float = DEFAULTS["--warm-wait"]  # how long READY waits for that warm-up (0: in the background)
    warm_max_bytes: int = DEFAULTS["--warm-max-bytes"]  # larger sites are not warmed (0: a sixteenth of the memory)
    idle_exit_s: float = DEFAULTS["--idle-exit"]  # unmount once no bind of this mount has stood this long (0: never)
    pid_file: str | None = None
    log_file: str | None = None
    log_level: str = DEFAULTS["--log-level"]
    log_format: Literal["text", "json"] = DEFAULTS["--log-format"]
    metrics_addr: str | None = None
    refresh_interval_s: float = 5.0  # 0: the tree stays as mounted (--refresh-interval's default, 1 with Redis)
    search_dir: str | None = None  # a hidden directory whose files are semantic searches

    @property
    def site(self) -> str:
        return self.session.site

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MountConfig:
        """From chromafs-mount's flags; the mountpoint is made absolute against the current
        directory (the caller's, for a mount server's request)."""
        if args.readahead_pages < 0:
            raise UsageError("--readahead-pages must not be negative")
        if args.warm_wait < 0:
            raise UsageError("--warm-wait must not be negative")
        if args.warm_max_bytes < 0 or args.idle_exit < 0:
            raise UsageError("--warm-max-bytes and --idle-exit must not be negative")
        if args.cache_timeout < 0:
            raise UsageError("--cache-timeout must not be negative")
        if args.search_dir is not None and (args.search_dir in ("", ".", "..") or "/" in args.search_dir):
            raise UsageError(f"--search-dir wants a name without /, not {args.search_dir!r}")
        refresh = args.refresh_interval
        if refresh is None:
            refresh = 1.0 if args.redis_url else 5.0  # a GET of a few bytes, or a query to Chroma
        if refresh < 0:
            raise UsageError("--refresh-interval must not be negative")
        options = tuple(o.strip() for group in args.options for o in group.split(",") if o.strip())
        return cls(
            session=SessionConfig.from_args(args),
            mountpoint=os.path.abspath(args.mountpoint),
            fuse_options=options,
            cache_timeout_s=args.cache_timeout,
            preload=args.preload,
            preload_max_bytes=args.preload_max_bytes,
            readahead_pages=args.readahead_pages,
            push_pages=args.push_pages,
            warm_kernel=args.warm_kernel,
            warm_wait_s=args.warm_wait,
            warm_max_bytes=args.warm_max_bytes,
            idle_exit_s=args.idle_exit,
            pid_file=args.pid_file,
            log_file=args.log_file,
            log_level=args.log_level,
            log_format=args.log_format,
            metrics_addr=args.metrics_addr,
            refresh_interval_s=refresh,
            search_dir=args.search_dir,
        )

    def to_dict(self) -> dict[str, object]:
        """As JSON carries it (the mount server hands a session's configuration to the shared
        mount's process); `from_dict` gives it back equal."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MountConfig:
        fields: dict[str, Any] = dict(data)  # JSON as to_dict wrote it
        session = dict(fields.pop("session"))
        chroma = dict(session.pop("chroma"))
        redis = session.pop("redis")
        session_config = SessionConfig(
            chroma=ChromaLocation(**chroma),
            redis=RedisSettings(**redis) if redis is not None else None,
            **session,
        )
        fields["fuse_options"] = tuple(fields.get("fuse_options") or ())
        return cls(session=session_config, **fields)


PER_SESSION_SETTINGS = ("mountpoint", "pid_file", "log_file", "log_level", "log_format", "metrics_addr")


def mount_settings(config: MountConfig) -> dict[str, object]:
    """Everything that shapes what a mount serves: sessions share a class only when all of it is
    equal (the token's verification key is not: the reader is compared instead)."""
    settings = dataclasses.asdict(config)
    for name in PER_SESSION_SETTINGS:
        settings.pop(name)
    for name in ("jwt_secret_file", "jwt_public_key"):
        settings["session"].pop(name)
    return settings
