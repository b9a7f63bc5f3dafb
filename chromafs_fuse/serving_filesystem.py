"""Many views answering as one mount (issue 30): the filesystem of the serving mount.

`ServingFilesystem` answers the requests the pyfuse3 adapter forwards, as a `DocsFilesystem`
does, for a `ServingNamespace` of views: each view is a reader class of a site with its own
`DocsFilesystem` (its pruned table numbered in the view's `InodeScope`). A request on an inode
goes to a view that holds it; a page that several views of a site show has one inode, and any
of them answers for it alike (one page source and one attribute maker per site). The top two
levels, the root and one directory per site, are answered here; only root reaches them (the
serving mount sits in the mount server's root-only directory, a session is a bind of one view).

Nothing a session sees depends on the other views: a view's directories and files are its own
table's, `statfs` gives fixed numbers, and the top levels are never timed in the kernel (views
come and go). The kernel's open mode is set per connection, so it is one for every view: with
chromafs's pyfuse3 build the mount runs in no-open mode (the kernel sends no open, release,
opendir or releasedir, and keeps pages and listings), and a file whose size its tree does not give
is read when the kernel asks its attributes (DocsFilesystem.stat). The top directories' mtime is
the time a view last came or went, so the kernel lists them again after a change.

A mount of its own (`own_mount`: `chromafs-mount --no-mountd`, `--isolated`) is the same runtime
holding one view at the mount's root: its table numbered as a mount of its own (the root is inode
1, SEMANTICS.md "Inode numbers"), every request its view's, `statfs` its view's numbers, no top
levels and no `.sessions` (the mount is its reader's session: it ends with its token). Its open
mode follows its first tree (no-open only when the tree gives every size: `ServedSites.open_own`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from chromafs_fuse.attributes import BLOCK_SIZE, DAEMON_OWNER, DIR_MODE, Attributes
from chromafs_fuse.errors import FsError
from chromafs_fuse.filesystem import DocsFilesystem, FsStats, OpenReply
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.serving_views import ServingNamespace
from chromafs_fuse.sessions import (
    SESSION_BIT,
    SESSIONS_DIR,
    DirOrdinals,
    ServedSession,
    SessionSpace,
    is_session_inode,
    session_inode,
    split_inode,
)
from chromafs_fuse.tree_diff import TreeChange

A = TypeVar("A")
SHARED_STATS = FsStats(BLOCK_SIZE, 0, 0)  # the same for every session, whatever the views
SESSIONS_INODE = SESSION_BIT  # `.sessions`: slot 0, never a session's


class ViewEntry(Generic[A]):
    """A view in the namespace: its filesystem now, and the requests it answered (kept across
    the filesystems a re-ingest switches it to)."""

    __slots__ = ("fs", "ordinals", "requests")

    def __init__(self, fs: DocsFilesystem[A], requests: int = 0, ordinals: DirOrdinals | None = None) -> None:
        self.fs = fs
        self.requests = requests
        self.ordinals = ordinals or DirOrdinals(fs.table.inode_at(0))  # its sessions' directories

    @property
    def table(self) -> InodeTable:
        return self.fs.table


class ServingFilesystem(Generic[A]):
    def __init__(
        self, convert: Callable[[Attributes], A], time_ns: int, no_open: bool = False, own_mount: bool = False
    ) -> None:
        """`convert` turns an attribute record into what the mount answers with (as
        AttributeMaker's); `time_ns` is the time the top directories show until a view comes or
        goes; `no_open`: the kernel's open mode (every view's DocsFilesystem is built with it);
        `own_mount`: one view, at the mount's root (see the module's text)."""
        self.namespace: ServingNamespace[ViewEntry[A]] = ServingNamespace()
        self.convert = convert
        self.time_ns = time_ns
        self.no_open = no_open
        self.own_mount = own_mount
        self.absent = convert(Attributes(0, 0, 0, 0, 0, 0.0, 0.0, 0, 0))  # never cached: views come
        self.sessions = SessionSpace()
        self._own: DocsFilesystem[A] | None = None  # own_mount: the one view's filesystem

    # -- views joining and leaving ---------------------------------------------------------

    def add(self, site: str, name: str, fs: DocsFilesystem[A], extra_inodes: Iterable[int] = ()) -> None:
        """Serve `fs` as the view `name` of `site` from now on (replacing the view's filesystem,
        if any). `extra_inodes`: the old versions it still serves (DocsFilesystem.replaced).
        InodeClash when its inodes clash with another view's."""
        if self.own_mount:
            self._own = fs  # a request sees one tree or the other: one step on the loop
            return
        old = self.namespace.view(site, name)
        entry = ViewEntry(fs, old.requests, old.ordinals) if old else ViewEntry(fs)
        self.namespace.add(site, name, entry, extra_inodes)
        if old is None:
            self._changed()

    def remove(self, site: str, name: str) -> DocsFilesystem[A] | None:
        if self.own_mount:
            return None  # a mount of its own keeps its view until it is unmounted
        entry = self.namespace.remove(site, name)
        if entry is None:
            return None
        self._changed()
        return entry.fs

    def _changed(self) -> None:
        """A view came or went. In no-open mode the kernel caches the top directories' listings
        too, and takes one again when the directory's mtime moves (it asks their attributes
        before every listing: they are never cached, and libfuse turns on auto_inval_data)."""
        self.time_ns = max(time.time_ns(), self.time_ns + 1)

    def view(self, site: str, name: str) -> ViewEntry[A] | None:
        return self.namespace.view(site, name)

    # -- routing ---------------------------------------------------------------------------

    def _fs(self, inode: int) -> DocsFilesystem[A]:
        entry = self.namespace.route(inode)
        if entry is None:
            raise FsError(errno.ENOENT)
        entry.requests += 1
        return entry.fs

    def _top(self, inode: int) -> A:
        subdirs = len(self.namespace.top_children(inode))
        uid, gid = DAEMON_OWNER
        return self.convert(Attributes(inode, DIR_MODE, 2 + subdirs, 0, self.time_ns, 0.0, 0.0, uid, gid))

    def _view_root(self, inode: int) -> A:
        """A view's root as its site directory lists it: the name is not timed, since the view may
        go; the attributes are timed as the view's own getattr times them (an untimed root would
        cost a getattr on every permission check of a walk from it, a session's included)."""
        entry = self.namespace.route(inode)
        assert entry is not None
        fs = entry.fs
        record = fs.attributes.node_record(fs.table, 0, None)
        return self.convert(dataclasses.replace(record, entry_timeout=0.0))

    # -- sessions ---------------------------------------------------------------------------

    def open_session(
        self, site: str, name: str, uid: int, gid: int, expires_at: float | None, allow_other: bool
    ) -> ServedSession:
        """A session of the view `name` of `site`, at `.sessions/<slot>` from now on."""
        if self.namespace.view(site, name) is None:
            raise FsError(errno.ENOENT)
        return self.sessions.open(site, name, uid, gid, expires_at, allow_other)

    def session_inodes(self, session: ServedSession) -> list[int]:
        """Every directory inode the kernel may hold for the session (what it must forget when
        the session ends)."""
        entry = self.namespace.view(session.site, session.view)
        count = len(entry.ordinals) if entry is not None else 1
        return [session_inode(session.slot, ordinal) for ordinal in range(count)]

    def session_change(self, site: str, name: str, change: TreeChange) -> TreeChange:
        """What the kernel must forget of the view's sessions after a re-ingest: the view's own
        change, for each live session's directories."""
        entry = self.namespace.view(site, name)
        out = TreeChange()
        if entry is None:
            return out
        known = entry.ordinals.known
        for session in self.sessions.of_view(site, name):
            for inode in change.stale_inodes:
                ordinal = known(inode)
                if ordinal is not None:
                    out.stale_inodes.append(session_inode(session.slot, ordinal))
            for parent, child in change.stale_names:
                ordinal = known(parent)
                if ordinal is not None:
                    out.stale_names.append((session_inode(session.slot, ordinal), child))
        return out

    def _session_dir(self, inode: int) -> tuple[ServedSession, ViewEntry[A], int]:
        """The live session a directory inode belongs to, its class view, the class's inode of
        the directory. EACCES once the session ended: whatever the kernel still holds of it."""
        slot, ordinal = split_inode(inode)
        session = self.sessions.live(slot, time.time())
        entry = self.namespace.view(session.site, session.view)
        class_inode = entry.ordinals.class_inode(ordinal) if entry is not None else None
        if entry is None or class_inode is None:
            raise FsError(errno.ENOENT)
        entry.requests += 1
        return session, entry, class_inode

    def _session_attributes(self, session: ServedSession, entry: ViewEntry[A], index: int) -> A:
        """A directory of the session: the class's, under the session's inode and owner."""
        fs = entry.fs
        record = fs.attributes.node_record(fs.table, index, None)
        ordinal = entry.ordinals.ordinal(fs.table.inode_at(index))
        return self.convert(
            dataclasses.replace(
                record,
                inode=session_inode(session.slot, ordinal),
                mode=session.mode,
                uid=session.uid,
                gid=session.gid,
                entry_timeout=0.0 if index == 0 else record.entry_timeout,
            )
        )

    def _sessions_dir(self) -> A:
        uid, gid = DAEMON_OWNER
        return self.convert(Attributes(SESSIONS_INODE, DIR_MODE, 2, 0, self.time_ns, 0.0, 0.0, uid, gid))

    async def _session_lookup(self, parent_inode: int, name: bytes) -> A:
        if parent_inode == SESSIONS_INODE:
            slot = self.sessions.slot_of(name)
            if slot is None:
                return self.absent
            session = self.sessions.live(slot, time.time())
            entry = self.namespace.view(session.site, session.view)
            if entry is None:
                raise FsError(errno.ENOENT)
            return self._session_attributes(session, entry, 0)
        session, entry, class_inode = self._session_dir(parent_inode)
        fs = entry.fs
        index = fs.table.lookup_index(class_inode, name)
        if index >= 0 and fs.table.is_dir_at(index):
            return self._session_attributes(session, entry, index)
        return await fs.lookup(class_inode, name)  # a file is the class's (one inode per page)

    def _session_stat(self, inode: int) -> A:
        if inode == SESSIONS_INODE:
            return self._sessions_dir()
        session, entry, class_inode = self._session_dir(inode)
        return self._session_attributes(session, entry, entry.fs.index(class_inode))

    # -- requests (as DocsFilesystem's) ----------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes) -> A:
        if (own := self._own) is not None:
            return await own.lookup(parent_inode, name)
        namespace = self.namespace
        if is_session_inode(parent_inode):
            return await self._session_lookup(parent_inode, name)
        if not namespace.is_top(parent_inode):
            return await self._fs(parent_inode).lookup(parent_inode, name)
        if parent_inode == ROOT_INODE and name == SESSIONS_DIR:
            return self._sessions_dir()
        inode = namespace.top_lookup(parent_inode, name)
        if inode is None:
            return self.absent
        return self._top(inode) if namespace.is_top(inode) else self._view_root(inode)

    def getattr(self, inode: int) -> A:
        if (own := self._own) is not None:
            return own.getattr(inode)
        if is_session_inode(inode):
            return self._session_stat(inode)
        if self.namespace.is_top(inode):
            return self._top(inode)
        return self._fs(inode).getattr(inode)

    async def stat(self, inode: int) -> A:
        if (own := self._own) is not None:
            return await own.stat(inode)
        if is_session_inode(inode):
            return self._session_stat(inode)
        if self.namespace.is_top(inode):
            return self._top(inode)
        return await self._fs(inode).stat(inode)

    def open_dir(self, inode: int) -> None:
        if (own := self._own) is not None:
            own.open_dir(inode)
            return
        if is_session_inode(inode):
            if inode != SESSIONS_INODE:
                self._session_dir(inode)
        elif not self.namespace.is_top(inode):
            self._fs(inode).open_dir(inode)
            return
        if self.no_open:
            raise FsError(errno.ENOSYS)  # as every view's: one open mode per connection

    def listing(self, inode: int, start: int) -> Iterator[tuple[bytes, A, int]]:
        if (own := self._own) is not None:
            yield from own.listing(inode, start)
            return
        namespace = self.namespace
        if is_session_inode(inode):
            if inode == SESSIONS_INODE:
                return  # sessions are reached by name only
            session, entry, class_inode = self._session_dir(inode)
            yield from entry.fs.listing(
                class_inode, start, lambda index: self._session_attributes(session, entry, index)
            )
            return
        if not namespace.is_top(inode):
            yield from self._fs(inode).listing(inode, start)
            return
        children = namespace.top_children(inode)
        for position in range(start, len(children)):
            name, child = children[position]
            attributes = self._top(child) if namespace.is_top(child) else self._view_root(child)
            yield name, attributes, position + 1

    def open_file(self, inode: int, flags: int) -> OpenReply:
        if (own := self._own) is not None:
            return own.open_file(inode, flags)
        if is_session_inode(inode) or self.namespace.is_top(inode):
            raise FsError(errno.EISDIR)
        return self._fs(inode).open_file(inode, flags)

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        if (own := self._own) is not None:
            return await own.read(inode, offset, size)
        if is_session_inode(inode) or self.namespace.is_top(inode):
            raise FsError(errno.EISDIR)
        return await self._fs(inode).read(inode, offset, size)

    def forget(self, inodes: Sequence[int]) -> None:
        """An old version is held per view: every view holding the inode lets it go."""
        if (own := self._own) is not None:
            own.forget(inodes)
            return
        for inode in inodes:
            for entry in self.namespace.holders(inode):
                if entry.fs.replaced:
                    entry.fs.forget([inode])

    def may_access(self, inode: int, mode: int) -> bool:
        if (own := self._own) is not None:
            return own.may_access(inode, mode)
        if is_session_inode(inode):
            if inode != SESSIONS_INODE:
                self._session_dir(inode)
            return not mode & os.W_OK
        if self.namespace.is_top(inode):
            return not mode & os.W_OK
        return self._fs(inode).may_access(inode, mode)

    def stats(self) -> FsStats:
        if (own := self._own) is not None:
            return own.stats()  # its reader's visible files, as a session's directories give them
        return SHARED_STATS

    def stats_of(self, inode: int) -> FsStats:
        """A session's directory: its class's numbers (as a mount of its own gives them); EACCES
        once it ended. Anything else (a file, which every class of the site may share): fixed."""
        if (own := self._own) is not None:
            return own.stats_of(inode)
        if not is_session_inode(inode) or inode == SESSIONS_INODE:
            return SHARED_STATS
        _session, entry, _class_inode = self._session_dir(inode)
        return entry.fs.stats()

    def requests_by_view(self) -> Counter[tuple[str, str]]:
        """(site directory, view name) -> requests its view answered."""
        return Counter({(site, name): entry.requests for site, name, entry in self.namespace.views()})
