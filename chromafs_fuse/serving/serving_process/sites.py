"""The sites and views the serving mount serves (issue 30), on its trio loop.

A *site* here is a site with one set of mount settings (config.mount_settings):
its tree, one page source (every site's pages in the process's one memory budget, one Redis
client per URL) and one `TreeFollower`. A *view* is a reader class of a site: its tree pruned
in the view's inode scope (serving_views.scope_for), on a `DocsFilesystem` of its own, served in
the `ServingFilesystem` at `<site directory>/<view name>`. A view of a site already served is a
prune and a table (in a worker thread); the first view of a site loads its tree first (Redis,
else Chroma, within --backend-timeout). On a re-ingest every view of the site switches to the
new tree (old versions that readers hold stay readable) and the kernel is told what to forget.

A mount of its own (serving/daemon/mount.py: `chromafs-mount --no-mountd`, `--isolated`) is served
by the same runtime with one site and one view, at the mount's root (`open_own`, on a
`ServingFilesystem` with `own_mount`): its site loaded, followed, switched and warmed as here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from chromafs_fuse.access import Principal
from chromafs_fuse.attributes import AttributeMaker
from chromafs_fuse.config import MountConfig, RedisSettings, mount_settings
from chromafs_fuse.errors import Refused
from chromafs_fuse.filesystem import DocsFilesystem
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.search_dir import SearchDir
from chromafs_fuse.serving.kernel_push import forget_attributes, tell_kernel, walk_directories
from chromafs_fuse.serving.status import view_status
from chromafs_fuse.serving.tree_switch import TreeSwitches, follow_site, next_filesystem
from chromafs_fuse.serving.warm_up import ViewWarmer, WarmJob, should_warm_kernel, visible_bytes
from chromafs_fuse.serving_filesystem import ServingFilesystem
from chromafs_fuse.serving_views import scope_for, site_dir_name, view_name
from chromafs_fuse.sessions import ServedSession
from chromafs_fuse.site.follower import TreeFollower
from chromafs_fuse.site.loader import CHROMA_OPEN_GRACE_S, SiteLoader
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.site.tables import WHOLE_TABLE_FILES, prune, whole_table
from chromafs_fuse.site.watch import SiteWatch
from chromafs_fuse.tree import SiteTree
from chromafs_fuse.tree_diff import TreeChange

log = logging.getLogger("chromafs.serving")
# a spare session's class: (site key, view name, uid, gid, allow_other)
SpareKey = tuple[str, str, int, int, bool]
EXPIRY_POLL_S = 0.2  # how late the kernel may forget an expired session (its requests are refused at exp)
SPARE_QUIET_S = 0.25  # a spare is listed once session requests pause this long
SPARES = 2  # per class and owner: a class's first two sessions in a row both find one
# in all, per serving process: each holds its tree's dentries and a listing page per directory in
# the kernel, which with a thousand classes would push their pages out of the cache
MAX_SPARES = 64
OWN_VIEW = "root"  # a mount of its own's one view (its root)


class ServeError(Refused):
    """A view cannot be served; the message goes back to the mount server."""


def site_key(config: MountConfig) -> str:
    """The site's name in the serving mount: its name and a digest of its mount settings (two
    mount servers' views of a site with other settings are other sites)."""
    settings = json.dumps(mount_settings(config), sort_keys=True, default=str)
    return f"{config.site}.{hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def reader_key(reader: Principal) -> str:
    return json.dumps([reader.authenticated, sorted(reader.groups) if reader.authenticated else []])


@dataclass
class ServedView:
    name: str
    reader: Principal  # the reader class (no subject, no expiry)
    fs: DocsFilesystem[Any]
    added: float = field(default_factory=time.time)
    # its pages are read into the kernel (warm.py), so its sessions' directories are listed ahead
    # too (spares); not for a site over --warm-max-bytes: its first grep reads from the process
    lists_ahead: bool = False


class ServedSite:
    def __init__(self, key: str, config: MountConfig, loader: SiteLoader, tree: SiteTree, pages: PageSource) -> None:
        self.key = key
        self.directory = site_dir_name(key)
        self.config = config
        self.tree = tree
        self.pages = pages
        self.loader = loader
        self.attributes: AttributeMaker[Any] | None = None  # set by ServedSites (its conversion)
        self.no_open = False  # set by ServedSites: the serving process's mount's open mode
        self.follower = TreeFollower(loader, pages.chroma, tree, config.refresh_interval_s)
        self.views: dict[str, ServedView] = {}
        self.warmed: set[int] = set()  # inodes read through a view already (serving/warm_up.py)
        self.cancel = trio.CancelScope()  # ends the site's tasks once its last view goes
        self.switches = TreeSwitches()
        self.search_dir: SearchDir | None = None  # a mount of its own's --search-dir
        self._whole: tuple[SiteTree, InodeTable] | None = None  # a big tree's whole table
        self._making_whole: tuple[SiteTree, trio.Event] | None = None

    def whole(self, tree: SiteTree) -> InodeTable | None:
        """`tree`'s whole table (site/tables.whole_table), if made."""
        return self._whole[1] if self._whole is not None and self._whole[0] is tree else None

    async def make_whole(self, tree: SiteTree) -> InodeTable | None:
        """`tree`'s whole table, made (in a worker thread) if the tree is big enough to need one."""
        if len(tree.entries) < WHOLE_TABLE_FILES:
            return None
        whole = self.whole(tree)
        if whole is not None:
            return whole
        if self._making_whole is not None and self._making_whole[0] is tree:  # one build a tree
            await self._making_whole[1].wait()
            return self.whole(tree)
        making = self._making_whole = (tree, trio.Event())
        try:
            started = time.perf_counter()
            whole = await trio.to_thread.run_sync(whole_table, tree, self.key)
            if self.tree is tree:
                self._whole = (tree, whole)
            log.info("site %s: the whole tree's table, %d files, in %.3fs", self.key, whole.file_count,
                     time.perf_counter() - started)  # fmt: skip
        finally:
            making[1].set()
            if self._making_whole is making:
                self._making_whole = None
        return whole

    def filesystem(self, table: InodeTable, replaced: dict | None = None) -> DocsFilesystem[Any]:
        assert self.attributes is not None
        scheduler = ReadScheduler(table, self.pages, self.config.readahead_pages)
        return DocsFilesystem(table, self.pages, scheduler, self.no_open, self.attributes, replaced, self.search_dir)


class ServedSites:
    """Every site and view of the serving mount; `run` holds the sites' tasks until cancelled."""

    def __init__(self, fs: ServingFilesystem[Any], cache: PageCache, mountpoint: str) -> None:
        self.fs = fs
        self.mountpoint = mountpoint
        self.cache = cache  # one memory budget for every site's pages
        self.sites: dict[str, ServedSite] = {}
        self._redis: dict[RedisSettings, Any] = {}  # one RedisCache per URL and settings
        self._opening: dict[str, trio.Lock] = {}  # per site: one load; other sites never wait for it
        self._nursery: trio.Nursery | None = None
        self.watch = SiteWatch()  # every site's re-ingests: one subscription, one poll per Redis
        self.warmer = ViewWarmer()
        self._listing = trio.Lock()  # one session's directories listed at a time (each on a few threads)
        self._spares: dict[SpareKey, list[ServedSession]] = {}  # per class and owner: listed, not handed out
        self._making: dict[SpareKey, trio.Event] = {}  # spares being listed
        self._spare_slots: set[int] = set()  # every spare's slot, listed or being listed
        self._last_request = 0.0  # when a session was last asked for (time.monotonic)
        # False: views are not read through the mount (a mount of its own without its watchdog)
        self.warms = True
        # A mount of its own: what tells the kernel what to forget after its view switched to a
        # new filesystem (its pusher's); None: told here
        self.switched: Callable[[DocsFilesystem[Any], TreeChange], Awaitable[None]] | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            own = self.fs.own_mount
            # a mount of its own's watch only with --refresh-interval (idle, it wakes every second)
            if not own or any(site.follower.interval_s > 0 for site in self.sites.values()):
                nursery.start_soon(self.watch.run)
            nursery.start_soon(self.warmer.run)
            for site in self.sites.values():  # opened before the loop: a mount of its own's
                nursery.start_soon(self._follow, site)
            if not own:
                nursery.start_soon(self._expire_sessions)
            await trio.sleep_forever()

    def open_own(
        self, config: MountConfig, principal: Principal, search_dir: SearchDir | None, kernel_no_open: bool
    ) -> ServedSite:
        """A mount of its own, before it is mounted (blocking): its site loaded (Redis, else Chroma,
        within --backend-timeout), its one view pruned for `principal` at the mount's root, its
        inodes numbered as a mount of its own's. `kernel_no_open`: pyfuse3 can run in no-open mode."""
        assert self.fs.own_mount and not self.sites
        key = site_key(config)
        site = self._load(key, config)
        tree = site.tree
        table = prune(tree, principal)
        log.info(
            "site %s (tree %s): %d of %d files visible to %s",
            config.site,
            tree.version,
            table.file_count,
            len(tree.entries),
            principal.describe(),
        )
        # The kernel's open mode is set for the mount's life. A mount opens its own files when
        # its first tree leaves a size unknown (direct_io, then keep_cache once read); a later
        # tree without sizes is served in the mode the mount has (DocsFilesystem.stat).
        site.no_open = self.fs.no_open = kernel_no_open and table.unknown_sizes == 0
        site.search_dir = search_dir
        fs = site.filesystem(table)
        self.fs.add(key, OWN_VIEW, fs)
        site.views[OWN_VIEW] = ServedView(OWN_VIEW, principal.reader_class(), fs)
        self.sites[key] = site
        return site

    # -- sessions ----------------------------------------------------------------------------

    async def open_session(self, path: str, uid: int, gid: int, expires_at: float | None, allow_other: bool) -> str:
        """A session of the view at `path` (`<site directory>/<view name>`); its own path.

        A session's directories are its own inodes, so a first `grep -r` would list each of them
        (two round trips a directory) where its pages are in the kernel already. So the process
        keeps a *spare* per class and owner: a session with no expiry yet whose directories are
        listed into the kernel, made when the class is added (while its first session waits for
        its pages) and again once session requests pause after one is taken. A new session takes
        it and gets its expiry; with none ready, a class's first session has its directories
        listed before it is answered, a later one lists them on first use."""
        site, name = self._view_at(path)
        if site is None:
            raise ServeError(f"no view {path} here")
        view = site.views[name]
        key: SpareKey = (site.key, name, uid, gid, allow_other)
        sessions = self.fs.sessions
        first = not any(s.slot not in self._spare_slots for s in sessions.of_view(site.key, name))
        self._last_request = time.monotonic()
        making = self._making.get(key)
        wait_s = max(site.config.warm_wait_s, 0.0)
        if making is not None and first and self._in_time(view, wait_s, "listing"):
            with trio.move_on_after(wait_s):
                await making.wait()
        spares = self._spares.get(key) or []
        spare = spares.pop(0) if spares else None
        if spare is not None and spare.alive(time.time()):
            self._spare_slots.discard(spare.slot)
            sessions.set_expiry(spare, expires_at)
            session = spare
        else:
            session = self.fs.open_session(site.key, name, uid, gid, expires_at, allow_other)
            if first and view.lists_ahead and self._in_time(view, wait_s, "listing"):
                with trio.move_on_after(wait_s):  # a big site: bounded
                    await self._list(session, view)
        log.info("session %s of %s: uid %d, expires %s", session.path, path, uid, expires_at)
        if view.lists_ahead and self._nursery is not None:
            self._nursery.start_soon(self._make_spares, key, site, view, SPARE_QUIET_S)
        return session.path

    async def _make_spares(self, key: SpareKey, site: ServedSite, view: ServedView, quiet_s: float = 0.0) -> None:
        """Up to SPARES spare sessions of `key`, listed, each once session requests have paused for
        `quiet_s` (in a burst, answering comes first)."""
        if key in self._making:
            return
        done = self._making[key] = trio.Event()
        try:
            _site, name, uid, gid, allow_other = key
            while len(self._spares.get(key) or []) < SPARES:
                while (wait := self._last_request + quiet_s - time.monotonic()) > 0:
                    await trio.sleep(wait)
                if site.views.get(name) is not view or len(self._spare_slots) >= MAX_SPARES:
                    return
                spare = self.fs.open_session(site.key, name, uid, gid, None, allow_other)
                self._spare_slots.add(spare.slot)
                await self._list(spare, view, threads=2)  # in the background: leave the loop room
                if site.views.get(name) is not view:
                    self._spare_slots.discard(spare.slot)
                    self.fs.sessions.end(spare.slot)
                    return
                self._spares.setdefault(key, []).append(spare)
                done.set()  # a first session waits for one spare, not for all
        finally:
            del self._making[key]
            done.set()

    def _in_time(self, view: ServedView, wait_s: float, what: str) -> bool:
        """Whether the view's warm-up or listing (`what`) can end within `wait_s`, at the pace
        this process has seen: a view too big for the wait is not waited for at all."""
        table, pace = view.fs.table, self.warmer.pace
        if what == "listing":
            expected = pace.list_s(table.file_count)
        else:
            expected = pace.warm_s(table.file_count, visible_bytes(table))
        if expected <= wait_s:
            return True
        if wait_s > 0:
            log.info("view %s: its first session does not wait for its %s (%.2fs expected, --class-warm-wait %.2fs)",
                     view.name, what, expected, wait_s)  # fmt: skip
        return False

    async def _list(self, session: ServedSession, view: ServedView, threads: int = 4) -> None:
        """List the session's directories into the kernel (through this process's own mount)."""
        async with self._listing:
            if session.alive(time.time()):
                root = f"{self.mountpoint}/{session.path}"
                table = view.fs.table
                started = time.monotonic()
                await trio.to_thread.run_sync(
                    walk_directories, root, table, lambda _index: None, threads, abandon_on_cancel=True
                )
                self.warmer.pace.saw_listing(table.file_count, time.monotonic() - started)

    def renew_session(self, path: str, expires_at: float) -> bool:
        """The session at `path` (`.sessions/<slot>`) expires at `expires_at` from now on (a later
        token of its reader); False when it has ended (its expiry passed: it stays ended)."""
        sessions = self.fs.sessions
        slot = sessions.slot_of(path.rpartition("/")[2].encode())
        session = sessions.get(slot) if slot is not None else None
        if session is None or not session.alive(time.time()) or slot in self._spare_slots:
            return False
        sessions.set_expiry(session, expires_at)
        log.info("session %s renewed: expires %s", session.path, expires_at)
        return True

    async def end_session(self, path: str) -> bool:
        """End the session at `path` (`.sessions/<slot>`) and make the kernel forget it."""
        slot = self.fs.sessions.slot_of(path.rpartition("/")[2].encode())
        session = self.fs.sessions.end(slot) if slot is not None else None
        if session is None:
            return False
        await self._forget([session])
        return True

    async def _expire_sessions(self) -> None:
        """End sessions at their expiry, on this process's own clock: a session's requests are
        refused from `exp` on whatever the mount server does, and the kernel forgets what it
        cached of the session's directories, so that a process inside (its working directory, a
        bind copy in another mount namespace) is refused too."""
        sessions = self.fs.sessions
        while True:
            ended = sessions.expire(time.time())
            if ended:
                for session in ended:
                    log.info("session %s expired", session.path)
                await self._forget(ended)
            due = sessions.next_expiry()
            delay = EXPIRY_POLL_S if due is None else min(max(due - time.time(), 0.0), EXPIRY_POLL_S)
            await trio.sleep(delay)

    async def _forget(self, sessions: list[ServedSession]) -> None:
        inodes = [inode for session in sessions for inode in self.fs.session_inodes(session)]
        await trio.to_thread.run_sync(forget_attributes, inodes)

    def _view_at(self, path: str) -> tuple[ServedSite | None, str]:
        directory, _, name = path.partition("/")
        site = next((s for s in self.sites.values() if s.directory == directory), None)
        return (site, name) if site is not None and name in site.views else (None, name)

    # -- views joining and leaving -----------------------------------------------------------

    async def add(self, config: MountConfig, reader: Principal) -> str:
        """Serve the reader class's view of the site (if not served yet); its path in the mount."""
        if config.search_dir:
            raise ServeError("--search-dir is not served by the serving mount")
        site = await self._site(config)
        name = view_name(site.key, reader_key(reader))
        while name not in site.views:
            tree = site.tree
            whole = site.whole(tree)
            started = time.perf_counter()
            table = await trio.to_thread.run_sync(prune, tree, reader, scope_for(site.key, name), whole)
            took = time.perf_counter() - started
            if self.sites.get(site.key) is not site:
                site = await self._site(config)  # its last view went meanwhile: opened again
                continue
            if site.tree is not tree:
                continue  # a re-ingest came first: prune its tree
            fs = site.filesystem(table)
            self.fs.add(site.key, name, fs)
            site.views[name] = ServedView(name, reader, fs)
            log.info(
                "view %s/%s: %s, %d files (table %s in %.3fs)",
                site.directory,
                name,
                reader.describe(),
                table.file_count,
                "built" if whole is None else "filtered from the whole tree's",
                took,
            )
            if whole is None and len(tree.entries) >= WHOLE_TABLE_FILES and self._nursery is not None:
                self._nursery.start_soon(site.make_whole, tree)  # the site's next classes: half the work
            job, alone = self.warm(site, name)
            site.views[name].lists_ahead = job is not None
            if job is not None and self._nursery is not None:  # the likely owner: the server's user
                spare: SpareKey = (site.key, name, os.getuid(), os.getgid(), "allow_other" in config.fuse_options)
                self._nursery.start_soon(self._make_spares, spare, site, site.views[name])
            if job is not None and alone and self._in_time(site.views[name], config.warm_wait_s, "warm-up"):
                # the class's first session waits for its pages to be in the kernel (bounded):
                # its first grep then finds them there. Only when no other view warms: in a burst
                # of new classes, answering comes first and the warm-ups follow.
                with trio.move_on_after(config.warm_wait_s):
                    await job.done.wait()
        return f"{site.directory}/{name}"

    def warm(self, site: ServedSite, name: str) -> tuple[WarmJob | None, bool]:
        """With --warm-kernel (a mount server's classes), the view's pages read in the background;
        the job (None: the view is not warmed), and whether it is the only view warming."""
        view = site.views[name]
        fs = view.fs
        if not self.warms or not should_warm_kernel(site.config, fs.table):
            return None, False

        def current() -> bool:
            return site.views.get(name) is view and view.fs is fs

        path = self.mountpoint if self.fs.own_mount else f"{self.mountpoint}/{site.directory}/{name}"
        job = WarmJob(path, site.warmed, current)
        return job, self.warmer.offer(job)

    def serves(self, directory: str) -> bool:
        """Whether a site of this directory name has a view here."""
        return any(site.directory == directory for site in self.sites.values())

    def remove(self, path: str) -> bool:
        site, name = self._view_at(path)
        if site is None:
            return False
        del site.views[name]
        for key in [key for key in self._spares if key[:2] == (site.key, name)]:
            self._spare_slots.difference_update(spare.slot for spare in self._spares.pop(key))
        for session in list(self.fs.sessions.of_view(site.key, name)):
            self.fs.sessions.end(session.slot)  # a class stops once no session is left: none should be
        self.fs.remove(site.key, name)
        log.info("view %s removed", path)
        if not site.views:
            site.cancel.cancel()
            del self.sites[site.key]
            log.info("site %s: no view left", site.key)
        return True

    # -- sites -------------------------------------------------------------------------------

    async def _site(self, config: MountConfig) -> ServedSite:
        key = site_key(config)
        site = self.sites.get(key)
        if site is not None:
            return site
        lock = self._opening.setdefault(key, trio.Lock())
        try:
            async with lock:
                site = self.sites.get(key)
                if site is None:
                    site = await self._open(key, config)
                    self.sites[key] = site
                    assert self._nursery is not None
                    self._nursery.start_soon(self._follow, site)
        finally:
            if not lock.statistics().tasks_waiting and self._opening.get(key) is lock:
                del self._opening[key]
        return site

    async def _open(self, key: str, config: MountConfig) -> ServedSite:
        timeout_s = config.session.backend_timeout_s + CHROMA_OPEN_GRACE_S
        try:
            with trio.fail_after(timeout_s):
                return await trio.to_thread.run_sync(self._load, key, config, abandon_on_cancel=True)
        except trio.TooSlowError:
            raise ServeError(f"site {config.site}: no tree within {timeout_s:.0f}s") from None

    def _load(self, key: str, config: MountConfig) -> ServedSite:
        """In a worker thread: the site's tree (Redis, else Chroma) and its page source."""
        from chromafs_fuse.backends.redis_cache import RedisCache

        session = config.session
        redis = None
        if session.redis is not None:
            redis = self._redis.get(session.redis)
            if redis is None:
                redis = self._redis[session.redis] = RedisCache.from_settings(session.redis)
        loader = SiteLoader(session, redis)
        tree, pages = loader.open_site(self.cache)
        site = ServedSite(key, config, loader, tree, pages)
        site.attributes = AttributeMaker(config.cache_timeout_s, time.time_ns(), self.fs.convert)
        site.no_open = self.fs.no_open
        log.info("site %s: tree %s, %d files", key, tree.version, len(tree.entries))
        return site

    async def _follow(self, site: ServedSite) -> None:
        """The site's tasks: its read-ahead batches and, with --refresh-interval, its re-ingests.
        Nothing here may end the mount: a failure is logged and the site serves its tree."""
        try:
            await self._follow_until_cancelled(site)
        except Exception:  # see above: logged with its traceback, the site serves its tree
            log.exception("site %s: following its re-ingests stopped", site.key)

    async def _follow_until_cancelled(self, site: ServedSite) -> None:
        with site.cancel:
            async with site.pages.running():
                if site.follower.interval_s <= 0:
                    await trio.sleep_forever()
                await follow_site(
                    self.watch,
                    site.key,
                    site.follower,
                    site.loader.redis,
                    site.pages.timeout_s,
                    lambda: site.tree.version,
                    lambda tree: self._switch(site, tree),
                    site.switches,
                )

    async def _switch(self, site: ServedSite, tree: SiteTree) -> None:
        """Every view of the site to `tree`: pruned, on a new filesystem carrying the old versions
        readers hold, and the kernel told what to forget (off the loop: it may wait on the loop)."""
        if tree.version == site.tree.version:
            return
        started = time.perf_counter()
        previous, site.tree = site.tree.version, tree
        whole = await site.make_whole(tree) if len(site.views) > 1 else None  # one view: built as fast
        total, invalidated = TreeChange(), [0, 0]
        for name, view in list(site.views.items()):
            new, change = await next_filesystem(view.fs, tree, view.reader, site.filesystem, whole)
            if site.views.get(name) is not view:
                continue  # removed meanwhile
            view.fs = new
            self.fs.add(site.key, name, new, extra_inodes=new.replaced)
            if len(site.views) == 1:  # the page source's tree in the same step (a site of many views: after all)
                site.pages.switch(tree.version)
            if self.switched is not None:
                await self.switched(new, change)
            else:  # never on the loop: the kernel may make a notification wait for a request the loop answers
                await trio.to_thread.run_sync(tell_kernel, None, change)
                await trio.to_thread.run_sync(tell_kernel, None, self.fs.session_change(site.key, name, change))
            # the kernel forgot the changed pages (new inodes): the warm-up reads them again
            site.warmed.difference_update(change.stale_inodes)
            total.changed += change.changed
            total.added += change.added
            total.removed += change.removed
            invalidated[0] += len(change.stale_inodes)
            invalidated[1] += len(change.stale_names)
        if site.pages.tree_version != tree.version:
            site.pages.switch(tree.version)
        own = self.fs.own_mount
        if not own and whole is None and len(tree.entries) >= WHOLE_TABLE_FILES and self._nursery is not None:
            self._nursery.start_soon(site.make_whole, tree)
        for name in site.views:
            self.warm(site, name)
        log.info(
            "site %s: tree %s -> %s for %d views in %.3fs (tables %s): %d files changed, %d added, %d removed; "
            "%d inodes and %d names invalidated",
            site.config.site if own else site.key,
            previous,
            tree.version,
            len(site.views),
            time.perf_counter() - started,
            "built" if whole is None else "filtered from the whole tree's",
            total.changed,
            total.added,
            total.removed,
            *invalidated,
        )

    # -- status --------------------------------------------------------------------------------

    def describe(self, mountpoint: str) -> dict[str, dict[str, object]]:
        """Per view, by its full path: what the mount server's metrics show per class."""
        requests = self.fs.requests_by_view()
        views: dict[str, dict[str, object]] = {}
        for site in self.sites.values():
            for name, view in site.views.items():
                views[f"{mountpoint}/{site.directory}/{name}"] = view_status(
                    site.config.site,
                    view.reader,
                    view.fs.table,
                    site.tree.version,
                    {"all": requests.get((site.directory, name), 0)},
                    site.switches.describe(site.follower),
                )
        return views
