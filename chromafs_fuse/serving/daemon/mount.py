"""A mount of its own, whole: `Mount` is the serving runtime with one site and one view at the
mount's root, and what only a mount of its own does.

The runtime is the serving process's (serving/serving_process/sites.py, `ServedSites.open_own`,
on a `ServingFilesystem` with `own_mount`): the site loaded for the verified reader (tree, page
source, attributes), its view pruned and numbered as a mount of its own's (root inode 1), the
site's re-ingests followed and switched to, the warm-up. What `Mount` adds: the --search-dir
directory, pages pushed into the kernel (`KernelPusher`, and the watchdog it needs), the preload,
the pid file, readiness (the ready fd, systemd), the status file per mount, the metrics endpoint,
--idle-exit, and the end at its token's expiry or revocation (every path refused, then the
process exits). `run()` mounts and serves until unmounted; `describe()` is what `chromafs status`
and the metrics read.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pyfuse3
import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.config import MountConfig
from chromafs_fuse.errors import FsError
from chromafs_fuse.filesystem import DocsFilesystem
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.search_dir import SEARCH_INODE, SearchDir
from chromafs_fuse.serving.fuse_adapter import FuseAdapter, entry_attributes, pyfuse3_passes_inode
from chromafs_fuse.serving.handshake import tell_ready
from chromafs_fuse.serving.kernel_push import KernelPusher, forget_attributes, tell_kernel
from chromafs_fuse.serving.lifetime import (
    end_at_expiry,
    end_at_revocation,
    end_when_unused,
    fuse_mounted,
    watch_signals,
)
from chromafs_fuse.serving.process import sd_notify
from chromafs_fuse.serving.serving_process.sites import OWN_VIEW, ServedSites
from chromafs_fuse.serving.status import STATUS_EVERY_S, StatusFile, keep_written, uptime_since, view_status
from chromafs_fuse.serving.warm_up import visible_bytes
from chromafs_fuse.serving_filesystem import ServingFilesystem
from chromafs_fuse.site.loader import LoadedSite
from chromafs_fuse.tree_diff import TreeChange

if TYPE_CHECKING:
    from chromafs_fuse.filesystem import DocsFilesystem
    from chromafs_fuse.serving.metrics import MetricsEndpoint
    from chromafs_fuse.site.searcher import Searcher

log = logging.getLogger("chromafs.mount")
SEARCH_DIR_RESULTS = 20  # pages a file of the search directory lists


def should_preload(config: MountConfig, table: InodeTable) -> bool:
    if config.preload != "auto":
        return config.preload == "on"
    return visible_bytes(table) <= min(config.preload_max_bytes, config.session.cache_bytes // 2)


def public_backend(config: MountConfig) -> str:
    """The Chroma location without credentials, for status and logs."""
    chroma = config.session.chroma
    if chroma.url:
        parts = urlsplit(chroma.url)
        return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", "")) + (
            f":{parts.port}" if parts.port else ""
        )
    return f"embedded:{chroma.path}"


class Mount:
    def __init__(self, config: MountConfig, principal: Principal) -> None:
        """Load the site for `principal` and build the mount's parts; nothing is mounted yet."""
        self.config = config
        self.principal = principal
        # Directories and files the tree gives no mtime show the mount's start.
        self.served = ServingFilesystem(entry_attributes, time.time_ns(), own_mount=True)
        self.sites = ServedSites(self.served, PageCache(config.session.cache_bytes), config.mountpoint)
        self.search_dir = SearchDir(config.search_dir, self._search) if config.search_dir else None
        self._searcher: Searcher | None = None  # the search directory's, kept warm
        self.site = self.sites.open_own(config, principal, self.search_dir, pyfuse3_passes_inode())
        self.view = self.site.views[OWN_VIEW]
        self.pages = self.site.pages
        self.no_open = self.served.no_open
        self.adapter = FuseAdapter(self.served)
        # Pushing pages needs the kernel to keep them across opens (no-open mode only), the
        # batched store of chromafs's pyfuse3 build (scripts/build_pyfuse3.py), and a watchdog
        # (started once mounted: pushed pages, and the warm-up's reads of this mount, can leave a
        # thread waiting in the kernel on a killed daemon).
        self.may_push = config.push_pages and self.no_open and hasattr(pyfuse3, "store_pages")
        self.sites.switched = self._switched
        self.started = time.time()
        self.status = StatusFile(self.describe)
        # while run() runs:
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.pusher: KernelPusher | None = None
        self._nursery: trio.Nursery | None = None
        self.metrics: MetricsEndpoint | None = None

    @property
    def fs(self) -> DocsFilesystem[Any]:
        """The filesystem of the tree served now."""
        return self.view.fs

    async def _search(self, query: str) -> bytes:
        """A file of the search directory: the query's hits in the pages the mount shows now."""
        return await trio.to_thread.run_sync(self._search_now, query)

    def _search_now(self, query: str) -> bytes:
        from chromafs_fuse.search import SearchError, hit_line
        from chromafs_fuse.site.view import ReaderView, ViewError

        now = LoadedSite(self.site.tree, self.fs.table, self.pages)
        principal = self.principal.reader_class()
        view = ReaderView(now, self.config.session, principal, memory_cache=False, warm=self._searcher)
        try:
            self._searcher = view.searcher  # the model, vectors and index stay warm until the tree changes
            hits = view.search(query, SEARCH_DIR_RESULTS)
        except (SearchError, ViewError) as exc:
            log.error("search %r: %s", query, exc)
            raise FsError(errno.EIO) from None
        return "".join(hit_line(hit) + "\n" for hit in hits).encode("utf-8")

    async def _switched(self, new: DocsFilesystem[Any], change: TreeChange) -> None:
        """A re-ingest served (ServedSites switched the view to `new`): the kernel told what to
        forget through the pusher of the tree served until now, and a pusher for the new tree."""
        old_pusher, self.pusher = self.pusher, None
        # never on the loop: the kernel may make a notification wait for a request the loop answers
        await trio.to_thread.run_sync(tell_kernel, old_pusher, change)
        self._start_pushing()

    # -- pushing pages into the kernel's cache ----------------------------------------------

    def _start_pushing(self) -> None:
        """On the loop, for the tree served now: its scheduler hands loaded pages to the kernel."""
        if self.watchdog is None or not self.may_push:
            return
        scheduler = self.fs.scheduler
        token = trio.lowlevel.current_trio_token()
        self.pusher = KernelPusher(
            pyfuse3.store_pages,  # type: ignore[attr-defined]  # only chromafs's pyfuse3 build has it (scripts/build_pyfuse3.py), not the stub; may_push checked
            lambda: token.run_sync_soon(scheduler.take_outcomes, idempotent=True),
            len(self.fs.table.file_order),
        )
        scheduler.push_through(self.pusher)
        self.pusher.start()

    def _pushed_counts(self) -> dict[str, int]:
        """Pages the kernel took ahead of a read, and pages it refused (not listed yet)."""
        pusher = self.pusher
        if pusher is None:
            return {}
        return {"stored": pusher.stored, "refused": pusher.refused, "skipped": pusher.skipped}

    async def _preload(self) -> None:
        """After mounting (without --warm-kernel): load every visible page into memory."""
        started = time.monotonic()
        count = await self.pages.preload(sorted(self.fs.table.entries.values(), key=lambda e: e.key))
        log.info("preloaded %d pages in %.2fs", count, time.monotonic() - started)

    # -- serving ---------------------------------------------------------------------------

    def run(self, ready_fd: int | None) -> None:
        """Mount, serve until unmounted or signalled, unmount. Readiness goes to `ready_fd`
        (when given) once the mount answers; pyfuse3.init raises RuntimeError if mounting fails."""
        config, mountpoint = self.config, self.config.mountpoint
        if config.metrics_addr:
            from chromafs_fuse.serving.metrics import mount_endpoint  # prometheus_client: 0.1 s to import

            self.metrics = mount_endpoint(config.metrics_addr, self.describe)
        options = set(pyfuse3.default_options)
        options |= {f"fsname=chromafs:{config.site}", "subtype=chromafs", "ro", "noatime", *config.fuse_options}
        options.discard("rw")  # read-only, whatever the options say
        # the warm-up reads this mount from this process: it needs the watchdog as pushing does
        watched = self.may_push or config.warm_kernel
        try:
            with fuse_mounted(
                self.adapter, mountpoint, options, "pages are neither pushed nor warmed" if watched else None
            ) as self.watchdog:
                self.sites.warms = self.watchdog is not None
                if config.pid_file:
                    with open(config.pid_file, "w") as f:
                        f.write(f"{os.getpid()}\n")
                try:
                    trio.run(self._serve, ready_fd)
                finally:
                    if self.pusher is not None:
                        self.pusher.stop()  # before the FUSE session is closed
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.status.remove()
            if config.pid_file:
                with contextlib.suppress(OSError):
                    os.unlink(config.pid_file)

    async def _serve(self, ready_fd: int | None) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._start_pushing()
            nursery.start_soon(self.sites.run)  # the site's read-ahead, its re-ingests, the warm-up
            nursery.start_soon(watch_signals)
            if self.metrics is not None:
                from chromafs_fuse.serving.metrics import serve_metrics

                nursery.start_soon(serve_metrics, self.metrics, STATUS_EVERY_S)
            if self.principal.expires_at is not None:
                nursery.start_soon(end_at_expiry, self.principal.expires_at, self._refuse)
            revoked = self._revocation_check()
            if revoked is not None:
                nursery.start_soon(end_at_revocation, revoked, self._refuse)
            nursery.start_soon(self._announce_ready, ready_fd)
            if self.config.idle_exit_s > 0:
                nursery.start_soon(end_when_unused, self.config.mountpoint, self.config.idle_exit_s)
            nursery.start_soon(keep_written, self.status)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
        self._nursery = None

    def _revocation_check(self) -> Callable[[], str | None] | None:
        """With Redis, what says whether the mount's token was revoked (chromafs revoke), blocking."""
        settings, principal = self.config.session.redis, self.principal
        if settings is None or not principal.authenticated:
            return None
        from chromafs_fuse.backends.redis_revocations import find_many
        from chromafs_fuse.site.loader import reader_of

        reader = reader_of(self.config.site, principal)

        def revoked() -> str | None:
            (revocation,) = find_many(settings, [reader])
            return None if revocation is None else revocation.describe()

        return revoked

    async def _refuse(self) -> None:
        """The token expired: every request answers EACCES from now on, and the kernel forgets the
        attributes of every directory, so that a process whose working directory is inside (or
        a bind copy in another mount namespace) is refused its next path walk, before and after
        the daemon exits (ENOTCONN then); a descriptor already open keeps what the kernel holds."""
        self.adapter.refusing = True
        table = self.fs.table
        directories = [table.inode_at(index) for index in range(len(table)) if table.is_dir_at(index)]
        if self.search_dir is not None:
            directories.append(SEARCH_INODE)
        await trio.to_thread.run_sync(forget_attributes, directories)

    async def _announce_ready(self, ready_fd: int | None) -> None:
        """Once the mount answers (and the warm-up had its --warm-wait): READY, to whoever waits."""
        config = self.config
        await trio.to_thread.run_sync(os.listdir, config.mountpoint)
        assert self._nursery is not None
        job, _alone = self.sites.warm(self.site, OWN_VIEW)
        if job is not None:
            if config.warm_wait_s > 0:
                with trio.move_on_after(config.warm_wait_s):
                    await job.done.wait()
        elif should_preload(config, self.fs.table):
            self._nursery.start_soon(self._preload)
        log.info("mounted on %s", config.mountpoint)
        self.status.write()
        tell_ready(ready_fd)
        sd_notify(f"READY=1\nSTATUS=serving {config.site} on {config.mountpoint}")

    def describe(self) -> dict:
        """The mount's status (the status file, `chromafs status`, the metrics endpoint)."""
        config, adapter, pages, site = self.config, self.adapter, self.pages, self.site
        shared = pages.shared
        return {
            **view_status(
                config.site,
                self.principal,
                self.fs.table,
                pages.tree_version,
                dict(adapter.requests),
                site.switches.describe(site.follower),
            ),
            "pid": os.getpid(),
            "mountpoint": config.mountpoint,
            "expires_at": self.principal.expires_at,
            "backend": public_backend(config),
            "redis": bool(shared),
            "started": self.started,
            "uptime_s": uptime_since(self.started),
            "kernel_open": "skipped" if self.no_open else "per open",
            "caches": {
                "memory": [pages.cache.hits, pages.cache.misses],
                "redis": [shared.hits, shared.misses] if shared else [0, 0],
            },
            "pages_pushed": self._pushed_counts(),
            "pages_cached": len(pages.cache),
            "cached_bytes": pages.cache.current_bytes,
            "backend_errors": {**pages.backend_errors, "redis": shared.errors if shared else 0},
            "backend_seconds": dict(pages.backend_seconds),
            "read_latency": adapter.read_latency.cumulative(),
            "latency": {op: [h.cumulative(), h.total_s] for op, h in sorted(adapter.latency.items())},
            "read_latency_sum_s": adapter.read_latency.total_s,
        }
