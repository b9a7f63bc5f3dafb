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
    assert one.inode == old.resolve("guides/one.md").inode  # type: ignore[union-attr]  # a path keeps its inode
    assert (change.changed, change.added, change.removed) == (1, 1, 2)
    assert set(change.stale_names) == {
        (guides.inode, b"two.md"),
        (root.inode, b"old"),
        (old.resolve("old").inode, b"gone.md"),  # type: ignore[union-attr]
        (root.inode, b"new"),
        (new.resolve("new").inode, b"fresh.md"),  # type: ignore[union-attr]
    }
    assert set(change.stale_inodes) == {one.inode, guides.inode, root.inode, new.resolve("new").inode}  # type: ignore[union-attr]
    assert index_md.inode not in change.stale_inodes


def test_a_page_made_visible_appears_for_that_reader_only() -> None:
    locked = dict(BEFORE, **{"staff.md": {"isPublic": False, "groups": ["staff"], "size": 1}})
    opened = dict(BEFORE, **{"staff.md": {"isPublic": True, "size": 1}})
    anonymous = diff_tables(table(locked), table(opened))
    assert anonymous.added == 1 and (table(opened).inode_at(0), b"staff.md") in anonymous.stale_names
    staff = Principal.of(["staff"])
    assert diff_tables(table(locked, staff), table(opened, staff)).empty
