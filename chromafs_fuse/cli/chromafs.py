"""`chromafs`: commands that work on a site without mounting it.

    chromafs grep PATTERN [PATH] --site S ... : grep -rn over the pages the token may read.

Exit status as grep: 0 a line matched, 1 none did, 2 an error.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # `chromafs shell` starts a session: it imports nothing it does not use

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator
    from typing import Any


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from chromafs_fuse.cli.common import add_session_arguments

    parser = argparse.ArgumentParser(prog="chromafs", description="Work with a chromafs site without mounting it.")
    commands = parser.add_subparsers(dest="command", required=True)
    grep = commands.add_parser("grep", help="two-stage grep -rn over the pages your token may read")
    grep.add_argument("pattern", help="a Python/ERE-style regular expression (or a literal with -F)")
    grep.add_argument("path", nargs="?", default="", help="a file or directory of the site (default: all)")
    grep.add_argument("-F", "--fixed-strings", action="store_true", help="PATTERN is a literal string")
    grep.add_argument("-i", "--ignore-case", action="store_true")
    grep.add_argument("-l", "--files-with-matches", action="store_true", help="print only the names of files")
    grep.add_argument("--prefix", default="", help="print paths under this directory (e.g. the mountpoint)")
    add_session_arguments(grep)
    grep.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    search = commands.add_parser("search", help="semantic search over the pages your token may read")
    search.add_argument("query", help="what to look for, in words")
    search.add_argument("-n", type=int, default=10, help="how many pages (default 10)")
    search.add_argument("--embedder", help="how the collection was embedded (default: what its ingest recorded)")
    search.add_argument("--json", action="store_true", help="print JSON lines: path, lines, distance, snippet")
    add_session_arguments(search)
    search.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    commands.add_parser("shell", help="a command (default: bash) in a sandbox that sees only your docs, at /docs")
    status = commands.add_parser("status", help="list this machine's chromafs mounts")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return parser


def run_status(args: argparse.Namespace) -> int:
    import json

    from chromafs_fuse.serving.service import read_statuses

    statuses = read_statuses()
    if args.json:
        print(json.dumps(statuses, indent=2, sort_keys=True))
        return 0
    import time

    header = ("MOUNTPOINT", "SITE", "READER", "BACKEND", "PID", "UPTIME", "FILES", "CACHED", "HIT%", "EXPIRES")
    rows = [header]
    for s in statuses:
        memory = (s.get("caches") or {}).get("memory", [0, 0])
        lookups = memory[0] + memory[1]
        rows.append(
            (
                s["mountpoint"],
                str(s.get("site", "")),
                str(s.get("reader", "?")),
                ("session of " + s["session"]["class"][:12])
                if s.get("session")
                else str(s.get("backend", "?")) + (" +redis" if s.get("redis") else ""),
                str(s.get("pid") or "?"),
                f"{s['uptime_s']:.0f}s" if "uptime_s" in s else "?",
                str(s.get("visible_files", "?")),
                str(s.get("pages_cached", "?")),
                f"{100 * memory[0] / lookups:.0f}" if lookups else "-",
                f"in {s['expires_at'] - time.time():.0f}s" if s.get("expires_at") else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def run_grep(args: argparse.Namespace) -> int:
    import logging

    from chromafs_fuse.cli.common import resolve_token
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.search import GrepQuery, candidate_pages, is_binary, matching_lines
    from chromafs_fuse.serving.site_loader import SiteLoader, verify_reader

    config = SessionConfig.from_args(args)
    site = SiteLoader(config).load(verify_reader(resolve_token(args), config))
    scope = args.path.strip("/")
    node = site.table.resolve(scope)
    if node is None:
        print(f"chromafs grep: {args.path}: No such file or directory", file=sys.stderr)
        return 2
    prefix = scope + "/" if scope and node.is_dir else scope
    entries = sorted(
        (
            e
            for e in site.table.entries.values()
            if (e.key == scope if not node.is_dir else e.key.startswith(prefix) or not scope)
        ),
        key=lambda e: e.key,
    )
    query = GrepQuery(args.pattern, args.fixed_strings, args.ignore_case)
    try:
        pattern = query.compiled()
    except Exception as exc:
        print(f"chromafs grep: bad pattern: {exc}", file=sys.stderr)
        return 2
    chunked = [e for e in entries if e.blob is None]
    candidates: set[str] | None = None
    if args.chunk_joiner == "\n" and chunked:
        candidates = candidate_pages(site.source.chroma(), chunked, query)
    to_check = [e for e in chunked if candidates is None or e.key in candidates]
    to_check += [e for e in entries if e.blob is not None]
    logging.getLogger("chromafs.grep").info("stage one: %d of %d pages are candidates", len(to_check), len(entries))
    loaded = site.source.load_many([e for e in to_check if e.blob is None]) if to_check else {}
    status = 1
    out = sys.stdout.buffer
    base = args.prefix.rstrip("/") + "/" if args.prefix else ""
    for entry in sorted(to_check, key=lambda e: e.key):
        if entry.blob is not None:
            from chromafs_fuse.backends.blobstore import read_blob_range

            try:
                data = read_blob_range(entry.blob.url, 0, entry.blob.size)
            except Exception as exc:
                print(f"chromafs grep: {entry.key}: {exc}", file=sys.stderr)
                status = 2
                continue
        else:
            result = loaded.get(entry.key)
            if not isinstance(result, bytes):
                print(f"chromafs grep: {entry.key}: Input/output error", file=sys.stderr)
                status = 2
                continue
            data = result
        name = (base + entry.key).encode("utf-8")
        if is_binary(data):
            if pattern.search(data):
                out.write(b"Binary file " + name + b" matches\n")
                status = 0 if status != 2 else status
            continue
        for number, line in matching_lines(data, pattern):
            if status == 1:
                status = 0
            if args.files_with_matches:
                out.write(name + b"\n")
                break
            out.write(name + b":" + str(number).encode() + b":" + line + b"\n")
    out.flush()
    return status


def run_search(args: argparse.Namespace) -> int:
    import json

    from chromafs_fuse.backends.chroma_store import connect_client
    from chromafs_fuse.cli.common import CliError, resolve_token
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.ingest.embedding import make_embedder
    from chromafs_fuse.semantic import BATCH, Hit, SearchError, embedder_name, locate, rank_pages, view_filter
    from chromafs_fuse.serving.site_loader import SiteLoader, verify_reader

    if args.n < 1:
        raise CliError("-n must be at least 1")
    config = SessionConfig.from_args(args)
    site = SiteLoader(config).load(verify_reader(resolve_token(args), config))
    entries = list(site.table.entries.values())
    if not any(e.blob is None for e in entries):
        return 1  # nothing the reader may see is searchable
    where, by_slug = view_filter(entries, config.page_field)
    collection = connect_client(config.chroma).get_collection(config.chroma.collection, embedding_function=None)
    name = embedder_name(collection.metadata, args.embedder)
    try:
        embed = make_embedder(name)[0]
        vector = [float(x) for x in embed([args.query])[0]]
    except Exception as exc:  # an unknown name, or a function whose model or key is absent
        raise SearchError(f"cannot embed the query with {name!r}: {exc}") from exc

    def view() -> Iterator[tuple[list[str], list[list[float]], list[Any]]]:
        offset = 0
        while True:
            found = collection.get(where=where, include=["embeddings", "metadatas"], limit=BATCH, offset=offset)
            ids = list(found.get("ids") or [])
            if not ids:
                return
            yield ids, found["embeddings"], list(found.get("metadatas") or [None] * len(ids))
            offset += len(ids)

    ranked = rank_pages(view(), vector, by_slug, config.page_field, args.n)
    if not ranked:
        return 1
    chunks = collection.get(ids=[record_id for _, _, record_id in ranked], include=["documents"])
    text = dict(zip(chunks["ids"], chunks.get("documents") or [], strict=False))
    loaded = site.source.load_many([site.table.entries[path] for path, _, _ in ranked])
    out = []
    for path, distance, record_id in ranked:
        hit, page = Hit(path, distance, text.get(record_id) or ""), loaded.get(path)
        out.append(locate(hit, page) if isinstance(page, bytes) else hit)
    for hit in out:
        snippet = hit.chunk.strip().splitlines()[0][:160] if hit.chunk.strip() else ""
        if args.json:
            print(json.dumps({"path": hit.path, "lines": [hit.first_line, hit.last_line],
                              "distance": round(hit.distance, 6), "snippet": snippet}, ensure_ascii=False))  # fmt: skip
        else:
            print(f"{hit.path}:{hit.first_line}-{hit.last_line}: {snippet}")
    return 0 if out else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["shell"]:  # its start-up is a session's: nothing below is imported for it
        from chromafs_fuse.cli.shell import main as shell_main

        return shell_main(argv[1:])
    from chromafs_fuse.cli.common import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, None)
    from chromafs_fuse.chunks import CorruptPage
    from chromafs_fuse.cli.common import CliError
    from chromafs_fuse.filesystem import PageUnavailable
    from chromafs_fuse.semantic import SearchError
    from chromafs_fuse.tokens import TokenError

    try:
        if args.command == "status":
            return run_status(args)
        if args.command == "search":
            return run_search(args)
        return run_grep(args)
    except (CliError, TokenError, CorruptPage, PageUnavailable, SearchError) as exc:
        print(f"chromafs {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"chromafs {args.command}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
