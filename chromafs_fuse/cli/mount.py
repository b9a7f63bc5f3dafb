"""`chromafs-mount`: verify the token, load the tree, mount, serve.

Without --foreground the command starts the daemon as a child process and
returns only once the mount answers (exit 0), or prints one line and exits 1
with no mount left behind. The token reaches the child through a pipe, never
its command line or environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from chromafs_fuse.cli.common import add_session_arguments
from chromafs_fuse.cli.mount_request import (
    check_mountpoint,
    encode_request,
    request_mount,
    require_chroma_location,
    server_argv,
    unmount_lazily,
)
from chromafs_fuse.errors import UsageError
from chromafs_fuse.serving.handshake import wait_for_ready
from chromafs_fuse.token_source import resolve_token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-mount", description="Mount a docs site stored in Chroma as a read-only filesystem."
    )
    parser.add_argument("mountpoint", help="directory to mount on")
    add_session_arguments(parser)
    parser.add_argument("--foreground", "-f", action="store_true", help="serve in this process")
    parser.add_argument("-o", dest="options", action="append", default=[], help="FUSE mount options, e.g. allow_other")
    parser.add_argument("--cache-timeout", type=float, default=3600.0, help="kernel entry/attr cache seconds")
    parser.add_argument(
        "--preload",
        "--prefetch",
        choices=["auto", "on", "off"],
        default="auto",
        help="load every visible page into memory after mounting (auto: small sites)",
    )
    parser.add_argument(
        "--preload-max-bytes",
        "--prefetch-max-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="auto preload only sites up to this size",
    )
    parser.add_argument(
        "--log-file", help="log here (default: stderr in the foreground; syslog, else a file, in the background)"
    )
    parser.add_argument(
        "--readahead-pages",
        type=int,
        default=32,
        help="on a cache miss, load this many pages of the same directory in one batch (0: off)",
    )
    parser.add_argument(
        "--push-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hand read-ahead pages to the kernel's page cache before they are read (no-open mode only)",
    )
    parser.add_argument(
        "--warm-kernel",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="after mounting, list every directory and hand every preloaded page to the kernel's page cache "
        "(the mount server's class mounts do this)",
    )
    parser.add_argument(
        "--warm-max-bytes",
        type=int,
        default=0,
        metavar="N",
        help="with --warm-kernel: warm sites of up to N visible bytes, streamed through to the kernel's page "
        "cache (default 0: a sixteenth of the machine's memory)",
    )
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=0.0,
        metavar="S",
        help="unmount once no other mount of this one (a session's bind) has stood for S seconds "
        "(the mount server's class mounts do this; default 0: never)",
    )
    parser.add_argument(
        "--search-dir",
        metavar="NAME",
        help="a directory NAME at the root, never listed, where reading NAME/<query> gives a semantic search",
    )
    parser.add_argument(
        "--warm-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="with --warm-kernel: answer ready once warm, or after S seconds (default 0: warm in the background)",
    )
    parser.add_argument(
        "--refresh-interval",
        type=float,
        metavar="S",
        help="check for a re-ingested tree every S seconds, switch to it (default 1 with Redis, 5 without; 0: never)",
    )
    parser.add_argument("--pid-file", help="write the daemon's PID here while it serves")
    parser.add_argument("--log-format", choices=["text", "json"], default="text", help="one line per event")
    parser.add_argument("--metrics-addr", metavar="HOST:PORT", help="serve Prometheus metrics here")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--mountd",
        default=os.environ.get("CHROMAFS_MOUNTD_SOCKET"),
        help="ask this chromafs-mountd socket to serve the mount (env CHROMAFS_MOUNTD_SOCKET)",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="with --mountd: a daemon of this session's own, not a bind of its reader class's shared mount",
    )
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    return parser


def start_daemon(argv: list[str], token: str | None, mountpoint: str, wait_s: float) -> int:
    """Start the serving process and return once it answers (0) or fails (1)."""
    import subprocess

    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "chromafs_fuse.cli.mount", *server_argv(argv)]
    cmd += ["--token-stdin", "--ready-fd", str(write_fd)]
    env = {k: v for k, v in os.environ.items() if k not in ("CHROMAFS_TOKEN", "CHROMAFS_TOKEN_FILE")}
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(write_fd,),
        start_new_session=True,
        env=env,
    )
    os.close(write_fd)
    assert child.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        child.stdin.write((token or "").encode("ascii", "replace"))
        child.stdin.close()
    try:
        ok, reason = wait_for_ready(read_fd, wait_s)
    finally:
        os.close(read_fd)
    if ok:
        return 0
    if child.poll() is None:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(5)
    if os.path.ismount(mountpoint):
        unmount_lazily(mountpoint)
    print(f"chromafs-mount: {reason or f'the daemon exited with status {child.returncode}'}", file=sys.stderr)
    return 1


def serve_here(args: argparse.Namespace) -> int:
    """Serve the mount in this process (--foreground, or the child `start_daemon` starts); its
    exit status. The flags become a MountConfig here, once."""
    from chromafs_fuse.config import MountConfig
    from chromafs_fuse.logs import setup_logging
    from chromafs_fuse.serving.daemon import mount_failure, run_daemon

    background = args.ready_fd is not None
    try:
        config = MountConfig.from_args(args)
    except Exception as exc:  # reported as the daemon reports any failure before it mounts
        setup_logging(args.log_level, args.log_file, background=background, json_lines=args.log_format == "json")
        return mount_failure(args.ready_fd, exc)
    return run_daemon(config, args.ready_fd, background, read_token=lambda: resolve_token(args))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.foreground or args.ready_fd is not None:
        from chromafs_fuse.serving.daemon import exit_now  # the heavy imports: only in the serving process

        exit_now(serve_here(args))
    try:
        token = resolve_token(args)
        check_mountpoint(args.mountpoint)
        require_chroma_location(args.chroma_path, args.chroma_url)
        wait_s = args.backend_timeout * 3 + 60
        if args.mountd:
            request = encode_request(server_argv(argv), token, os.getcwd())
    except UsageError as exc:
        print(f"chromafs-mount: {exc}", file=sys.stderr)
        return 1
    if args.mountd:
        return request_mount(args.mountd, request, args.mountpoint, wait_s)
    return start_daemon(argv, token, args.mountpoint, wait_s)


if __name__ == "__main__":
    sys.exit(main())
