"""Argument and logging helpers shared by the command-line entry points."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import sys

from .chroma_store import DEFAULT_CHUNK_INDEX_FIELD, DEFAULT_PAGE_FIELD, ChromaLocation


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def add_chroma_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--site", required=True, help="site name (the collection, unless --collection)")
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


def setup_logging(level: str, log_file: str | None, to_syslog: bool = False) -> None:
    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(log_file)
    elif to_syslog and os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s chromafs[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("chromadb", "httpx", "httpcore", "urllib3", "posthog"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
