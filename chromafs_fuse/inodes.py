"""The inode table of one mount: directories and files of the visible tree (pure).

Inode numbers are derived from the path, so they are the same on every mount
that shows the path and say nothing about which other paths exist.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .tree import PathEntry

ROOT_INODE = 1
_NO_CHILDREN: dict[bytes, int] = {}  # a file's; never written: files are never parents
_INODE_MASK = (1 << 63) - 1


@dataclass(slots=True)
class Node:
    inode: int
    path: str  # "" for the root
    name: bytes
    parent: int
    entry: PathEntry | None  # None for directories
    children: dict[bytes, int] = field(default_factory=dict)  # files share one empty dict
    sorted_children: Sequence[tuple[bytes, int]] = ()
    order: int = -1  # a file's index in the table's file_order

    @property
    def is_dir(self) -> bool:
        return self.entry is None


def _inode_for(path: str, salt: int) -> int:
    digest = hashlib.blake2b(f"{salt}:{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _INODE_MASK


class InodeTable:
    """Maps inode numbers to nodes and (parent, name) to inode numbers."""

    def __init__(self, entries: Mapping[str, PathEntry]) -> None:
        self.nodes: dict[int, Node] = {}
        root = Node(ROOT_INODE, "", b"", ROOT_INODE, None)
        self.nodes[ROOT_INODE] = root
        by_path: dict[str, Node] = {"": root}
        self.entries = entries  # the visible entries, by key
        self.file_count = 0
        self.total_bytes = 0
        self.unknown_sizes = 0  # entries without a size in the tree
        for key in sorted(entries):
            parent = root
            parts = key.split("/")
            for depth in range(1, len(parts)):
                dir_path = "/".join(parts[:depth])
                node = by_path.get(dir_path)
                if node is None:
                    node = self._add(dir_path, parts[depth - 1], parent, None)
                    by_path[dir_path] = node
                parent = node
            entry = entries[key]
            self._add(key, parts[-1], parent, entry)
            self.file_count += 1
            if entry.size is None:
                self.unknown_sizes += 1
            else:
                self.total_bytes += entry.size
        for node in self.nodes.values():
            if node.children:
                node.sorted_children = sorted(node.children.items())
        # Files in the order `grep -r`, `find` and `rg` (per thread) visit them: depth first,
        # each directory's entries sorted by name, as readdir returns them.
        self.file_order: list[int] = []
        stack = [ROOT_INODE]
        while stack:
            directory = self.nodes[stack.pop()]
            subdirs = []
            for _name, child in directory.sorted_children:
                child_node = self.nodes[child]
                if child_node.entry is None:
                    subdirs.append(child)
                else:
                    child_node.order = len(self.file_order)
                    self.file_order.append(child)
            stack.extend(reversed(subdirs))

    def _add(self, path: str, name: str, parent: Node, entry: PathEntry | None) -> Node:
        salt = 0
        inode = _inode_for(path, salt)
        while inode <= ROOT_INODE or inode in self.nodes:
            salt += 1
            inode = _inode_for(path, salt)
        node = Node(inode, path, name.encode("utf-8"), parent.inode, entry, {} if entry is None else _NO_CHILDREN)
        self.nodes[inode] = node
        parent.children[node.name] = inode
        return node

    def get(self, inode: int) -> Node | None:
        return self.nodes.get(inode)

    def lookup(self, parent_inode: int, name: bytes) -> Node | None:
        parent = self.nodes.get(parent_inode)
        if parent is None:
            return None
        if name == b".":
            return parent
        if name == b"..":
            return self.nodes[parent.parent]
        inode = parent.children.get(name)
        return None if inode is None else self.nodes[inode]

    def resolve(self, path: str) -> Node | None:
        """The node at a "/"-separated path relative to the root, if visible."""
        node: Node | None = self.nodes[ROOT_INODE]
        for part in path.strip("/").split("/"):
            if not part or node is None:
                continue
            node = self.lookup(node.inode, part.encode("utf-8"))
        return node

    def files_from(self, index: int, count: int) -> list[Node]:
        """The `count` files from position `index` of file_order, across directory boundaries."""
        nodes = self.nodes
        return [nodes[inode] for inode in self.file_order[max(index, 0) : index + count]]

    def file_at(self, index: int) -> Node | None:
        return self.nodes[self.file_order[index]] if 0 <= index < len(self.file_order) else None
