"""Argument and logging helpers shared by the command-line entry points."""

from __future__ import annotations

import argparse
import os
import sys

from chromafs_fuse.cli.mount_client import CliError, token_of
from chromafs_fuse.names import DEFAULT_CHUNK_INDEX_FIELD, DEFAULT_PAGE_FIELD

TYPE_CHECKING = False  # not `from typing import ...`: typing costs the mount client ~3 ms of start-up

if TYPE_CHECKING:
    from chromafs_fuse.backends.chroma_store import ChromaLocation


def add_chroma_arguments(parser: argparse.ArgumentParser) -> None:
    site = os.environ.get("CHROMAFS_SITE")
    parser.add_argument(
        "--site",
        default=site,
        required=not site,
        help="site name (the collection, unless --collection; env CHROMAFS_SITE)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--chroma-path", metavar="DIR", help="embedded Chroma directory (default backend)")
    where.add_argument("--chroma-url", metavar="URL", help="Chroma server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--collection", help="collection name (default: the site name)")
    parser.add_argument("--chroma-tenant", help="Chroma server/Cloud tenant (default: the server's default)")
    parser.add_argument("--chroma-database", help="Chroma server/Cloud database (default: the server's default)")
    parser.add_argument("--page-field", default=DEFAULT_PAGE_FIELD, help="chunk metadata field naming the page")
    parser.add_argument(
        "--chunk-index-field", default=DEFAULT_CHUNK_INDEX_FIELD, help="chunk metadata field with its position"
    )


def chroma_location(args: argparse.Namespace) -> ChromaLocation:
    from chromafs_fuse.backends.chroma_store import ChromaLocation

    path = args.chroma_path
    url = (args.chroma_url or os.environ.get("CHROMAFS_CHROMA_URL")) if not path else None
    if not path and not url:
        path = os.environ.get("CHROMAFS_CHROMA_PATH")
    if not path and not url:
        raise CliError("no Chroma given: use --chroma-path DIR or --chroma-url URL")
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


def default_log_file() -> str:
    """Where a background daemon logs when there is no syslog socket."""
    for directory in ("/var/log/chromafs", os.path.join(os.environ.get("TMPDIR", "/tmp"), f"chromafs-{os.getuid()}")):
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return os.path.join(directory, "chromafs.log")
    return os.devnull


def _private(path: str) -> str:
    """Create a log file readable by its owner only: it names pages and groups."""
    if path != os.devnull and not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return path


def setup_logging(level: str, log_file: str | None, background: bool = False, json_lines: bool = False) -> None:
    import logging

    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(_private(log_file))
    elif background and os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        handler = SysLogHandler(address="/dev/log")
    elif background:
        handler = logging.FileHandler(_private(default_log_file()))
    else:
        handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s chromafs[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("chromadb", "httpx", "httpcore", "urllib3", "posthog", "botocore", "boto3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    add_chroma_arguments(parser)
    parser.add_argument("--token", help="session JWT (visible in ps: prefer --token-file or CHROMAFS_TOKEN)")
    parser.add_argument("--token-file", metavar="F", help="file holding the session JWT (env CHROMAFS_TOKEN_FILE)")
    parser.add_argument(
        "--jwt-secret-file",
        metavar="F",
        default=os.environ.get("CHROMAFS_JWT_SECRET_FILE"),
        help="HS256 shared secret (env CHROMAFS_JWT_SECRET_FILE)",
    )
    parser.add_argument(
        "--jwt-public-key",
        metavar="F",
        default=os.environ.get("CHROMAFS_JWT_PUBLIC_KEY"),
        help="PEM public key: Ed25519, RSA or EC P-256 (env CHROMAFS_JWT_PUBLIC_KEY)",
    )
    parser.add_argument("--chunk-joiner", default="\n", help="text put between chunks (default: newline)")
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="in-process page cache bound (the kernel page cache and Redis sit on either side of it)",
    )
    parser.add_argument("--backend-timeout", type=float, default=10.0, help="seconds before a backend call fails")
    parser.add_argument("--s3-endpoint-url", help="S3 endpoint for lazy files (default: AWS_ENDPOINT_URL or AWS)")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("CHROMAFS_REDIS_URL"),
        help="shared cache: redis[s]://host:port/db, redis[s]+cluster://host:port,host:port or "
        "redis[s]+sentinel://host:port,host:port/service (env CHROMAFS_REDIS_URL)",
    )
    parser.add_argument(
        "--redis-ca",
        default=os.environ.get("CHROMAFS_REDIS_CA"),
        metavar="FILE",
        help="CA certificate of a rediss:// Redis (env CHROMAFS_REDIS_CA; default: the system's)",
    )
    parser.add_argument("--redis-prefix", default="chromafs", help="key prefix in Redis")
    parser.add_argument("--redis-ttl", type=int, default=24 * 3600, help="seconds a cached page lives in Redis")
    parser.add_argument("--tree-ttl", type=int, default=300, help="seconds a cached path tree lives in Redis")
    parser.add_argument("--token-stdin", action="store_true", help=argparse.SUPPRESS)


def resolve_token(args: argparse.Namespace) -> str | None:
    if args.token_stdin:
        return sys.stdin.read().strip() or None
    return token_of(args.token, args.token_file)


def _json_formatter_class() -> type:
    import json
    import logging

    class _JsonFormatter(logging.Formatter):
        """One JSON object per line: time, level, logger, pid, message."""

        def format(self, record: logging.LogRecord) -> str:
            entry = {
                "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "pid": record.process,
                "message": record.getMessage(),
            }
            if record.exc_info:
                entry["exception"] = self.formatException(record.exc_info)
            return json.dumps(entry, ensure_ascii=False)

    return _JsonFormatter


def JsonFormatter() -> object:
    return _json_formatter_class()()
