"""`chromafs-mount`: verify the token, load the tree, mount, serve.

Without --foreground the command starts the daemon as a child process and
returns only once the mount answers (exit 0), or prints one line and exits 1
with no mount left behind. The token reaches the child through a pipe, never
its command line or environment.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import TypeVar

from .access import Principal
from .cli_common import CliError, chroma_location, setup_logging
from .session import add_session_arguments, load_site, resolve_principal
from .tokens import TokenError

log = logging.getLogger("chromafs.mount")
T = TypeVar("T")
READY = b"READY\n"


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
        "--prefetch",
        choices=["auto", "on", "off"],
        default="auto",
        help="warm the cache with every visible page after mounting (auto: small sites)",
    )
    parser.add_argument(
        "--prefetch-max-bytes", type=int, default=64 * 1024 * 1024, help="auto prefetch only sites up to this size"
    )
    parser.add_argument("--log-file", help="log here (default: stderr in the foreground, syslog otherwise)")
    parser.add_argument("--pid-file", help="write the daemon's PID here while it serves")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    return parser


def check_mountpoint(path: str) -> None:
    """The mountpoint must be a directory; a stale chromafs mount is cleaned first."""
    try:
        os.stat(path)
        if os.path.ismount(path):
            os.statvfs(path)  # never answered from the kernel's caches: detects a dead daemon
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, check=False)
            try:
                os.stat(path)
            except OSError as again:
                raise CliError(f"{path}: stale mount could not be cleaned: {again.strerror}") from again
        else:
            raise CliError(f"{path}: {exc.strerror}") from exc
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a directory")
    if os.path.ismount(path):
        raise CliError(f"{path}: something is already mounted there")


def _child_argv(argv: list[str]) -> list[str]:
    """The daemon's arguments: the parent's minus the token, plus the hand-off flags."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--token", "--token-file"):
            skip = True
            continue
        if arg.startswith(("--token=", "--token-file=")):
            continue
        out.append(arg)
    return out


def start_daemon(argv: list[str], token: str | None, wait_s: float) -> int:
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "chromafs_fuse.mount_cli", *_child_argv(argv)]
    cmd += ["--foreground", "--token-stdin", "--ready-fd", str(write_fd)]
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(write_fd,),
        start_new_session=True,
    )
    os.close(write_fd)
    assert child.stdin is not None
    child.stdin.write((token or "").encode("ascii"))
    child.stdin.close()
    message = b""
    deadline = time.monotonic() + wait_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            child.kill()
            child.wait()
            print("chromafs-mount: the daemon did not become ready in time", file=sys.stderr)
            return 1
        ready, _, _ = select.select([read_fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        message += chunk
    os.close(read_fd)
    if message == READY:
        return 0
    child.wait()
    text = message.decode("utf-8", "replace").strip() or f"the daemon exited with status {child.returncode}"
    print(f"chromafs-mount: {text}", file=sys.stderr)
    return 1


def prepare(args: argparse.Namespace, principal: Principal) -> tuple[object, object]:
    from .fs import ChromaOperations

    site = load_site(args, principal)
    ops = ChromaOperations(site.table, site.source, args.cache_timeout)
    return ops, site.table


def should_prefetch(args: argparse.Namespace, table: object) -> bool:
    if args.prefetch == "off":
        return False
    if args.prefetch == "on":
        return True
    total = getattr(table, "total_bytes", 0)
    return bool(total <= min(args.prefetch_max_bytes, args.cache_bytes // 2))


def serve(args: argparse.Namespace, ops: object, ready_fd: int | None, prefetch: bool = False) -> None:
    import pyfuse3
    import trio

    options = set(pyfuse3.default_options)
    options |= {f"fsname=chromafs:{args.site}", "subtype=chromafs", "ro", "noatime"}
    for group in args.options:
        options |= {o.strip() for o in group.split(",") if o.strip()}
    mountpoint = os.path.abspath(args.mountpoint)

    async def announce_ready() -> None:
        await trio.to_thread.run_sync(os.listdir, mountpoint)
        log.info("mounted on %s", mountpoint)
        if ready_fd is not None:
            os.write(ready_fd, READY)
            os.close(ready_fd)
        if prefetch:
            source = ops.source  # type: ignore[attr-defined]
            entries = [n.entry for n in ops.table.nodes.values() if n.entry is not None]  # type: ignore[attr-defined]
            started = time.monotonic()
            count = await source.prefetch(sorted(entries, key=lambda e: e.key))
            log.info("prefetched %d pages in %.2fs", count, time.monotonic() - started)

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("signal %s: unmounting", signal.Signals(signum).name)
                pyfuse3.terminate()
                return

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            nursery.start_soon(announce_ready)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(ops, mountpoint, options)  # type: ignore[arg-type]
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
        log.info("unmounted %s; requests served: %s", mountpoint, dict(ops.requests))  # type: ignore[attr-defined]
        if args.pid_file:
            with contextlib.suppress(OSError):
                os.unlink(args.pid_file)


def fail(args: argparse.Namespace, message: str) -> int:
    if args.ready_fd is not None:
        try:
            os.write(args.ready_fd, message.encode("utf-8", "replace"))
            os.close(args.ready_fd)
        except OSError:
            pass
        log.error("%s", message)
    else:
        print(f"chromafs-mount: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    daemon_child = args.ready_fd is not None
    if args.foreground or daemon_child:
        setup_logging(args.log_level, args.log_file, to_syslog=daemon_child)
    try:
        token, principal = resolve_principal(args)
        check_mountpoint(args.mountpoint)
        chroma_location(args)
        if not args.foreground:
            return start_daemon(argv, token, wait_s=args.backend_timeout * 3 + 60)
        del token
        ops, table = prepare(args, principal)
    except (CliError, TokenError) as exc:
        return fail(args, str(exc))
    except Exception as exc:  # a backend or tree error, reported as one line
        from .chroma_store import BackendError, SiteNotFound
        from .tree import TreeError

        if isinstance(exc, BackendError | SiteNotFound | TreeError):
            return fail(args, str(exc))
        log.exception("cannot mount")
        return fail(args, f"cannot mount: {exc.__class__.__name__}: {exc}")
    try:
        serve(args, ops, args.ready_fd, should_prefetch(args, table))
    except RuntimeError as exc:  # pyfuse3.init failures (permissions, no /dev/fuse)
        return fail(args, f"mounting {args.mountpoint} failed: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
