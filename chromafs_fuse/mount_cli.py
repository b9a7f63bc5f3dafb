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
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .access import Principal, visible_entries
from .cli_common import CliError, add_chroma_arguments, chroma_location, setup_logging
from .tokens import TokenError, load_verification_key, principal_from_token, read_token_file

log = logging.getLogger("chromafs.mount")
T = TypeVar("T")
READY = b"READY\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chromafs-mount", description="Mount a docs site stored in Chroma as a read-only filesystem."
    )
    parser.add_argument("mountpoint", help="directory to mount on")
    add_chroma_arguments(parser)
    parser.add_argument("--token", help="session JWT (visible in ps: prefer --token-file or CHROMAFS_TOKEN)")
    parser.add_argument("--token-file", metavar="F", help="file holding the session JWT")
    parser.add_argument("--jwt-secret-file", metavar="F", help="HS256 shared secret")
    parser.add_argument("--jwt-public-key", metavar="F", help="PEM public key (Ed25519, RSA or EC P-256)")
    parser.add_argument("--foreground", "-f", action="store_true", help="serve in this process")
    parser.add_argument("-o", dest="options", action="append", default=[], help="FUSE mount options, e.g. allow_other")
    parser.add_argument("--chunk-joiner", default="\n", help="text put between chunks (default: newline)")
    parser.add_argument("--cache-bytes", type=int, default=256 * 1024 * 1024, help="in-process page cache size")
    parser.add_argument("--cache-timeout", type=float, default=3600.0, help="kernel entry/attr cache seconds")
    parser.add_argument("--backend-timeout", type=float, default=10.0, help="seconds before a backend call fails")
    parser.add_argument("--s3-endpoint-url", help="S3 endpoint for lazy files (default: AWS_ENDPOINT_URL or AWS)")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("CHROMAFS_REDIS_URL"),
        help="shared cache, e.g. redis://127.0.0.1:6379/0 (env CHROMAFS_REDIS_URL)",
    )
    parser.add_argument("--redis-prefix", default="chromafs", help="key prefix in Redis")
    parser.add_argument("--redis-ttl", type=int, default=24 * 3600, help="seconds a cached page lives in Redis")
    parser.add_argument("--tree-ttl", type=int, default=300, help="seconds a cached path tree lives in Redis")
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
    parser.add_argument("--token-stdin", action="store_true", help=argparse.SUPPRESS)
    return parser


def resolve_token(args: argparse.Namespace) -> str | None:
    if args.token_stdin:
        return sys.stdin.read().strip() or None
    if args.token and args.token_file:
        raise CliError("give --token or --token-file, not both")
    if args.token:
        return str(args.token)
    if args.token_file:
        return read_token_file(args.token_file)
    return os.environ.get("CHROMAFS_TOKEN") or None


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
    """Load the tree (shared cache first, then Chroma), prune it for the principal,
    and build the filesystem. Chroma is opened only if the tree needs it."""
    from .chroma_store import ChromaPages
    from .fs import ChromaOperations
    from .inodes import InodeTable
    from .page_cache import PageCache
    from .page_source import PageSource
    from .tree import TreeError, parse_tree

    location = chroma_location(args)
    if args.s3_endpoint_url:
        from .blobstore import S3_ENDPOINT

        S3_ENDPOINT["url"] = args.s3_endpoint_url
    shared = None
    if args.redis_url:
        from .redis_cache import RedisCache

        shared = RedisCache(args.redis_url, args.redis_prefix, args.redis_ttl, args.tree_ttl)

    def open_chroma() -> ChromaPages:
        return ChromaPages.open(location, args.page_field, args.chunk_index_field, args.backend_timeout)

    tree = None
    opened: ChromaPages | None = None
    tree_key = shared.tree_key(args.site, location.collection) if shared else ""
    if shared is not None:
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
            shared.set(tree_key, document.encode("utf-8"), ttl_s=args.tree_ttl)
    for key, reason in tree.skipped:
        log.warning("tree entry %s skipped: %s", key, reason)
    visible = visible_entries(tree.entries, principal)
    table = InodeTable(visible)
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
        source._chroma = opened
    ops = ChromaOperations(table, source, args.cache_timeout)
    log.info(
        "site %s (tree %s): %d of %d files visible to %s",
        args.site,
        tree.version,
        len(visible),
        len(tree.entries),
        principal.describe(),
    )
    return ops, table


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
        log.info("unmounted %s", mountpoint)
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
        token = resolve_token(args)
        key = load_verification_key(args.jwt_secret_file, args.jwt_public_key)
        principal = principal_from_token(token, key, args.site)
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
