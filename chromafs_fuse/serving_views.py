"""Many views in one mount's inode space (pure): the root (inode 1) holds one directory per
site, each holding one directory per view (a reader class) with the view's tree under it.

A session is a bind of one view's directory, so it reaches nothing above it. Each view's table
is numbered in its own `InodeScope`: its directories are its own, and a page has one inode in
every view of its site that shows it, so the kernel keeps the page's bytes once. The namespace
routes an inode to a view that holds it; the top two levels are its own, seen only by whoever
may open the serving mount itself (root).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from chromafs_fuse.errors import Corrupt
from chromafs_fuse.inodes import ROOT_INODE, InodeScope, InodeTable

SITE_DIR_TAG = "\0site\0"


class HasTable(Protocol):
    @property
    def table(self) -> InodeTable: ...


V = TypeVar("V", bound=HasTable)


class InodeClash(Corrupt):
    """Two different nodes hashed to one inode number: the view cannot join this mount."""


def view_name(site: str, class_key: str) -> str:
    """A view's directory name: short, and the same for the same reader class of a site."""
    return hashlib.blake2b(f"{site}\0{class_key}".encode(), digest_size=8).hexdigest()


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def site_dir_name(site: str) -> str:
    """The site's directory under the root: its name when that is a plain file name, else a hash."""
    if _PLAIN_NAME.fullmatch(site):
        return site
    return "~" + hashlib.blake2b(site.encode(), digest_size=8).hexdigest()


def scope_for(site: str, name: str) -> InodeScope:
    return InodeScope(site=site, view=f"{site}\0{name}")


def _site_inode(site: str) -> int:
    digest = hashlib.blake2b(f"{SITE_DIR_TAG}{site}".encode(), digest_size=8).digest()
    return max(int.from_bytes(digest, "little") & ((1 << 63) - 1), ROOT_INODE + 1)


@dataclass(slots=True)
class _Site(Generic[V]):
    inode: int
    views: dict[str, V] = field(default_factory=dict)  # name -> view


class ServingNamespace(Generic[V]):
    """Which view answers for an inode, and the listing of the top two levels."""

    def __init__(self) -> None:
        self._sites: dict[str, _Site[V]] = {}
        self._site_by_inode: dict[int, str] = {}
        self._route: dict[int, V] = {}  # every node of every view -> a view holding it
        self._holders: dict[int, list[V]] = {}  # file inodes held by more than one view
        self._extra: dict[int, list[int]] = {}  # id(view) -> the inodes it holds outside its table

    # -- views joining and leaving -------------------------------------------------

    def add(self, site: str, name: str, view: V, extra_inodes: Iterable[int] = ()) -> None:
        """Make `view` the view `name` of `site` (replacing the view there, if any). `extra_inodes`:
        inodes the view answers for outside its table (old versions still open)."""
        site = site_dir_name(site)
        old = self._sites[site].views.get(name) if site in self._sites else None
        self._check(site, view, old)
        if old is not None:
            self._drop_routes(old)
        entry = self._sites.get(site)
        if entry is None:
            entry = _Site(_site_inode(site))
            self._sites[site] = entry
            self._site_by_inode[entry.inode] = site
        entry.views[name] = view
        table = view.table
        for index in range(len(table)):
            self._hold(table.inode_at(index), view)
        extra = [inode for inode in extra_inodes if table.index_of(inode) < 0]
        for inode in extra:
            self._hold(inode, view)
        self._extra[id(view)] = extra

    def remove(self, site: str, name: str) -> V | None:
        site = site_dir_name(site)
        entry = self._sites.get(site)
        view = entry.views.pop(name, None) if entry else None
        if view is None:
            return None
        self._drop_routes(view)
        assert entry is not None
        if not entry.views:
            del self._sites[site]
            del self._site_by_inode[entry.inode]
        return view

    def _check(self, site: str, view: V, old: V | None) -> None:
        """Refuse a view whose nodes hash onto a node of another view that is not the same page."""
        table = view.table
        for index in range(len(table)):
            inode = table.inode_at(index)
            if inode == ROOT_INODE or inode in self._site_by_inode:
                raise InodeClash(f"inode {inode} of {table.key_at(index)!r} is a top directory")
            holder = self._route.get(inode)
            if holder is None or holder is old:
                continue
            other = holder.table
            at = other.index_of(inode)
            same_page = (
                not table.is_dir_at(index)
                and at >= 0
                and not other.is_dir_at(at)
                and other.scope.site == table.scope.site
                and other.key_at(at) == table.key_at(index)
            )
            if not same_page:
                raise InodeClash(f"inode {inode} of {table.key_at(index)!r} is taken in site {site!r}")

    def _hold(self, inode: int, view: V) -> None:
        current = self._route.get(inode)
        if current is None:
            self._route[inode] = view
        elif current is not view:
            self._holders.setdefault(inode, [current]).append(view)

    def _drop_routes(self, view: V) -> None:
        table = view.table
        for inode in [*(table.inode_at(i) for i in range(len(table))), *self._extra.pop(id(view), [])]:
            holders = self._holders.get(inode)
            if holders is None:
                if self._route.get(inode) is view:
                    del self._route[inode]
                continue
            holders[:] = [v for v in holders if v is not view]
            self._route[inode] = holders[0]
            if len(holders) == 1:
                del self._holders[inode]

    # -- requests -----------------------------------------------------------------

    def route(self, inode: int) -> V | None:
        """A view that answers for `inode`; None for the top directories and unknown inodes."""
        return self._route.get(inode)

    def holders(self, inode: int) -> list[V]:
        """Every view that answers for `inode` (a page several views show, an old version)."""
        holders = self._holders.get(inode)
        if holders is not None:
            return list(holders)
        view = self._route.get(inode)
        return [] if view is None else [view]

    def is_top(self, inode: int) -> bool:
        return inode == ROOT_INODE or inode in self._site_by_inode

    def top_children(self, inode: int) -> list[tuple[bytes, int]]:
        """The (name, inode) pairs of a top directory, sorted by name."""
        if inode == ROOT_INODE:
            pairs = [(site.encode(), entry.inode) for site, entry in self._sites.items()]
        else:
            entry = self._sites[self._site_by_inode[inode]]
            pairs = [(name.encode(), view.table.inode_at(0)) for name, view in entry.views.items()]
        return sorted(pairs)

    def top_lookup(self, parent: int, name: bytes) -> int | None:
        try:
            text = name.decode()
        except UnicodeDecodeError:
            return None
        if parent == ROOT_INODE:
            entry = self._sites.get(text)
            return entry.inode if entry else None
        view = self._sites[self._site_by_inode[parent]].views.get(text)
        return view.table.inode_at(0) if view is not None else None

    def view(self, site: str, name: str) -> V | None:
        entry = self._sites.get(site_dir_name(site))
        return entry.views.get(name) if entry else None

    def views(self) -> list[tuple[str, str, V]]:
        """(site directory, view name, view) of every view."""
        return [(site, name, view) for site, e in self._sites.items() for name, view in e.views.items()]
