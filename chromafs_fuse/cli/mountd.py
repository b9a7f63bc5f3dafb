"""`chromafs-mountd`'s flags and entry point; the server itself is serving/server/server.py."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from chromafs_fuse.cli.common import add_options
from chromafs_fuse.config import ServerConfig
from chromafs_fuse.errors import UsageError
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.options import MOUNTD_OPTIONS
from chromafs_fuse.serving.process import limit_malloc_arenas
from chromafs_fuse.serving.server.pool import MAX_SERVING_PROCESSES
from chromafs_fuse.serving.server.server import serve_forever

log = logging.getLogger("chromafs.mountd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-mountd",
        description="`chromafs-mountd`: a resident mount server that makes new mounts boot fast.",
    )
    add_options(parser, MOUNTD_OPTIONS)
    return parser


def main(argv: list[str] | None = None) -> int:
    limit_malloc_arenas()  # inherited by every forked mount
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.serving_processes <= MAX_SERVING_PROCESSES:
        parser.error(f"--serving-processes wants a number from 1 to {MAX_SERVING_PROCESSES} (0: one per core)")
    try:
        config = ServerConfig.from_args(args)
    except UsageError as exc:
        parser.error(str(exc))
    setup_logging(args.log_level, args.log_file and os.path.abspath(args.log_file))
    # the server and everything it forks hold no directory of whoever started it: every request
    # names absolute paths (serving/protocol.py)
    os.chdir("/")
    if args.class_mode == "process":
        log.warning("--class-mode process is gone: every class is served by the pool of serving processes")
    # Imported once here, not in every child: the whole serving stack, and the codec a socket's
    # host name goes through (Redis, Chroma).
    import encodings.idna  # noqa: F401

    from chromafs_fuse.serving.daemon import daemon  # noqa: F401

    if not args.no_preload_chroma:
        import chromadb  # noqa: F401  - no threads start at import, so forking stays safe
    class_views = os.geteuid() == 0 and not config.isolated_only  # binds need CAP_SYS_ADMIN
    try:
        return serve_forever(config, class_views)
    except OSError as exc:  # the socket or the class root cannot be made: a path, a permission
        where = exc.filename or args.socket
        print(f"chromafs-mountd: cannot listen on {args.socket}: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
