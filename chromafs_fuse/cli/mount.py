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
from collections.abc import Iterable

from chromafs_fuse.cli.common import add_options
from chromafs_fuse.cli.mount_request import (
    check_mountpoint,
    encode_request,
    mount_server_socket,
    request_mount,
    request_options,
    require_chroma_location,
    server_argv,
    unmount_lazily,
)
from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import CLIENT_ONLY, MOUNT_OPTIONS, Option, default_value
from chromafs_fuse.serving.handshake import wait_for_ready
from chromafs_fuse.token_source import resolve_token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-mount", description="Mount a docs site stored in Chroma as a read-only filesystem."
    )
    parser.add_argument("mountpoint", help="directory to mount on")
    add_options(parser, MOUNT_OPTIONS)
    return parser


def given_options(args: argparse.Namespace, options: Iterable[Option] = MOUNT_OPTIONS) -> dict[str, object]:
    """The options argparse read that differ from their defaults, by their current names, as a
    session request carries them (its environment defaults included: they are the caller's)."""
    given: dict[str, object] = {}
    for option in options:
        if option.hidden or option.name in CLIENT_ONLY:
            continue
        value = getattr(args, option.dest)
        if value != default_value(option):
            given[option.name] = value
    return given


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
    from chromafs_fuse.serving.daemon.daemon import run_daemon
    from chromafs_fuse.serving.failures import mount_failure

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
        from chromafs_fuse.serving.failures import exit_now  # the heavy imports: only in the serving process

        exit_now(serve_here(args))
    try:
        token = resolve_token(args)
        check_mountpoint(args.mountpoint)
        require_chroma_location(args.chroma_path, args.chroma_url)
        wait_s = args.backend_timeout * 3 + 60
        socket_path, fall_back = mount_server_socket(args.mountd, args.no_mountd)
        if socket_path:
            request = encode_request(args.mountpoint, request_options(given_options(args), os.environ), token)
    except UsageError as exc:
        print(f"chromafs-mount: {exc}", file=sys.stderr)
        return 1
    if socket_path:
        status = request_mount(socket_path, request, args.mountpoint, wait_s, fall_back)
        if status is not None:
            return status
    return start_daemon(argv, token, args.mountpoint, wait_s)


if __name__ == "__main__":
    sys.exit(main())
