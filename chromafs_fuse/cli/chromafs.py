"""`chromafs`: commands that work on a site without mounting it.

    chromafs grep PATTERN [PATH] --site S ... : grep -rn over the pages the token may read.
    chromafs revoke --subject S --site X [--redis-url R]: end the sessions of S's tokens, refuse new ones.

Exit status as grep: 0 a line matched, 1 none did, 2 an error.
"""

from __future__ import annotations

import logging
import re
import sys
import time

STARTED = time.perf_counter()  # this module is imported first: what came before is the interpreter's start

TYPE_CHECKING = False  # `chromafs shell` starts a session: it imports nothing it does not use

if TYPE_CHECKING:
    import argparse
    from typing import Any


COMMANDS = ("grep", "search", "mcp", "revoke", "shell", "status")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `only` (the command given: a search's start-up is
    not spent on the others' flags)."""
    import argparse

    from chromafs_fuse.cli.common import add_options, add_session_arguments
    from chromafs_fuse.options import find

    parser = argparse.ArgumentParser(prog="chromafs", description="Work with a chromafs site without mounting it.")
    commands = parser.add_subparsers(dest="command", required=True)
    if only in (None, "grep"):
        grep = commands.add_parser("grep", help="two-stage grep -rn over the pages your token may read")
        grep.add_argument("pattern", help="a Python/ERE-style regular expression (or a literal with -F)")
        grep.add_argument("path", nargs="?", default="", help="a file or directory of the site (default: all)")
        grep.add_argument("-F", "--fixed-strings", action="store_true", help="PATTERN is a literal string")
        grep.add_argument("-i", "--ignore-case", action="store_true")
        grep.add_argument("-l", "--files-with-matches", action="store_true", help="print only the names of files")
        grep.add_argument("--prefix", default="", help="print paths under this directory (e.g. the mountpoint)")
        add_session_arguments(grep)
        grep.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    if only in (None, "search"):
        search = commands.add_parser("search", help="semantic search over the pages your token may read")
        search.add_argument("query", help="what to look for, in words")
        search.add_argument("-n", type=int, default=10, help="how many pages (default 10)")
        search.add_argument("--embedder", help="how the collection was embedded (default: what its ingest recorded)")
        search.add_argument(
            "--json", action="store_true", help="print JSON lines: path, lines, score, distance, snippet"
        )
        search.add_argument(
            "--rank", choices=["hybrid", "vector", "lexical"], default="hybrid",
            help="hybrid: meaning and words fused (default); vector: meaning alone; lexical: BM25 alone",
        )  # fmt: skip
        search.add_argument("--timings", action="store_true", help="say on stderr where the time went")
        add_session_arguments(search)
        # the host's mount server answers warm when it is there (--mountd, the default socket)
        add_options(search, [find("--mountd"), find("--no-mountd")])
        search.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    if only in (None, "mcp"):
        mcp = commands.add_parser(
            "mcp", help="an MCP server (stdio, or streamable HTTP) over the pages a token may read"
        )
        mcp.add_argument(
            "--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio"
        )
        mcp.add_argument("--embedder", help="how the collection was embedded, for the search tool")
        mcp.add_argument(
            "--refresh-interval", type=float, default=5.0, help="follow re-ingests: seconds between checks"
        )
        add_session_arguments(mcp)
        mcp.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    if only in (None, "revoke"):
        revoke = commands.add_parser(
            "revoke",
            help="end every session of a subject (or of one token) on every host of the site, and refuse new ones",
            description="Revoke the tokens of a subject (those issued until now) or one token (its jti) for a site: "
            "every session they opened ends within about a second, on every host sharing the site's Redis "
            "(--redis-url), or on this host's mount server without one; a new session with them is refused.",
        )
        who = revoke.add_mutually_exclusive_group(required=True)
        who.add_argument("--subject", metavar="S", help="the tokens whose 'sub' is S, issued until now")
        who.add_argument("--jti", metavar="J", help="the one token whose 'jti' (token id) is J")
        revoke.add_argument(
            "--for", dest="for_s", type=float, default=24 * 3600, metavar="SECONDS",
            help="how long the revocation lasts; it must reach past the 'exp' of the tokens it revokes "
            "(default: %(default).0f, a day: longer than the tokens identity providers issue)",
        )  # fmt: skip
        revoke_options = ("--site", "--redis-url", "--redis-ca", "--redis-prefix", "--mountd")
        add_options(revoke, [find(name) for name in revoke_options])
        revoke.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    if only in (None, "shell"):
        commands.add_parser("shell", help="a command (default: bash) in a sandbox that sees only your docs, at /docs")
    if only in (None, "status"):
        status = commands.add_parser("status", help="list this machine's chromafs mounts")
        status.add_argument("--json", action="store_true", help="print JSON instead of a table")
        status.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return parser


def run_status(args: argparse.Namespace) -> int:
    import json

    from chromafs_fuse.serving.status import read_statuses

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
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.grep import GrepQuery
    from chromafs_fuse.site.view import open_view
    from chromafs_fuse.token_source import resolve_token

    view = open_view(SessionConfig.from_args(args), resolve_token(args))
    query = GrepQuery(args.pattern, args.fixed_strings, args.ignore_case)
    try:
        query.compiled()
    except (re.error, UnicodeError) as exc:
        print(f"chromafs grep: bad pattern: {exc}", file=sys.stderr)
        return 2
    errors: list[str] = []
    out = sys.stdout.buffer
    prefix = (args.prefix.rstrip("/") + "/").encode() if args.prefix else b""
    matched = False
    for line in view.grep(query, args.path, args.files_with_matches, errors=errors):
        matched = True
        out.write(b"Binary file " + prefix + line[12:] if line.startswith(b"Binary file ") else prefix + line)
        out.write(b"\n")
    out.flush()
    for error in errors:
        print(f"chromafs grep: {error}", file=sys.stderr)
    return 2 if errors else 0 if matched else 1


def run_search(args: argparse.Namespace) -> int:
    import json

    from chromafs_fuse.token_source import resolve_token

    opened = time.perf_counter()
    token = resolve_token(args)
    answer = search_through_mountd(args, token)  # no numpy, no model here: the server holds them
    if answer is None:  # no mount server: the search runs here, cold
        from chromafs_fuse.config import SessionConfig
        from chromafs_fuse.search import hit_line, hit_record
        from chromafs_fuse.site.view import open_view

        view = open_view(SessionConfig.from_args(args), token)
        stages = {"start-up": opened - STARTED, "open view": time.perf_counter() - opened}
        result = view.search_result(args.query, args.n, args.embedder, args.rank)
        stages.update(result.timings)
        records = [hit_record(hit) for hit in result.hits]
        lines = [hit_line(hit) for hit in result.hits]
        notes, mode, embedder = result.notes, result.mode, result.embedder
    else:
        stages = {"start-up": opened - STARTED, "mount server": time.perf_counter() - opened}
        records, lines, notes = answer["records"], answer["lines"], answer["notes"]
        mode, embedder = answer["mode"], answer["embedder"]
    for note in notes:
        print(f"chromafs search: note: {note}", file=sys.stderr)
    for record, line in zip(records, lines, strict=True):
        print(json.dumps(record, ensure_ascii=False) if args.json else line)
    if args.timings:
        spent = ", ".join(f"{stage} {seconds * 1000:.0f} ms" for stage, seconds in stages.items())
        total = time.perf_counter() - STARTED
        print(f"chromafs search: {mode} ({embedder or 'no vectors'}): {spent}; "
              f"total {total * 1000:.0f} ms", file=sys.stderr)  # fmt: skip
    return 0 if records else 1


def search_through_mountd(args: argparse.Namespace, token: str | None) -> dict[str, Any] | None:
    """The search answered by the mount server given (--mountd, CHROMAFS_MOUNTD_SOCKET) or the
    host's, warm: its answer's fields (serving/protocol.py's Search); None when there is none to
    ask (--no-mountd, or the host's does not answer: no socket, or not this user's to connect
    to). Its refusal is raised as its kind."""
    import os

    from chromafs_fuse.cli.mount import given_options
    from chromafs_fuse.cli.mount_request import (
        FALL_BACK_ERRNOS,
        answer_fields,
        encode_search,
        mount_server_socket,
        request_options,
    )
    from chromafs_fuse.errors import Unavailable
    from chromafs_fuse.options import SESSION_OPTIONS
    from chromafs_fuse.serving.handshake import ask_line

    socket_path, fall_back = mount_server_socket(args.mountd, args.no_mountd)
    if not socket_path:
        return None
    options = request_options(given_options(args, SESSION_OPTIONS), os.environ)
    request = encode_search(options, args.query, args.n, token, args.embedder, args.rank)
    try:
        answer = ask_line(socket_path, request, args.backend_timeout * 3 + 60, connect_s=5)  # a first search loads
    except OSError as exc:
        if exc.errno in FALL_BACK_ERRNOS:  # only from connecting: nobody listens, or not for this user
            if fall_back:
                return None
            raise Unavailable(f"cannot reach chromafs-mountd at {socket_path}: {exc.strerror}") from None
        raise Unavailable(f"chromafs-mountd at {socket_path} did not answer: {exc.strerror or exc}") from None
    return answer_fields(answer)


def run_revoke(args: argparse.Namespace) -> int:
    """The revocation kept in the site's Redis (--redis-url), else by the host's mount server."""
    import math
    import time

    from chromafs_fuse.errors import UsageError
    from chromafs_fuse.revocation import Revocation

    if not (math.isfinite(args.for_s) and args.for_s > 0):
        raise UsageError("--for wants a positive number of seconds")
    kind, name = ("sub", args.subject) if args.subject is not None else ("jti", args.jti)
    if not name:
        raise UsageError(f"--{'subject' if kind == 'sub' else 'jti'} wants a value")
    now = time.time()
    revocation = Revocation(args.site, kind, name, now, now + args.for_s)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(revocation.until))
    if args.redis_url:
        from chromafs_fuse.backends.redis_revocations import record
        from chromafs_fuse.config import redis_settings

        settings = redis_settings(args.redis_url, args.redis_prefix, args.redis_ca, 0)
        record(settings, revocation, now)
        print(f"revoked the tokens of {revocation.describe()} on site '{args.site}' until {until}, in Redis: "
              "every host of the site ends their sessions within a second")  # fmt: skip
        return 0
    answer = revoke_through_mountd(args, revocation)
    print(f"revoked the tokens of {revocation.describe()} on site '{args.site}' until {until}, "
          f"on this host's mount server: {answer.get('ended', 0)} sessions ended")  # fmt: skip
    return 0


def revoke_through_mountd(args: argparse.Namespace, revocation: Any) -> dict[str, Any]:
    """Without Redis: the host's mount server keeps the revocation (serving/protocol.py's Revoke)."""

    from chromafs_fuse.cli.mount_request import answer_fields, mount_server_socket
    from chromafs_fuse.errors import Unavailable, UsageError
    from chromafs_fuse.serving.handshake import ask_line
    from chromafs_fuse.serving.protocol import Revoke, encode

    socket_path, _fall_back = mount_server_socket(args.mountd, False)
    if not socket_path:
        raise UsageError(
            "no --redis-url, and no mount server on this host to keep the revocation: give the site's "
            "--redis-url (every host sees it there), or --mountd SOCKET"
        )
    for_s = revocation.until - revocation.at
    request = encode(Revoke(revocation.site, revocation.kind, revocation.name, for_s))
    try:
        answer = ask_line(socket_path, request, 10)
    except OSError as exc:
        raise Unavailable(f"cannot reach chromafs-mountd at {socket_path}: {exc.strerror or exc}") from None
    return answer_fields(answer)


def run_mcp(args: argparse.Namespace) -> int:
    from chromafs_fuse.cli.common import CliError
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.frontends.mcp_server import Views, build_server
    from chromafs_fuse.token_source import resolve_token

    config = SessionConfig.from_args(args)
    if args.http:
        if args.token or args.token_file or args.token_stdin:
            raise CliError("with --http each request carries its token (Authorization: Bearer ...)")
        host, _, port = args.http.rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"--http wants HOST:PORT, not {args.http}")
        server = build_server(Views(config, None, True, args.refresh_interval), args.embedder)
        server.run("streamable-http", host=host.strip("[]"), port=int(port))
        return 0
    views = Views(config, resolve_token(args), False, args.refresh_interval)
    views.view(None)  # load it now: a bad token or an unreachable site fails at start, not at the first call
    build_server(views, args.embedder).run("stdio")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["shell"]:  # its start-up is a session's: nothing below is imported for it
        from chromafs_fuse.cli.shell import main as shell_main

        return shell_main(argv[1:])
    from chromafs_fuse.logs import setup_logging

    args = build_parser(argv[0] if argv[:1] and argv[0] in COMMANDS else None).parse_args(argv)
    setup_logging(args.log_level, None)
    from chromafs_fuse.errors import ChromafsError, unexpected

    try:
        if args.command == "status":
            return run_status(args)
        if args.command == "search":
            return run_search(args)
        if args.command == "mcp":
            return run_mcp(args)
        if args.command == "revoke":
            return run_revoke(args)
        return run_grep(args)
    except ChromafsError as exc:
        print(f"chromafs {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: one line, its traceback in the debug log
        logging.getLogger("chromafs").debug("the command failed", exc_info=True)
        print(f"chromafs {args.command}: {unexpected(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
