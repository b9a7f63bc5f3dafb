"""Argument helpers shared by the command-line entry points.

What turns the flags into settings lives below the commands (`chroma_location` in config.py,
`resolve_token` in token_source.py), and logging in logs.py: the daemon and the mount server
use them too."""

from __future__ import annotations

import argparse
import os

from chromafs_fuse.errors import UsageError
from chromafs_fuse.names import DEFAULT_CHUNK_INDEX_FIELD, DEFAULT_PAGE_FIELD

CliError = UsageError  # the name the commands have always used


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
