"""`chromafs-mountd`'s flags and entry point; the server itself is serving/mountd.py.

Each request's argv is parsed here too, by chromafs-mount's own parser, handed to the server.
"""

from __future__ import annotations

import argparse
import os
import sys

from chromafs_fuse.cli.mount import build_parser as mount_parser
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.serving.class_mounts import DEFAULT_CLASS_ROOT, DEFAULT_IDLE_S, DEFAULT_WARM_WAIT_S
from chromafs_fuse.serving.mountd import DEFAULT_SOCKET, serve_forever
from chromafs_fuse.serving.process import limit_malloc_arenas


def parse_request_argv(argv: list[str]) -> argparse.Namespace:
    """A request's argv as chromafs-mount parses it (SystemExit when it is wrong)."""
    return mount_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-mountd",
        description="`chromafs-mountd`: a resident mount server that makes new mounts boot fast.",
    )
    parser.add_argument("--socket", default=os.environ.get("CHROMAFS_MOUNTD_SOCKET", DEFAULT_SOCKET))
    parser.add_argument("--log-file", help="log here (default: stderr)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-preload-chroma", action="store_true", help="do not import chromadb up front")
    parser.add_argument(
        "--class-root",
        default=os.environ.get("CHROMAFS_CLASS_ROOT", DEFAULT_CLASS_ROOT),
        help="root-only directory of the shared class mounts (default: %(default)s); sessions are binds of them",
    )
    parser.add_argument(
        "--class-idle",
        type=float,
        default=DEFAULT_IDLE_S,
        metavar="S",
        help="unmount a class mount S seconds after its last session ended (default: %(default)s)",
    )
    parser.add_argument(
        "--class-warm-wait",
        type=float,
        default=DEFAULT_WARM_WAIT_S,
        metavar="S",
        help="a new class mount lists every directory and hands its pages to the kernel's page cache; its first "
        "session waits for that up to S seconds (default: %(default)s; 0: it is warmed in the background)",
    )
    parser.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus metrics of the server's classes and sessions here (each class mount's traffic too)",
    )
    parser.add_argument(
        "--isolated-only", action="store_true", help="no class mounts: every session gets a daemon of its own"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    limit_malloc_arenas()  # inherited by every forked mount
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_file)
    # Imported once here, not in every child: the whole serving stack (the argument parser of each
    # request is imported above), and the codec a socket's host name goes through (Redis, Chroma).
    import encodings.idna  # noqa: F401

    from chromafs_fuse.serving import daemon  # noqa: F401

    if not args.no_preload_chroma:
        import chromadb  # noqa: F401  - no threads start at import, so forking stays safe
    shared = os.geteuid() == 0 and not args.isolated_only  # binds need CAP_SYS_ADMIN
    serve_forever(
        args.socket,
        parse_request_argv,
        args.class_root if shared else None,
        args.class_idle,
        args.class_warm_wait,
        args.metrics_addr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
