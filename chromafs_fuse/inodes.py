"""The inode table of one mount: directories and files of the visible tree (pure).

Inode numbers are derived from the path, and for a file from its sha256 too, so
they are the same on every mount that shows the same version of the path and say
nothing about which other paths exist. A re-ingest that changes a file's bytes
gives it a new inode, as replacing a file by `rename` does: a reader holding the
old inode keeps reading the old version, and a new open finds the new one.

The table is flat arrays and byte strings, not an object per node: a mount
forked from `chromafs-mountd` shares the table with the server, and reading
an array element writes nothing to it, where touching a Python object writes
its reference count and un-shares the memory page it sits on. The `Node`s
(and the `PathEntry`s in them) that requests see are made on demand.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

from chromafs_fuse.tree import BlobPointer, PathEntry

ROOT_INODE = 1
ROOT_INDEX = 0
_INODE_MASK = (1 << 63) - 1
_NO_SHA = bytes(32)


@dataclass(slots=True)
class Node:
    """One directory or file, as a request sees it (made on demand, not kept)."""

    index: int  # position in the table
    inode: int
    name: bytes
    path: str  # "" for the root
    parent: int  # the parent's inode (the root's is its own)
    entry: PathEntry | None  # None for directories
    order: int  # a file's position in file_order; -1 for directories

    @property
    def is_dir(self) -> bool:
        return self.entry is None


def _inode_for(path: str, salt: int) -> int:
    digest = hashlib.blake2b(f"{salt}:{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _INODE_MASK


@dataclass(frozen=True, slots=True)
class InodeScope:
    """Where a table's inode numbers live. The default is a mount of its own: the root is inode 1.
    A view among many in one serving mount numbers its directories (root included) for the view
    alone, since their listings differ between views, and its files for the site, so that every
    view of a site that shows a page gives it the same inode and the kernel holds its bytes once."""

    site: str = ""
    view: str = ""

    def root_inode(self) -> int:
        return ROOT_INODE if not self.view else _free_inode(f"\0view\0{self.view}", set())

    def identity(self, path: str, entry: PathEntry | None) -> str:
        if entry is None:
            return f"{self.view}\0{path}" if self.view else path
        own = path if entry.sha256 is None else f"{path}\0{entry.sha256}"
        return f"{self.site}\0{own}" if self.site else own


def _free_inode(identity: str, used: set[int]) -> int:
    """The identity's inode: its hash, rehashed with a salt while it collides (or is 0 or 1)."""
    salt = 0
    inode = _inode_for(identity, salt)
    while inode <= ROOT_INODE or inode in used:
        salt += 1
        inode = _inode_for(identity, salt)
    return inode


class _Dir:
    __slots__ = ("children", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.children: dict[str, _Dir | PathEntry] = {}


def _nest(entries: Mapping[str, PathEntry]) -> _Dir:
    """The entries as nested directories."""
    root = _Dir("")
    for key, entry in entries.items():
        parts = key.split("/")
        directory = root
        for depth in range(1, len(parts)):
            child = directory.children.get(parts[depth - 1])
            if child is None:
                child = directory.children[parts[depth - 1]] = _Dir("/".join(parts[:depth]))
            assert isinstance(child, _Dir), key  # parse_tree drops keys that are also directories
            directory = child
        directory.children[parts[-1]] = entry
    return root


_Columns = tuple[dict[str, int], list[bytes], list[bytes]]


class InodeTable:
    """Maps inode numbers to nodes and (parent, name) to inode numbers.

    Nodes are laid out breadth first, each directory's children next to each
    other and sorted by name (as bytes), so a listing is a range of indices.
    """

    def __init__(self, entries: Mapping[str, PathEntry], scope: InodeScope = InodeScope()) -> None:
        self.entries = entries  # the visible entries, by key
        self.scope = scope
        self._columns: _Columns | None = None  # made for `pruned_from`
        self._add_nodes(_nest(entries))
        self._order_files()

    def _add_nodes(self, root: _Dir) -> None:
        """One node per directory and file, breadth first, each directory's children by name."""
        self._inode = array("Q")
        self._parent = array("l")
        self._first = array("l")  # a directory's first child
        self._count = array("l")  # its number of children (0 for files)
        self._size = array("q")  # -1: not in the tree
        self._mtime = array("d")  # NaN: not in the tree
        self._chunks = array("l")  # 0: not in the tree
        self._name_end = array("l")
        self._path_end = array("l")
        self._has_sha = bytearray()
        self._public = bytearray()
        self._group_id = array("l")
        self._group_sets: list[frozenset[str]] = []
        self._source_keys: dict[int, str] = {}  # only where the tree spells a key differently
        self._blobs: dict[int, BlobPointer] = {}
        self.salted = False  # an inode was rehashed for a collision: no table may be filtered from this one
        self.file_count = 0
        self.total_bytes = 0
        self.unknown_sizes = 0  # entries without a size in the tree
        names = bytearray()
        paths = bytearray()
        shas = bytearray()
        group_ids: dict[frozenset[str], int] = {}
        used: set[int] = set()
        counts = [0, 0, 0]  # files, their bytes, those without a size
        # the columns' appends, bound once: this runs once per node of a 100,000-page tree
        inode_col, parent_col, first_col, count_col = self._inode, self._parent, self._first, self._count
        size_col, mtime_col, chunks_col = self._size.append, self._mtime.append, self._chunks.append
        name_end, path_end, group_col = self._name_end.append, self._path_end.append, self._group_id.append
        has_sha, public = self._has_sha.append, self._public.append
        identity_of, nan = self.scope.identity, math.nan

        def add(path: str, name: str, parent: int, entry: PathEntry | None) -> int:
            index = len(inode_col)
            if index == ROOT_INDEX:
                inode = self.scope.root_inode()
            else:
                identity = identity_of(path, entry)
                inode = _inode_for(identity, 0)
                if inode <= ROOT_INODE or inode in used:
                    inode = _free_inode(identity, used)
                    self.salted = True
            used.add(inode)
            inode_col.append(inode)
            parent_col.append(parent)
            first_col.append(0)
            count_col.append(0)
            names.extend(name.encode("utf-8"))
            name_end(len(names))
            paths.extend(path.encode("utf-8"))
            path_end(len(paths))
            if entry is None:
                chunks_col(0)
                size_col(0)
                mtime_col(nan)
                shas.extend(_NO_SHA)
                has_sha(0)
                public(0)
                group_col(-1)
                return index
            chunks_col(0 if entry.chunks is None else entry.chunks)
            counts[0] += 1
            if entry.size is None:
                counts[2] += 1
                size_col(-1)
            else:
                counts[1] += entry.size
                size_col(entry.size)
            mtime_col(nan if entry.mtime is None else entry.mtime)
            shas.extend(_NO_SHA if entry.sha256 is None else bytes.fromhex(entry.sha256))
            has_sha(entry.sha256 is not None)
            public(entry.is_public)
            group_id = group_ids.get(entry.groups)
            if group_id is None:
                group_id = group_ids[entry.groups] = len(self._group_sets)
                self._group_sets.append(entry.groups)
            group_col(group_id)
            if entry.source_key != entry.key:
                self._source_keys[index] = entry.source_key
            if entry.blob is not None:
                self._blobs[index] = entry.blob
            return index

        queue: list[tuple[int, _Dir]] = [(add("", "", ROOT_INDEX, None), root)]
        for index, directory in queue:  # breadth first: the queue grows while we walk it
            children = sorted(directory.children.items(), key=lambda item: item[0].encode("utf-8"))
            self._first[index] = len(self._inode)
            self._count[index] = len(children)
            for name, child in children:
                if isinstance(child, _Dir):
                    queue.append((add(child.path, name, index, None), child))
                else:
                    add(child.key, name, index, child)
        self.file_count, self.total_bytes, self.unknown_sizes = counts
        self._names = bytes(names)
        self._paths = bytes(paths)
        self._sha = bytes(shas)
        self._by_inode = array("Q", sorted(self._inode))
        self._index_by_inode = array("l", sorted(range(len(self._inode)), key=self._inode.__getitem__))

    @classmethod
    def pruned_from(cls, whole: InodeTable, entries: Mapping[str, PathEntry], scope: InodeScope) -> InodeTable:
        """The table `InodeTable(entries, scope)` would build, made from the table of the whole
        tree (`whole`, numbered for the same site and no view) where `entries` are some of its
        files: their nodes are taken in the same order, hidden files and the directories left
        empty dropped, the directories numbered for `scope`'s view. A class's first table of a
        100,000-page tree is a few times faster so. Falls back to building it when a number would
        collide (never seen: 63-bit hashes)."""
        if whole.salted or whole.scope != InodeScope(site=scope.site):
            return cls(entries, scope)
        import numpy as np  # here: a mount of its own never filters, nor loads numpy

        def lengths(ends: array[int]) -> np.ndarray:  # each item's, from a column's running ends
            return np.diff(np.frombuffer(ends, dtype=np.int64), prepend=0)

        count = len(whole._inode)
        index_of_key, names, paths = whole._columns_by_node()
        try:
            files = np.fromiter(map(index_of_key.__getitem__, entries), dtype=np.int64, count=len(entries))
        except KeyError:  # not a file of `whole`
            return cls(entries, scope)
        keep = np.zeros(count, dtype=bool)
        keep[ROOT_INDEX] = True
        keep[files] = True
        parent = np.frombuffer(whole._parent, dtype=np.int64)
        level = files
        while level.size:  # each kept node's directories, a level at a time
            up = np.unique(parent[level])
            level = up[~keep[up]]
            keep[level] = True
        kept = np.flatnonzero(keep)
        size = kept.size
        new_index = np.full(count, -1, dtype=np.int64)
        new_index[kept] = np.arange(size, dtype=np.int64)
        inodes = np.frombuffer(whole._inode, dtype=np.uint64)[kept]
        parents = new_index[parent[kept]]
        children = np.bincount(parents[1:], minlength=size).astype(np.int64)
        first = np.zeros(size, dtype=np.int64)
        ups, at = np.unique(parents[1:], return_index=True)  # children come after their parent, together
        first[ups] = at + 1
        inodes[ROOT_INDEX] = scope.root_inode()
        for new in np.flatnonzero(children).tolist():  # a directory: numbered for the view
            if new:
                inodes[new] = _inode_for(scope.identity(whole.key_at(int(kept[new])), None), 0)
        if np.unique(inodes).size != size or (size > 1 and int(inodes[1:].min()) <= ROOT_INODE):
            return cls(entries, scope)  # the build would have rehashed one
        table = cls.__new__(cls)
        table.entries, table.scope, table.salted, table._columns = entries, scope, False, None
        table._inode = array("Q", inodes.tobytes())
        table._parent, table._first, table._count = (array("l", a.tobytes()) for a in (parents, first, children))
        for name in ("_size", "_mtime", "_chunks", "_group_id"):
            column = getattr(whole, name)
            setattr(table, name, array(column.typecode, np.frombuffer(column, dtype=column.typecode)[kept].tobytes()))
        table._has_sha = bytearray(np.frombuffer(whole._has_sha, dtype=np.uint8)[kept].tobytes())
        table._public = bytearray(np.frombuffer(whole._public, dtype=np.uint8)[kept].tobytes())
        table._group_sets = whole._group_sets
        table._sha = np.frombuffer(whole._sha, dtype=np.dtype((np.void, 32)))[kept].tobytes()
        kept_list = kept.tolist()
        table._names = b"".join(map(names.__getitem__, kept_list))
        table._name_end = array("l", np.cumsum(lengths(whole._name_end)[kept]).tobytes())
        table._paths = b"".join(map(paths.__getitem__, kept_list))
        table._path_end = array("l", np.cumsum(lengths(whole._path_end)[kept]).tobytes())
        table._source_keys = {int(new_index[i]): key for i, key in whole._source_keys.items() if keep[i]}
        table._blobs = {int(new_index[i]): blob for i, blob in whole._blobs.items() if keep[i]}
        is_file = children == 0
        is_file[ROOT_INDEX] = False
        sizes = np.frombuffer(table._size, dtype=np.int64)[is_file]
        table.file_count = int(sizes.size)
        table.unknown_sizes = int(np.count_nonzero(sizes == -1))
        table.total_bytes = int(sizes.sum()) + table.unknown_sizes
        order = np.argsort(inodes)
        table._by_inode = array("Q", inodes[order].tobytes())
        table._index_by_inode = array("l", order.astype(np.int64).tobytes())
        table._order_files()
        return table

    def prepare_pruning(self) -> None:
        """Make now what `pruned_from` takes from this table (else its first use does)."""
        self._columns_by_node()

    def _columns_by_node(self) -> _Columns:
        """A file's index by key, and each node's name and path as bytes."""
        if self._columns is None:
            count = len(self._inode)
            by_key = {self.key_at(i): i for i in range(1, count) if not self._count[i]}
            names = [self.name_at(i) for i in range(count)]
            paths = [self._paths[self._path_end[i - 1] if i else 0 : self._path_end[i]] for i in range(count)]
            self._columns = (by_key, names, paths)
        return self._columns

    def _order_files(self) -> None:
        # Files in the order `grep -r`, `find` and `rg` (per thread) visit them: depth first,
        # each directory's files by name, then its subdirectories by name.
        self.file_order = array("l")
        self._order = array("l", [-1]) * len(self._inode)
        stack = [ROOT_INDEX]
        while stack:
            directory_index = stack.pop()
            first = self._first[directory_index]
            subdirs = []
            for child in range(first, first + self._count[directory_index]):
                if self._count[child]:  # a directory always has a child
                    subdirs.append(child)
                else:
                    self._order[child] = len(self.file_order)
                    self.file_order.append(child)
            stack.extend(reversed(subdirs))

    def __len__(self) -> int:
        return len(self._inode)

    # -- by index: no objects made --------------------------------------------

    def index_of(self, inode: int) -> int:
        """The node's index, or -1 when no visible node has this inode."""
        at = bisect_left(self._by_inode, inode)
        if at < len(self._by_inode) and self._by_inode[at] == inode:
            return self._index_by_inode[at]
        return -1

    def is_dir_at(self, index: int) -> bool:
        return self._count[index] > 0 or index == ROOT_INDEX

    def children_at(self, index: int) -> range:
        """The indices of a directory's children, sorted by name."""
        first = self._first[index]
        return range(first, first + self._count[index])

    def name_at(self, index: int) -> bytes:
        return self._names[self._name_end[index - 1] if index else 0 : self._name_end[index]]

    def key_at(self, index: int) -> str:
        """The node's path ("" for the root)."""
        return self._paths[self._path_end[index - 1] if index else 0 : self._path_end[index]].decode("utf-8")

    def parent_at(self, index: int) -> int:
        """The parent directory's index (the root's is its own)."""
        return self._parent[index]

    def order_at(self, index: int) -> int:
        """A file's position in file_order; -1 for directories."""
        return self._order[index]

    def inode_at(self, index: int) -> int:
        return self._inode[index]

    def size_at(self, index: int) -> int | None:
        size = self._size[index]
        return None if size < 0 else size

    def sha_at(self, index: int) -> str | None:
        return self._sha[32 * index : 32 * index + 32].hex() if self._has_sha[index] else None

    def is_blob_at(self, index: int) -> bool:
        """A lazy file (its bytes in the blob store, not in Chroma)."""
        return index in self._blobs

    def mtime_at(self, index: int) -> float | None:
        mtime = self._mtime[index]
        return None if math.isnan(mtime) else mtime

    def directories_depth_first(self) -> list[int]:
        """Directory indices in the order `grep -r` enters them: the root, then each
        subdirectory's whole subtree in name order."""
        out: list[int] = []
        stack = [ROOT_INDEX]
        while stack:
            index = stack.pop()
            out.append(index)
            stack.extend(reversed([c for c in self.children_at(index) if self._count[c]]))
        return out

    def subdir_count(self, index: int) -> int:
        return sum(1 for child in self.children_at(index) if self._count[child])

    # -- nodes, made on demand --------------------------------------------------

    def node(self, index: int) -> Node:
        path = self.key_at(index)
        entry = None
        if index != ROOT_INDEX and not self._count[index]:
            size = self._size[index]
            mtime = self._mtime[index]
            entry = PathEntry(
                key=path,
                source_key=self._source_keys.get(index, path),
                is_public=bool(self._public[index]),
                groups=self._group_sets[self._group_id[index]],
                size=None if size < 0 else size,
                sha256=self.sha_at(index),
                mtime=None if math.isnan(mtime) else mtime,
                blob=self._blobs.get(index),
                chunks=self._chunks[index] or None,
            )
        return Node(
            index,
            self._inode[index],
            self.name_at(index),
            path,
            self._inode[self._parent[index]],
            entry,
            self._order[index],
        )

    def get(self, inode: int) -> Node | None:
        index = self.index_of(inode)
        return None if index < 0 else self.node(index)

    def lookup_index(self, parent_inode: int, name: bytes) -> int:
        """The index of `name` in the directory `parent_inode`, or -1."""
        parent = self.index_of(parent_inode)
        if parent < 0:
            return -1
        if name == b".":
            return parent
        if name == b"..":
            return self._parent[parent]
        children = self.children_at(parent)
        low, high = children.start, children.stop
        while low < high:  # binary search: the children are sorted by name
            middle = (low + high) // 2
            if self.name_at(middle) < name:
                low = middle + 1
            else:
                high = middle
        return low if low < children.stop and self.name_at(low) == name else -1

    def lookup(self, parent_inode: int, name: bytes) -> Node | None:
        index = self.lookup_index(parent_inode, name)
        return None if index < 0 else self.node(index)

    def children(self, inode: int) -> list[tuple[bytes, int]]:
        """(name, inode) of a directory's children, sorted by name."""
        index = self.index_of(inode)
        if index < 0:
            return []
        return [(self.name_at(child), self._inode[child]) for child in self.children_at(index)]

    def resolve(self, path: str) -> Node | None:
        """The node at a "/"-separated path relative to the root, if visible."""
        node: Node | None = self.node(ROOT_INDEX)
        for part in path.strip("/").split("/"):
            if not part or node is None:
                continue
            node = self.lookup(node.inode, part.encode("utf-8"))
        return node

    def files_from(self, order: int, count: int) -> list[Node]:
        """The `count` files from position `order` of file_order, across directory boundaries."""
        return [self.node(index) for index in self.file_order[max(order, 0) : order + count]]

    def file_at(self, order: int) -> Node | None:
        return self.node(self.file_order[order]) if 0 <= order < len(self.file_order) else None
