"""`chromafs-ingest`: load a folder of docs into Chroma as a chromafs site.

Exit status: 0 done and clean; 3 done, but some files are not served as their
source says (each named in the problems); 4 nothing ingested (the collection is
left as it was); 1 bad arguments or a backend error; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from chromafs_fuse.backends.blobstore import open_blob_store
from chromafs_fuse.cli.common import CliError, add_options
from chromafs_fuse.config import chroma_location, flag_values, redis_settings
from chromafs_fuse.errors import ChromafsError, unexpected
from chromafs_fuse.ingest.access_rules import parse_acl
from chromafs_fuse.ingest.pipeline import (
    EXIT_NOTHING_INGESTED,
    IngestOptions,
    IngestSummary,
    ingest,
)
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.options import INGEST_OPTIONS
from chromafs_fuse.serving.process import fixed_mmap_threshold
from chromafs_fuse.site.publisher import INGEST_PATIENCE_S, publish_tree
from chromafs_fuse.tree import tree_version

log = logging.getLogger("chromafs.ingest")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chromafs-ingest", description="Load a docs folder into Chroma.")
    parser.add_argument("source", help="folder of docs")
    add_options(parser, INGEST_OPTIONS)
    return parser


# Chroma's own rule for collection names, checked up front for a readable error.
COLLECTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{1,510})[A-Za-z0-9]")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, None)
    fixed_mmap_threshold()
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
            acl_rules=rules,
            blob_store=open_blob_store(blob_url, args.s3_endpoint_url) if blob_url else None,
            **flag_values(IngestOptions, args),
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
