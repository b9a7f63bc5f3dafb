"""What the kernel must forget when a mount switches to a new tree (pure, no I/O).

Two pruned inode tables of one reader, before and after a re-ingest, give:
- the (parent inode, name) pairs whose cached lookup is wrong now: names that appeared
  (the kernel may hold a negative entry for them), disappeared (removed, or hidden from this
  reader by an access change), or now name a new version of a file (a file's inode follows
  its sha256, so a changed file is a new inode under the same name);
- the inodes whose cached data, attributes or listing are wrong now: directories whose
  listing changed, files that changed without a new inode (a tree without sha256s), and
  files removed or hidden from the reader (their cached bytes must not outlive them);
- the files replaced by a new version, old inode -> old entry: a reader holding the old
  inode keeps reading that version.
Unchanged paths keep their inode numbers, so the kernel's other caches stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chromafs_fuse.inodes import ROOT_INDEX, InodeTable
from chromafs_fuse.tree import PathEntry


@dataclass
class TreeChange:
    stale_inodes: list[int] = field(default_factory=list)
    stale_names: list[tuple[int, bytes]] = field(default_factory=list)
    replaced: dict[int, PathEntry] = field(default_factory=dict)  # old inode -> the version it serves
    added: int = 0
    removed: int = 0
    changed: int = 0

    @property
    def empty(self) -> bool:
        return not (self.stale_inodes or self.stale_names)


def _same_bytes(old: PathEntry, new: PathEntry) -> bool:
    return (old.sha256, old.size, old.mtime, old.blob) == (new.sha256, new.size, new.mtime, new.blob)


def _paths(table: InodeTable) -> dict[str, int]:
    return {table.key_at(index): index for index in range(len(table))}


def diff_tables(old: InodeTable, new: InodeTable) -> TreeChange:
    change = TreeChange()
    before, after = _paths(old), _paths(new)
    stale_dirs: set[int] = set()

    def forget_name(table: InodeTable, index: int) -> None:
        parent = table.parent_at(index)
        change.stale_names.append((table.inode_at(parent), table.name_at(index)))
        parent_path = table.key_at(parent)
        if parent_path in after:
            stale_dirs.add(new.inode_at(after[parent_path]))

    def same_node(old_index: int, new_index: int | None) -> bool:
        return (
            new_index is not None
            and old.inode_at(old_index) == new.inode_at(new_index)
            and old.is_dir_at(old_index) == new.is_dir_at(new_index)
        )

    for path, index in before.items():
        if index == ROOT_INDEX:
            continue
        other = after.get(path)
        old_entry, new_entry = old.entries.get(path), new.entries.get(path)
        if other is None or not same_node(index, other):
            forget_name(old, index)
            if old_entry is not None and new_entry is not None:
                change.replaced[old.inode_at(index)] = old_entry
                change.changed += 1
            elif not old.is_dir_at(index):
                change.removed += 1
                change.stale_inodes.append(old.inode_at(index))  # a reader holding it reads no more
            continue
        if old_entry is not None and new_entry is not None and not _same_bytes(old_entry, new_entry):
            change.stale_inodes.append(new.inode_at(other))
            change.changed += 1
    for path, index in after.items():
        other = before.get(path)
        if index == ROOT_INDEX or (
            other is not None
            and old.inode_at(other) == new.inode_at(index)
            and old.is_dir_at(other) == new.is_dir_at(index)
        ):
            continue
        forget_name(new, index)
        change.added += not new.is_dir_at(index) and (other is None or old.is_dir_at(other))
    change.stale_names = list(dict.fromkeys(change.stale_names))  # a replaced file's name comes twice
    change.stale_inodes.extend(sorted(stale_dirs))
    return change
