"""What a switch to a new tree tells the kernel to forget (pure)."""

from __future__ import annotations

import json

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.tree import parse_tree
from chromafs_fuse.tree_diff import diff_tables

BEFORE = {
    "index.md": {"isPublic": True, "sha256": "a" * 64, "size": 3},
    "guides/one.md": {"isPublic": True, "sha256": "b" * 64, "size": 3},
    "guides/two.md": {"isPublic": True, "sha256": "c" * 64, "size": 3},
    "old/gone.md": {"isPublic": True, "sha256": "d" * 64, "size": 3},
}


def table(tree: dict, principal: Principal | None = None) -> InodeTable:
    entries = parse_tree(json.dumps(tree)).entries
    return InodeTable(visible_entries(entries, principal or Principal.anonymous()))


def test_an_unchanged_tree_has_nothing_to_forget() -> None:
    change = diff_tables(table(BEFORE), table(dict(BEFORE)))
    assert change.empty and (change.added, change.removed, change.changed) == (0, 0, 0)


def test_edits_additions_removals_and_a_page_locked_away() -> None:
    after = dict(BEFORE)
    after["guides/one.md"] = {"isPublic": True, "sha256": "e" * 64, "size": 4}  # edited
    after["guides/two.md"] = {"isPublic": False, "groups": ["admin"], "sha256": "c" * 64, "size": 3}  # locked
    del after["old/gone.md"]  # removed, and its folder with it
    after["new/fresh.md"] = {"isPublic": True, "sha256": "f" * 64, "size": 3}  # added, in a new folder
    old, new = table(BEFORE), table(after)
    change = diff_tables(old, new)
    one, index_md = new.resolve("guides/one.md"), new.resolve("index.md")
    guides, root = new.resolve("guides"), new.resolve("")
    assert one is not None and guides is not None and root is not None and index_md is not None
    old_one = old.resolve("guides/one.md")
    assert old_one is not None and index_md.inode == old.resolve("index.md").inode  # type: ignore[union-attr]
    # a new version is a new inode under the same name; the old inode keeps serving the old version
    assert one.inode != old_one.inode and change.replaced == {old_one.inode: old_one.entry}
    assert (change.changed, change.added, change.removed) == (1, 1, 2)
    assert set(change.stale_names) == {
        (guides.inode, b"one.md"),
        (guides.inode, b"two.md"),
        (root.inode, b"old"),
        (old.resolve("old").inode, b"gone.md"),  # type: ignore[union-attr]
        (root.inode, b"new"),
        (new.resolve("new").inode, b"fresh.md"),  # type: ignore[union-attr]
    }
    two, gone = old.resolve("guides/two.md"), old.resolve("old/gone.md")
    assert two is not None and gone is not None
    # listings that changed, and the removed and locked files: cached bytes must not outlive them
    assert set(change.stale_inodes) == {guides.inode, root.inode, new.resolve("new").inode, two.inode, gone.inode}  # type: ignore[union-attr]
    assert len(change.stale_names) == len(set(change.stale_names))


def test_a_file_changed_in_a_tree_without_sha256_keeps_its_inode_and_its_data_is_dropped() -> None:
    before = {"a.md": {"isPublic": True, "size": 3, "mtime": 1}, "b.md": {"isPublic": True, "size": 3}}
    after = {"a.md": {"isPublic": True, "size": 4, "mtime": 2}, "b.md": {"isPublic": True, "size": 3}}
    old, new = table(before), table(after)
    change = diff_tables(old, new)
    a = new.resolve("a.md")
    assert a is not None and a.inode == old.resolve("a.md").inode  # type: ignore[union-attr]
    assert change.stale_inodes == [a.inode] and change.stale_names == [] and change.replaced == {}
    assert change.changed == 1


def test_a_page_made_visible_appears_for_that_reader_only() -> None:
    locked = dict(BEFORE, **{"staff.md": {"isPublic": False, "groups": ["staff"], "size": 1}})
    opened = dict(BEFORE, **{"staff.md": {"isPublic": True, "size": 1}})
    anonymous = diff_tables(table(locked), table(opened))
    assert anonymous.added == 1 and (table(opened).inode_at(0), b"staff.md") in anonymous.stale_names
    staff = Principal.of(["staff"])
    assert diff_tables(table(locked, staff), table(opened, staff)).empty
