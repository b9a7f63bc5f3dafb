"""`chromafs-ingest`: load a folder of docs into Chroma as a chromafs site.

Exit status: 0 done and clean; 3 done, but some files are not served as their
source says (each named in the problems); 4 nothing ingested (the collection is
left as it was); 1 bad arguments or a backend error; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

from chromafs_fuse.backends.blobstore import open_blob_store
from chromafs_fuse.cli.common import CliError, add_chroma_arguments
from chromafs_fuse.config import chroma_location, redis_settings
from chromafs_fuse.errors import ChromafsError, unexpected
from chromafs_fuse.ingest.access_rules import parse_acl
from chromafs_fuse.ingest.chroma_blobs import DEFAULT_CHROMA_BLOB_LIMIT
from chromafs_fuse.ingest.chroma_writes import DEFAULT_RETRIES
from chromafs_fuse.ingest.embedding import EMBEDDERS
from chromafs_fuse.ingest.pipeline import (
    DEFAULT_LARGE_FILE_THRESHOLD,
    DEFAULT_WRITE_TIMEOUT_S,
    EXIT_NOTHING_INGESTED,
    IngestOptions,
    IngestSummary,
    ingest,
)
from chromafs_fuse.ingest.retention import DEFAULT_GRACE_PERIOD_S
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.site.publisher import INGEST_PATIENCE_S, publish_tree
from chromafs_fuse.tree import tree_version

log = logging.getLogger("chromafs.ingest")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chromafs-ingest", description="Load a docs folder into Chroma.")
    parser.add_argument("source", help="folder of docs")
    add_chroma_arguments(parser)
    parser.add_argument(
        "--default-access",
        choices=["public", "authenticated"],
        default="public",
        help="access of pages that say nothing (default: public)",
    )
    parser.add_argument("--acl", metavar="FILE", help="YAML/JSON glob rules for files without frontmatter")
    parser.add_argument(
        "--embedder",
        choices=list(EMBEDDERS),
        help="how chunks and pages are embedded: wordllama+e5 (a new site's default: chunks by wordllama, "
        "and each page's title and headings by multilingual-e5-small, both shipped in pip packages), "
        "wordllama (chunks only), hashing (no model), chroma-default (Chroma's MiniLM, if already on this "
        "machine). An existing site keeps the one it records",
    )
    parser.add_argument("--max-chunk-chars", type=int, default=2000)
    parser.add_argument(
        "--blob-store",
        metavar="URL",
        help="file:///dir or s3://bucket/prefix for binary and large files (default: DIR/chromafs-blobs with "
        "--chroma-path; on a Chroma server, none: binary files are kept in Chroma itself)",
    )
    parser.add_argument("--s3-endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS)")
    parser.add_argument(
        "--large-file-threshold",
        type=int,
        default=DEFAULT_LARGE_FILE_THRESHOLD,
        help="files above this many bytes go to the blob store",
    )
    parser.add_argument(
        "--chroma-blob-limit",
        type=int,
        default=DEFAULT_CHROMA_BLOB_LIMIT,
        metavar="BYTES",
        help="with no blob store, binary files up to this many bytes are kept in Chroma itself; a larger one "
        "is not ingested and named, to be served from a --blob-store (default: %(default)s, 32 MiB)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        metavar="SECONDS",
        help="keep replaced page versions this long for mounts still on the previous tree; a later "
        "ingest deletes them (default: %(default)s)",
    )
    parser.add_argument(
        "--backend-timeout",
        type=float,
        default=DEFAULT_WRITE_TIMEOUT_S,
        metavar="SECONDS",
        help="one call to a Chroma server that takes longer is tried again (default: %(default)s)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help="tries after the first of a call that timed out or was refused, with backoff; then the "
        "ingest stops naming the batch, and a re-run writes only what is missing (default: %(default)s)",
    )
    parser.add_argument("--include-hidden", action="store_true", help="also ingest dot files and dot folders")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("CHROMAFS_REDIS_URL"),
        help="also publish the new path tree to this shared cache, so new mounts see it at once "
        "(the forms of chromafs-mount --redis-url)",
    )
    parser.add_argument("--redis-ca", default=os.environ.get("CHROMAFS_REDIS_CA"), metavar="FILE")
    parser.add_argument("--redis-prefix", default="chromafs")
    parser.add_argument("--tree-ttl", type=int, default=300)
    parser.add_argument("--report", metavar="FILE", help="write a JSON report (counts and every problem) to FILE")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return parser


# Chroma's own rule for collection names, checked up front for a readable error.
COLLECTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{1,510})[A-Za-z0-9]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, None)
    try:
        source = Path(args.source)
        if not source.is_dir():
            raise CliError(f"{source}: not a directory")
        location = chroma_location(args)
        if not COLLECTION_NAME.fullmatch(location.collection):
            raise CliError(
                f"collection name {location.collection!r} (from --site or --collection): Chroma needs 3-512 "
                "characters from a-z A-Z 0-9 . _ -, starting and ending with a letter or digit"
            )
        if not args.backend_timeout > 0:
            raise CliError(f"--backend-timeout must be more than 0 seconds, not {args.backend_timeout}")
        if args.retries < 0:
            raise CliError(f"--retries must not be negative, not {args.retries}")
        if args.chroma_blob_limit < 0:
            raise CliError(f"--chroma-blob-limit must not be negative, not {args.chroma_blob_limit}")
        if not args.grace_period >= 0:
            raise CliError(f"--grace-period must be 0 or more seconds, not {args.grace_period}")
        rules = []
        if args.acl:
            try:
                rules = parse_acl(Path(args.acl).read_text("utf-8"), args.acl)
            except OSError as exc:
                raise CliError(f"cannot read {args.acl}: {exc.strerror}") from exc
        shared_cache = None
        if args.redis_url:
            shared_cache = redis_settings(args.redis_url, args.redis_prefix, args.redis_ca, args.tree_ttl)
        blob_url = args.blob_store
        if blob_url is None and location.path:
            blob_url = (Path(location.path) / "chromafs-blobs").as_uri()
        options = IngestOptions(
            source_dir=source,
            site=args.site,
            location=location,
            default_access=args.default_access,
            acl_rules=rules,
            embedder=args.embedder,
            max_chunk_chars=args.max_chunk_chars,
            blob_store=open_blob_store(blob_url, args.s3_endpoint_url) if blob_url else None,
            large_file_threshold=args.large_file_threshold,
            chroma_blob_limit=args.chroma_blob_limit,
            include_hidden=args.include_hidden,
            page_field=args.page_field,
            chunk_index_field=args.chunk_index_field,
            grace_period_s=args.grace_period,
            timeout_s=args.backend_timeout,
            retries=args.retries,
        )
        summary = ingest(options, show_progress=not args.quiet and sys.stderr.isatty())
        if args.report:
            _write_report(Path(args.report), summary.report(args.site))
        if shared_cache and summary.tree_document:
            from chromafs_fuse.backends.redis_cache import RedisCache

            shared = RedisCache(
                shared_cache.url,
                shared_cache.prefix,
                tree_ttl_s=args.tree_ttl,
                timeout_s=5.0,
                ca_file=shared_cache.ca_file,
            )
            document, version = summary.tree_document.encode(), tree_version(summary.tree_document)
            if not publish_tree(
                shared, args.site, location.collection, document, version, args.tree_ttl, INGEST_PATIENCE_S
            ):
                log.warning(
                    "the new path tree could not be published to Redis at %s (it did not answer for %.0f s); "
                    "mounts read it from Chroma within --tree-ttl (%d s): check --redis-url",
                    shared.target.describe(),
                    INGEST_PATIENCE_S,
                    args.tree_ttl,
                )
    except ChromafsError as exc:
        print(f"chromafs-ingest: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except Exception as exc:  # backend failures: one line, not a traceback
        log.debug("ingest failed", exc_info=True)
        print(f"chromafs-ingest: {unexpected(exc)}", file=sys.stderr)
        return 1
    _print_problems(summary, args.report)
    if not args.quiet:
        print(f"site {args.site} -> {location.describe()}")
        for line in summary.lines():
            print(line)
    if summary.exit_status == EXIT_NOTHING_INGESTED:
        print(f"chromafs-ingest: nothing ingested from {source}; the site was left as it was", file=sys.stderr)
    return summary.exit_status


MAX_PROBLEM_LINES = 50


def _print_problems(summary: IngestSummary, report: str | None) -> None:
    """Every problem as `path:line: reason (outcome)` on stderr, errors first."""
    ordered = sorted(summary.problems, key=lambda p: (not p.is_error, p.path))
    for problem in ordered[:MAX_PROBLEM_LINES]:
        print(f"{'error' if problem.is_error else 'warning'}: {problem}", file=sys.stderr)
    if len(ordered) > MAX_PROBLEM_LINES:
        where = f"all of them in {report}" if report else "--report FILE lists them all"
        print(f"... and {len(ordered) - MAX_PROBLEM_LINES} more problems ({where})", file=sys.stderr)


def _write_report(path: Path, report: dict[str, object]) -> None:
    try:
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")
    except OSError as exc:
        raise CliError(f"cannot write the report {path}: {exc.strerror}") from exc


if __name__ == "__main__":
    sys.exit(main())
