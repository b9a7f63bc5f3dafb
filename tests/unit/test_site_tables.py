"""One site's tables pruned per reader class (in-process): keyed by what a reader may see, the
same key a shared class mount goes by, bounded, and dropped whole for a tree of a new version."""

from __future__ import annotations

import json

from chromafs_fuse.access import Principal
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving.server.session_table import class_key
from chromafs_fuse.site.tables import PrunedTables, prune
from chromafs_fuse.tree import SiteTree, parse_tree

SITE = {
    "index.md": {"isPublic": True, "sha256": "a" * 64, "size": 3},
    "billing/plans.md": {"isPublic": False, "groups": ["billing"], "sha256": "b" * 64, "size": 3},
    "admin/keys.md": {"isPublic": False, "groups": ["admin"], "sha256": "c" * 64, "size": 3},
    "members.md": {"isPublic": False, "sha256": "d" * 64, "size": 3},
}
READERS = {
    "anonymous": Principal.anonymous(),
    "anonymous-with-groups": Principal(authenticated=False, groups=frozenset({"billing"})),
    "no-groups": Principal.of([], "carol"),
    "alice": Principal.of(["billing"], "alice", expires_at=100.0),
    "bob": Principal.of(["billing"], "bob", expires_at=999.0),
    "billing-class": Principal.of(["billing"]).reader_class(),
    "admin": Principal.of(["admin", "billing"], "dave"),
    "admin-reordered": Principal.of(["billing", "admin"], "erin"),
}


def tree(entries: dict) -> SiteTree:
    return parse_tree(json.dumps(entries))


def test_readers_share_a_table_exactly_when_they_share_a_class_mount() -> None:
    """One definition of "the same view": the cache's key and the sessions' class key agree."""
    tables = PrunedTables(prune)
    site = tree(SITE)
    got = {name: tables.get(site, reader) for name, reader in READERS.items()}
    for a, reader_a in READERS.items():
        for b, reader_b in READERS.items():
            same_class = class_key({"site": "acme"}, reader_a) == class_key({"site": "acme"}, reader_b)
            assert (got[a] is got[b]) == same_class, (a, b)
    assert tables.builds == len(tables) == 4  # anonymous, no groups, billing, admin+billing
    assert set(got["alice"].entries) == {"index.md", "billing/plans.md", "members.md"}
    assert set(got["anonymous-with-groups"].entries) == {"index.md"}


def test_at_most_max_tables_classes_the_least_recently_used_dropped_first() -> None:
    tables = PrunedTables(prune, max_tables=2)
    site = tree(SITE)
    anonymous, billing, admin = Principal.anonymous(), Principal.of(["billing"]), Principal.of(["admin"])
    first = tables.get(site, anonymous)
    tables.get(site, billing)
    assert tables.get(site, anonymous) is first  # used again: billing is now the oldest
    tables.get(site, admin)
    assert len(tables) == 2 and tables.builds == 3
    assert tables.get(site, anonymous) is first
    tables.get(site, billing)
    assert tables.builds == 4


def test_a_tree_of_a_new_version_drops_every_table_of_the_old_one() -> None:
    built: list[tuple[str, Principal]] = []

    def build(site: SiteTree, reader: Principal) -> InodeTable:
        built.append((site.version, reader))
        return prune(site, reader)

    tables = PrunedTables(build)
    old, new = tree(SITE), tree({**SITE, "index.md": {"isPublic": True, "sha256": "e" * 64, "size": 4}})
    assert old.version != new.version
    anonymous, billing = Principal.anonymous(), Principal.of(["billing"])
    before = tables.get(old, anonymous)
    tables.get(old, billing)
    after = tables.get(new, anonymous)
    assert after is not before and tables.version == new.version and len(tables) == 1
    resolved = after.resolve("index.md")
    assert resolved is not None and resolved.entry is not None and resolved.entry.size == 4
    tables.get(new, billing)
    tables.keep_only(new)  # the version held: nothing dropped
    assert len(tables) == 2
    tables.keep_only(old)  # another version, even an earlier one: all dropped at once
    assert len(tables) == 0 and tables.version == old.version
    assert [version for version, _ in built] == [old.version, old.version, new.version, new.version]
