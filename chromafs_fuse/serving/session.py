"""A reader's session on a site: token -> principal, tree -> pruned inode table,
and where its pages come from. Shared by `chromafs-mount` and `chromafs grep`."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.cli.common import CliError, chroma_location, resolve_token
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving.page_source import PageSource
from chromafs_fuse.tokens import load_verification_key, principal_from_token
from chromafs_fuse.tree import SiteTree

log = logging.getLogger("chromafs.session")
T = TypeVar("T")


def resolve_principal(args: argparse.Namespace) -> tuple[str | None, Principal]:
    """(raw token, principal); raises TokenError or CliError with a printable reason."""
    token = resolve_token(args)
    key = load_verification_key(args.jwt_secret_file, args.jwt_public_key)
    return token, principal_from_token(token, key, args.site)


def with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """Run a blocking call that may hang (a dead server) with a deadline."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise CliError(f"{what}: no answer within {seconds:.0f}s")
    if error:
        raise error[0]
    assert result
    return result[0]


@dataclass(frozen=True)
class Preloaded:
    """What the mount server hands a mount it forks: the reader it verified, the site's tree,
    the table pruned for that reader, and the table's listing attributes with the time they
    were built (see fs.table_attributes)."""

    principal: Principal
    tree: SiteTree
    table: InodeTable
    attributes: tuple[int, Any]


@dataclass
class LoadedSite:
    tree: SiteTree
    table: InodeTable
    source: PageSource


def load_site(args: argparse.Namespace, principal: Principal, preloaded: Preloaded | None = None) -> LoadedSite:
    """Load the tree (shared cache first, then Chroma) and prune it for the
    principal. Chroma is opened only if the tree or a page needs it. A mount
    server hands in the tree and the pruned table it already holds."""
    from chromafs_fuse.backends.chroma_store import ChromaPages
    from chromafs_fuse.page_cache import PageCache
    from chromafs_fuse.tree import TreeError, parse_tree

    location = chroma_location(args)
    if args.s3_endpoint_url:
        from chromafs_fuse.backends.blobstore import S3_ENDPOINT

        S3_ENDPOINT["url"] = args.s3_endpoint_url
    shared = None
    if args.redis_url:
        from chromafs_fuse.backends.redis_cache import RedisCache

        shared = RedisCache(args.redis_url, args.redis_prefix, args.redis_ttl, args.tree_ttl)

    def open_chroma() -> ChromaPages:
        return ChromaPages.open(location, args.page_field, args.chunk_index_field, args.backend_timeout)

    tree = preloaded.tree if preloaded else None
    opened: ChromaPages | None = None
    tree_key = shared.tree_key(args.site, location.collection) if shared else ""
    if shared is not None and tree is None:
        cached = with_deadline(lambda: shared.get(tree_key), args.backend_timeout, "Redis")
        if cached is not None:
            try:
                tree = parse_tree(cached)
                log.info("path tree %s loaded from Redis", tree.version)
            except TreeError as exc:
                log.warning("ignoring the path tree cached in Redis: %s", exc)
    if tree is None:

        def load() -> tuple[ChromaPages, str]:
            pages = open_chroma()
            return pages, pages.load_tree_document()[0]

        opened, document = with_deadline(load, args.backend_timeout + 20, f"Chroma at {location.describe()}")
        tree = parse_tree(document)
        if shared is not None:
            shared.publish_tree(args.site, location.collection, document.encode("utf-8"), tree.version, args.tree_ttl)
    if preloaded is None:
        for key, reason in tree.skipped:
            log.warning("tree entry %s skipped: %s", key, reason)
        table = InodeTable(visible_entries(tree.entries, principal))
    else:
        log.info("path tree %s and its pruned table handed over by the mount server", tree.version)
        table = preloaded.table
    source = PageSource(
        args.site,
        open_chroma,
        PageCache(args.cache_bytes),
        tree.version,
        args.chunk_joiner,
        args.backend_timeout,
        shared,
    )
    if opened is not None:
        source.use_chroma(opened)
    log.info(
        "site %s (tree %s): %d of %d files visible to %s",
        args.site,
        tree.version,
        table.file_count,
        len(tree.entries),
        principal.describe(),
    )
    return LoadedSite(tree, table, source)
