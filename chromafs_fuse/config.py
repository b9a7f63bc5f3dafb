"""Typed, frozen configuration, built once from flags, environment and mount options.

`SessionConfig` is what any reader of a site needs (a mount, `chromafs grep`);
`MountConfig` adds what a mount needs; `ServerConfig` is chromafs-mountd's. The CLIs build them
from their argparse Namespace with `from_args` and pass them down; nothing below the CLI reads the
Namespace. Each flag is declared once, in options.py: a field set by a flag names it
(`from_flag`), and takes from the table its default and the bounds its value is checked against;
`from_args` reads every such field the same way and spells out only what is derived.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from chromafs_fuse.errors import UsageError

if TYPE_CHECKING:
    import argparse
    from types import SimpleNamespace

    # parsed flags: argparse's, or a mount server's request read by options.request_values
    Flags = argparse.Namespace | SimpleNamespace
from chromafs_fuse.options import (
    DEFAULTS,
    KEY_OPTIONS,
    MOUNT_OPTIONS,
    MOUNTD_OPTIONS,
    REFRESH_INTERVAL_S,
    REFRESH_INTERVAL_WITH_REDIS_S,
    Option,
    absolute,
    checked_value,
    find,
)

_NO_DEFAULT = object()


def from_flag(flag: str, options: tuple[Option, ...] = MOUNT_OPTIONS, default: object = _NO_DEFAULT) -> Any:
    """A field set by `flag` of `options`, its default the table's (or `default`)."""
    value = find(flag, options).default if default is _NO_DEFAULT else default
    return dataclasses.field(default=value, metadata={"flag": flag, "options": options})


def flag(flag: str, options: tuple[Option, ...] = MOUNT_OPTIONS) -> dict[str, Any]:
    """The metadata of a field set by `flag` with no default: `dataclasses.field(metadata=flag(...))`."""
    return {"flag": flag, "options": options}


def flag_values(cls: type, args: Flags) -> dict[str, Any]:
    """Every field of the dataclass `cls` set by a flag, read from `args` and checked against the
    flag's bounds (UsageError naming the flag)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if "flag" not in field.metadata:
            continue
        option = find(field.metadata["flag"], field.metadata["options"])
        try:
            values[field.name] = checked_value(option, getattr(args, option.dest))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return values


@dataclass(frozen=True)
class ChromaLocation:
    path: str | None = None  # embedded, a directory
    url: str | None = None  # a Chroma server
    collection: str = ""
    headers: Mapping[str, str] | None = None
    tenant: str | None = None
    database: str | None = None

    def describe(self) -> str:
        return f"{self.server()} collection={self.collection}"

    def server(self) -> str:
        """Where the collections are: the server (or directory), and its tenant and database if given."""
        where = self.url if self.url else f"embedded:{self.path}"
        return where + "".join(f" {k}={v}" for k, v in (("tenant", self.tenant), ("database", self.database)) if v)


def chroma_location(args: Flags) -> ChromaLocation:
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
    from chromafs_fuse.redis_url import RedisURLError, parse_redis_url

    try:
        parse_redis_url(url)
    except RedisURLError as exc:
        raise UsageError(f"--redis-url: {exc}") from exc
    if ca_file and not os.path.isfile(ca_file):
        raise UsageError(f"--redis-ca {ca_file}: no such file")
    return RedisSettings(url, prefix, page_ttl_s, tree_ttl_s, os.path.abspath(ca_file) if ca_file else None)


@dataclass(frozen=True, slots=True)
class TokenKeys:
    """How a session's token is verified: its key (an HS256 secret, a PEM public key, or an identity
    provider's JWKS) and the claims it must carry (tokens.TokenRules)."""

    secret_file: str | None = from_flag("--jwt-secret-file", KEY_OPTIONS)
    public_key: str | None = from_flag("--jwt-public-key", KEY_OPTIONS)
    jwks_url: str | None = from_flag("--jwks-url", KEY_OPTIONS)  # an http(s) URL, or a file (a path or file://)
    issuer: str | None = from_flag("--jwt-issuer", KEY_OPTIONS)
    audience: str | None = from_flag("--jwt-audience", KEY_OPTIONS)
    jwks_cooldown_s: float = from_flag("--jwks-cooldown", KEY_OPTIONS)
    jwks_refresh_s: float = from_flag("--jwks-refresh", KEY_OPTIONS)

    @classmethod
    def from_args(cls, args: Flags) -> TokenKeys:
        """From the flags of options.KEY_OPTIONS; a JWKS file's path made absolute."""
        values = flag_values(cls, args)
        if values["jwks_url"]:
            values["jwks_url"] = absolute(find("--jwks-url", KEY_OPTIONS), values["jwks_url"])
        return cls(**values)

    def options(self) -> dict[str, object]:
        """The flags that give these keys, as a session request carries them (paths made absolute)."""
        out: dict[str, object] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            option = find(field.metadata["flag"], KEY_OPTIONS)
            if value is not None and value != option.default:
                out[option.name] = absolute(option, value) if option.path and isinstance(value, str) else value
        return out


@dataclass(frozen=True, slots=True)
class SessionConfig:
    site: str = dataclasses.field(metadata=flag("--site"))
    chroma: ChromaLocation  # --chroma-path or --chroma-url, and the environment
    page_field: str = dataclasses.field(metadata=flag("--page-field"))
    chunk_index_field: str = dataclasses.field(metadata=flag("--chunk-index-field"))
    chunk_joiner: str = from_flag("--chunk-joiner")
    cache_bytes: int = from_flag("--cache-bytes")
    backend_timeout_s: float = from_flag("--backend-timeout")
    s3_endpoint_url: str | None = from_flag("--s3-endpoint-url")
    redis: RedisSettings | None = None  # --redis-url and its flags
    keys: TokenKeys = TokenKeys()  # how a token is verified

    @classmethod
    def from_args(cls, args: Flags) -> SessionConfig:
        values = flag_values(cls, args)
        redis = None
        if args.redis_url:
            redis = redis_settings(args.redis_url, args.redis_prefix, args.redis_ca, args.tree_ttl, args.redis_ttl)
        return cls(chroma=chroma_location(args), redis=redis, keys=TokenKeys.from_args(args), **values)


Preload = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class MountConfig:
    session: SessionConfig
    mountpoint: str  # absolute
    fuse_options: tuple[str, ...] = ()  # from -o, as given; the daemon adds its own and drops rw
    cache_timeout_s: float = from_flag("--cache-timeout")
    preload: Preload = from_flag("--preload")
    preload_max_bytes: int = from_flag("--preload-max-bytes")
    readahead_pages: int = from_flag("--readahead-pages")
    push_pages: bool = from_flag("--push-pages")
    warm_kernel: bool = from_flag("--warm-kernel")  # after mounting: list every directory, push every page
    warm_wait_s: float = from_flag("--warm-wait")  # how long READY waits for that warm-up (0: in the background)
    warm_max_bytes: int = from_flag("--warm-max-bytes")  # larger sites are not warmed (0: a sixteenth of the memory)
    idle_exit_s: float = from_flag("--idle-exit")  # unmount once no bind of this mount has stood this long (0: never)
    pid_file: str | None = from_flag("--pid-file")
    log_file: str | None = from_flag("--log-file")
    log_level: str = from_flag("--log-level")
    log_format: Literal["text", "json"] = from_flag("--log-format")
    metrics_addr: str | None = from_flag("--metrics-addr")
    # 0: the tree stays as mounted; not given: 1 s with Redis, 5 s without
    refresh_interval_s: float = from_flag("--refresh-interval", default=REFRESH_INTERVAL_S)
    search_dir: str | None = from_flag("--search-dir")  # a hidden directory whose files are semantic searches

    @property
    def site(self) -> str:
        return self.session.site

    @classmethod
    def from_args(cls, args: Flags) -> MountConfig:
        """From chromafs-mount's flags; the mountpoint is made absolute against the current
        directory (the caller's, for a mount server's request)."""
        values = flag_values(cls, args)
        search_dir = values["search_dir"]
        if search_dir is not None and (search_dir in ("", ".", "..") or "/" in search_dir):
            raise UsageError(f"--search-dir wants a name without /, not {search_dir!r}")
        if values["refresh_interval_s"] is None:
            values["refresh_interval_s"] = REFRESH_INTERVAL_WITH_REDIS_S if args.redis_url else REFRESH_INTERVAL_S
        return cls(
            session=SessionConfig.from_args(args),
            mountpoint=os.path.abspath(args.mountpoint),
            fuse_options=tuple(o.strip() for group in args.options for o in group.split(",") if o.strip()),
            **values,
        )

    def to_dict(self) -> dict[str, object]:
        """As JSON carries it (the mount server hands a session's configuration to the shared
        mount's process); `from_dict` gives it back equal. Token keys left at their defaults are
        left out, so that a serving process started by an older server, which knows no `keys`,
        reads what it is sent (the pool sends none: serving processes verify no token)."""
        data = dataclasses.asdict(self)
        if self.session.keys == TokenKeys():
            data["session"].pop("keys")
        return data

    def without_keys(self) -> MountConfig:
        """The same mount, with no token keys: what a serving process is told."""
        return dataclasses.replace(self, session=dataclasses.replace(self.session, keys=TokenKeys()))

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MountConfig:
        fields: dict[str, Any] = dict(data)  # JSON as to_dict wrote it
        session = dict(fields.pop("session"))
        chroma = dict(session.pop("chroma"))
        redis = session.pop("redis")
        session_config = SessionConfig(
            chroma=ChromaLocation(**chroma),
            redis=RedisSettings(**redis) if redis is not None else None,
            keys=_token_keys(session),
            **session,
        )
        fields["fuse_options"] = tuple(fields.get("fuse_options") or ())
        return cls(session=session_config, **fields)


def _token_keys(session: dict[str, Any]) -> TokenKeys:
    """A session's TokenKeys as to_dict wrote them; from a state journal written before they were
    grouped, its two key files (a server recovering that journal serves its classes again)."""
    old = {"secret_file": session.pop("jwt_secret_file", None), "public_key": session.pop("jwt_public_key", None)}
    keys = session.pop("keys", None)
    return TokenKeys(**keys) if keys is not None else TokenKeys(**old)


SESSION_FUSE_OPTIONS = ("allow_other",)
PER_SESSION_SETTINGS = ("mountpoint", "pid_file", "log_file", "log_level", "log_format", "metrics_addr")


def mount_settings(config: MountConfig) -> dict[str, object]:
    """Everything that shapes what a mount serves: sessions share a class only when all of it is
    equal (how the token is verified is not: the reader is compared instead)."""
    settings = dataclasses.asdict(config)
    for name in PER_SESSION_SETTINGS:
        settings.pop(name)
    settings["session"].pop("keys")
    # who besides the session's owner may read it is the session's own (its directories' mode)
    settings["fuse_options"] = tuple(o for o in config.fuse_options if o not in SESSION_FUSE_OPTIONS)
    return settings


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """chromafs-mountd's settings."""

    socket: str = from_flag("--socket", MOUNTD_OPTIONS)
    class_root: str = from_flag("--class-root", MOUNTD_OPTIONS)
    class_idle_s: float = from_flag("--class-idle", MOUNTD_OPTIONS)
    class_warm_wait_s: float = from_flag("--class-warm-wait", MOUNTD_OPTIONS)
    metrics_addr: str | None = from_flag("--metrics-addr", MOUNTD_OPTIONS)
    serving_processes: int = from_flag("--serving-processes", MOUNTD_OPTIONS)  # 0: one per core
    serving_cache_bytes: int = from_flag("--serving-cache-bytes", MOUNTD_OPTIONS)
    isolated_only: bool = from_flag("--isolated-only", MOUNTD_OPTIONS)  # no class views: a daemon per session

    @classmethod
    def from_args(cls, args: Flags) -> ServerConfig:
        values = flag_values(cls, args)
        for name in ("socket", "class_root"):  # the server works from / (cli/mountd.py)
            values[name] = os.path.abspath(values[name])
        return cls(**values)
