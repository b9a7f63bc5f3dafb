"""The serving side of a mount: verify the token, load and prune the tree,
mount, answer the kernel until unmounted or signalled.

Runs in the foreground process, in the child `chromafs-mount` starts, or in a
child forked by `chromafs-mountd` (which has imported all of this already).
Readiness and one-line failures go to `ready_fd` when one is given.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import pyfuse3
import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.backends.chroma_store import BackendError, SiteNotFound
from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import UsageError
from chromafs_fuse.filesystem import DocsFilesystem, FsError
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.logs import setup_logging
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.serving.binds import binds_of
from chromafs_fuse.serving.fuse_adapter import FuseAdapter, pyfuse3_passes_inode
from chromafs_fuse.serving.handshake import READY
from chromafs_fuse.serving.mount_metrics import start_metrics_server
from chromafs_fuse.serving.process import limit_malloc_arenas, sd_notify
from chromafs_fuse.serving.refresh import TreeRefresher
from chromafs_fuse.serving.search_dir import SearchDir
from chromafs_fuse.serving.status import StatusFile, uptime_since, utc_text
from chromafs_fuse.serving.warm_up import (
    all_files,
    changed_files,
    should_warm_kernel,
    visible_bytes,
    warm_kernel,
)
from chromafs_fuse.serving.watchdog import start_watchdog, stop_watchdog
from chromafs_fuse.site.loader import LoadedSite, Preloaded, SiteLoader, verify_reader
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.tokens import TokenError
from chromafs_fuse.tree import PathEntry, TreeError

log = logging.getLogger("chromafs.mount")
STATUS_EVERY_S = 2.0
IDLE_CHECK_S = 5.0  # how often a mount with --idle-exit looks for binds of it
SEARCH_DIR_RESULTS = 20  # pages a file of the search directory lists


def should_preload(config: MountConfig, table: InodeTable) -> bool:
    if config.preload != "auto":
        return config.preload == "on"
    return visible_bytes(table) <= min(config.preload_max_bytes, config.session.cache_bytes // 2)


def prepare(
    config: MountConfig, principal: Principal, preloaded: Preloaded | None = None
) -> tuple[FuseAdapter, TreeRefresher | None]:
    loader = SiteLoader(config.session)
    site = loader.load(principal, preloaded)
    no_open = pyfuse3_passes_inode()

    def make_fs(table: InodeTable, replaced: dict[int, PathEntry] | None = None) -> DocsFilesystem:
        scheduler = ReadScheduler(table, site.source, config.readahead_pages)
        return DocsFilesystem(table, site.source, scheduler, no_open, replaced)

    ops = FuseAdapter(
        make_fs(site.table),
        config.cache_timeout_s,
        attributes=preloaded.attributes if preloaded else None,
        push_pages=config.push_pages,
    )
    if config.search_dir:
        ops.search_dir = search_directory(config, principal, site, ops)
    refresher = None
    if config.refresh_interval_s > 0:
        refresher = TreeRefresher(loader, principal, ops, site.source, make_fs, config.refresh_interval_s)
    return ops, refresher


def search_directory(config: MountConfig, principal: Principal, site: LoadedSite, ops: FuseAdapter) -> SearchDir:
    """The --search-dir directory: its files search the pages the mount shows now."""
    from chromafs_fuse.search import SearchError, hit_line
    from chromafs_fuse.site.view import ReaderView, ViewError

    def search(query: str) -> bytes:
        now = LoadedSite(site.tree, ops.table, site.source)  # the table follows re-ingests
        view = ReaderView(now, config.session, principal.reader_class(), memory_cache=False)
        try:
            hits = view.search(query, SEARCH_DIR_RESULTS)
        except (SearchError, ViewError) as exc:
            log.error("search %r: %s", query, exc)
            raise FsError(errno.EIO) from None
        return "".join(hit_line(hit) + "\n" for hit in hits).encode("utf-8")

    return SearchDir(config.search_dir or "", search, config.cache_timeout_s, time.time_ns())


def _public_backend(config: MountConfig) -> str:
    """The Chroma location without credentials, for status and logs."""
    chroma = config.session.chroma
    if chroma.url:
        parts = urlsplit(chroma.url)
        return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", "")) + (
            f":{parts.port}" if parts.port else ""
        )
    return f"embedded:{chroma.path}"


def describe_mount(
    config: MountConfig, ops: FuseAdapter, principal: Principal, started: float, refresher: TreeRefresher | None
) -> dict:
    source = ops.fs.pages
    assert isinstance(source, PageSource)
    shared = source.shared
    return {
        "pid": os.getpid(),
        "site": config.site,
        "mountpoint": config.mountpoint,
        "reader": principal.describe(),
        "expires_at": principal.expires_at,
        "backend": _public_backend(config),
        "redis": bool(shared),
        "started": started,
        "uptime_s": uptime_since(started),
        "visible_files": ops.table.file_count,
        "kernel_open": "skipped" if ops.no_open else "per open",
        "tree_version": source.tree_version,
        "requests": dict(ops.requests),
        "caches": {
            "memory": [source.cache.hits, source.cache.misses],
            "redis": [shared.hits, shared.misses] if shared else [0, 0],
        },
        "pages_pushed": ops.pushed_counts(),
        "pages_cached": len(source.cache),
        "cached_bytes": source.cache.current_bytes,
        "backend_errors": {**source.backend_errors, "redis": shared.errors if shared else 0},
        "backend_seconds": dict(source.backend_seconds),
        "read_latency": ops.read_latency.cumulative(),
        "latency": {op: [h.cumulative(), h.total_s] for op, h in sorted(ops.latency.items())},
        "read_latency_sum_s": ops.read_latency.total_s,
        **(refresher.describe() if refresher else {"refresh_interval_s": 0}),
    }


async def preload_pages(source: PageSource, table: InodeTable) -> None:
    """After mounting (without --warm-kernel): load every visible page into memory."""
    started = time.monotonic()
    count = await source.preload(sorted(table.entries.values(), key=lambda e: e.key))
    log.info("preloaded %d pages in %.2fs", count, time.monotonic() - started)


def _unmount_now() -> None:
    sd_notify("STOPPING=1")
    pyfuse3.terminate()


async def end_when_unused(mountpoint: str, idle_s: float) -> None:
    """A class mount: unmount once no session's bind of it has stood for `idle_s`, whether or
    not a mount server is there to stop it."""
    idle_since = time.monotonic()
    while True:
        await trio.sleep(min(idle_s / 4, IDLE_CHECK_S))
        binds = await trio.to_thread.run_sync(binds_of, mountpoint)
        if binds:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_s:
            log.warning("no session for %.0fs: unmounting", time.monotonic() - idle_since)
            _unmount_now()
            return


async def end_at_expiry(expires_at: float) -> None:
    await trio.sleep(max(0.0, expires_at - time.time()))
    log.warning("the token expired (exp %s): unmounting", utc_text(expires_at))
    _unmount_now()


async def watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal %s: unmounting", signal.Signals(signum).name)
            _unmount_now()
            return


async def keep_written(status: StatusFile) -> None:
    while True:
        await trio.sleep(STATUS_EVERY_S)
        status.write()


def serve(
    config: MountConfig,
    ops: FuseAdapter,
    refresher: TreeRefresher | None,
    principal: Principal,
    ready_fd: int | None,
    preload: bool,
) -> None:
    started = time.time()
    status = StatusFile(lambda: describe_mount(config, ops, principal, started, refresher))
    if config.metrics_addr:
        start_metrics_server(config.metrics_addr, lambda: describe_mount(config, ops, principal, started, refresher))
    options = set(pyfuse3.default_options)
    options |= {f"fsname=chromafs:{config.site}", "subtype=chromafs", "ro", "noatime", *config.fuse_options}
    options.discard("rw")  # read-only, whatever the options say
    mountpoint = config.mountpoint
    source = ops.fs.pages
    assert isinstance(source, PageSource)

    async def warm(files: list[int], done: trio.Event) -> None:
        try:
            await warm_kernel(mountpoint, ops, source, files, config.session.cache_bytes // 4)
        except Exception:
            log.exception("warm-up stopped")
        finally:
            done.set()

    async def announce_ready(nursery: trio.Nursery) -> None:
        await trio.to_thread.run_sync(os.listdir, mountpoint)
        if should_warm_kernel(config, ops):
            warmed = trio.Event()
            nursery.start_soon(warm, all_files(ops.table), warmed)
            if config.warm_wait_s > 0:
                with trio.move_on_after(config.warm_wait_s):
                    await warmed.wait()
        elif preload:
            nursery.start_soon(preload_pages, source, ops.table)
        log.info("mounted on %s", mountpoint)
        status.write()
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, READY)
                os.close(ready_fd)
        sd_notify(f"READY=1\nSTATUS=serving {config.site} on {mountpoint}")

    async def run() -> None:
        async with source.running(), trio.open_nursery() as nursery:
            token = trio.lowlevel.current_trio_token()
            ops.start_pushing(token)
            if refresher is not None:
                if should_warm_kernel(config, ops):  # pages a re-ingest changed go to the kernel too
                    refresher.after_switch = lambda old, new: nursery.start_soon(
                        warm, changed_files(old, new), trio.Event()
                    )
                nursery.start_soon(refresher.run, token)
            nursery.start_soon(watch_signals)
            if principal.expires_at is not None:
                nursery.start_soon(end_at_expiry, principal.expires_at)
            nursery.start_soon(announce_ready, nursery)
            if config.idle_exit_s > 0:
                nursery.start_soon(end_when_unused, mountpoint, config.idle_exit_s)
            nursery.start_soon(keep_written, status)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    pyfuse3.init(ops, mountpoint, options)
    # Everything built so far (imported modules, the tree, the inode table) lives as long as the
    # mount: take it out of the collector's sight, so that collections triggered by per-request
    # garbage do not walk the whole heap on the request path.
    gc.collect()
    gc.freeze()
    # Only pushed pages can leave a thread waiting in the kernel on a killed daemon: no pushing
    # without a watchdog.
    watchdog = start_watchdog(mountpoint) if ops.push_pages else None
    ops.push_pages = watchdog is not None
    if config.pid_file:
        with open(config.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    try:
        trio.run(run)
    finally:
        stop_watchdog(watchdog)
        ops.stop_pushing()
        pyfuse3.close(unmount=True)
        status.remove()
        log.info("unmounted %s; requests served: %s", mountpoint, dict(ops.requests))
        if config.pid_file:
            with contextlib.suppress(OSError):
                os.unlink(config.pid_file)


def report_failure(ready_fd: int | None, message: str) -> int:
    log.error("%s", message)
    if ready_fd is None:
        print(f"chromafs-mount: {message}", file=sys.stderr)
    else:
        with contextlib.suppress(OSError):
            os.write(ready_fd, message.encode("utf-8", "replace"))
            os.close(ready_fd)
    return 1


def exit_now(status: int) -> None:
    """Leave without interpreter finalisation: a backend call abandoned at its deadline may
    still run in a worker thread inside native code (chromadb, boto3), and tearing the
    interpreter down under it can crash the process after a clean unmount."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


# failures before the mount serves, reported as one line without a traceback
EXPECTED_FAILURES = (UsageError, TokenError, BackendError, SiteNotFound, TreeError)


def failure_text(exc: Exception) -> str:
    """The one line saying why a mount could not start."""
    if isinstance(exc, EXPECTED_FAILURES):
        return str(exc)
    return f"cannot mount: {exc.__class__.__name__}: {exc}"


def mount_failure(ready_fd: int | None, exc: Exception) -> int:
    """Report why a mount could not start (logged, and sent to `ready_fd` or printed); 1."""
    if not isinstance(exc, EXPECTED_FAILURES):
        log.error("cannot mount", exc_info=exc)
    return report_failure(ready_fd, failure_text(exc))


def run_daemon(
    config: MountConfig,
    ready_fd: int | None,
    background: bool,
    preloaded: Preloaded | None = None,
    principal: Principal | None = None,
    read_token: Callable[[], str | None] | None = None,
) -> int:
    """Serve the mount `config` describes; returns the exit status. A mount server that already
    verified the token hands in the reader with what it preloaded; else `read_token` gives the
    token to verify (called only then)."""
    limit_malloc_arenas()
    setup_logging(config.log_level, config.log_file, background=background, json_lines=config.log_format == "json")
    try:
        if principal is None:  # else a mount server verified the token (a class mount has none)
            if preloaded is not None:
                principal = preloaded.principal
            else:
                principal = verify_reader(read_token() if read_token else None, config.session)
        ops, refresher = prepare(config, principal, preloaded)
    except Exception as exc:
        return mount_failure(ready_fd, exc)
    try:
        serve(config, ops, refresher, principal, ready_fd, should_preload(config, ops.table))
    except RuntimeError as exc:  # pyfuse3.init failures (permissions, no /dev/fuse)
        return report_failure(ready_fd, f"mounting {config.mountpoint} failed: {exc}")
    except Exception as exc:  # never die silently: the log says why
        log.exception("the daemon failed")
        return report_failure(ready_fd, f"the daemon failed: {exc.__class__.__name__}: {exc}")
    return 0
