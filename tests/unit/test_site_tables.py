"""One site's tables pruned per reader class (in-process): keyed by what a reader may see, the
same key a shared class mount goes by, bounded, and dropped whole for a tree of a new version."""

from __future__ import annotations

import json
import random

import pytest

from chromafs_fuse import inodes
from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.inodes import InodeScope, InodeTable
from chromafs_fuse.serving.server.session_table import class_key
from chromafs_fuse.site.tables import PrunedTables, prune, whole_table
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


def random_site(seed: int) -> dict:
    """Pages in nested folders, some folders holding only hidden pages, keys spelled with a
    leading "/", files without size or sha256, blobs: what a view's table must carry."""
    rng = random.Random(seed)
    folders = [""] + [f"f{i}/" for i in range(6)] + [f"f{i}/g{j}/" for i in range(6) for j in range(3)]
    entries: dict = {}
    for n in range(rng.randint(1, 400)):
        key = f"{rng.choice(folders)}p{n}.md"
        raw: dict = {"isPublic": rng.random() < 0.5}
        if not raw["isPublic"] and rng.random() < 0.7:
            raw["groups"] = rng.sample(["a", "b", "c"], rng.randint(1, 2))
        if rng.random() < 0.8:
            raw["size"] = rng.randint(0, 5000)
        if rng.random() < 0.8:
            raw["sha256"] = f"{rng.getrandbits(256):064x}"
        if rng.random() < 0.2:
            raw["mtime"] = rng.random() * 1e9
        if rng.random() < 0.1:
            raw["chunks"] = rng.randint(1, 9)
        if rng.random() < 0.05:
            raw["blob"] = {"url": f"s3://bucket/{n}", "size": rng.randint(1, 99)}
        entries[("/" if rng.random() < 0.1 else "") + key] = raw
    return entries


def same_table(got: InodeTable, wanted: InodeTable) -> None:
    assert len(got) == len(wanted)
    assert [got.node(i) for i in range(len(got))] == [wanted.node(i) for i in range(len(wanted))]
    assert (got.file_count, got.total_bytes, got.unknown_sizes) == (
        wanted.file_count,
        wanted.total_bytes,
        wanted.unknown_sizes,
    )
    assert list(got.file_order) == list(wanted.file_order)
    for index in range(len(wanted)):
        inode = wanted.inode_at(index)
        assert got.index_of(inode) == index
        assert got.children(inode) == wanted.children(inode)
        if index:
            assert got.lookup_index(wanted.inode_at(wanted.parent_at(index)), wanted.name_at(index)) == index


@pytest.mark.parametrize("seed", range(30))
def test_a_view_pruned_from_the_whole_table_is_the_table_built_for_it(seed: int) -> None:
    """Views of a big tree are filtered from one table of the whole tree: the same nodes, numbers,
    order and lookups as the table built for the view alone, for every reader class."""
    site = tree(random_site(seed))
    whole = whole_table(site, "site.1234")
    for reader in [*READERS.values(), Principal.of(["a", "c"])]:
        scope = InodeScope(site="site.1234", view=f"site.1234\0{sorted(reader.groups)}")
        wanted = InodeTable(visible_entries(site.entries, reader), scope)
        same_table(prune(site, reader, scope, whole), wanted)
        same_table(prune(site, reader, scope), wanted)


def test_a_view_is_built_when_the_whole_table_rehashed_a_number() -> None:
    """A collision in the whole table rehashed a file's number there: the view is built, not
    filtered, so that its numbers stay those a build gives (a collision in one need not be one in
    the other)."""
    site = tree(random_site(1))
    whole = whole_table(site, "s")
    file_index = next(i for i in range(1, len(whole)) if not whole.is_dir_at(i))
    whole._inode[file_index] = 12345  # as if rehashed for a collision
    whole.salted = True
    scope = InodeScope(site="s", view="v")
    reader = Principal.of(["a", "b", "c"])
    same_table(prune(site, reader, scope, whole), InodeTable(visible_entries(site.entries, reader), scope))


def test_numbers_that_collide_are_rehashed_the_same_way_in_a_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a hash of 6 bits every table rehashes: the whole table says so, and every view is
    the table built for it."""
    real = inodes._inode_for
    monkeypatch.setattr(inodes, "_inode_for", lambda identity, salt: 2 + real(identity, salt) % 64 + 64 * salt)
    site = tree(random_site(3))
    whole = whole_table(site, "s")
    assert whole.salted
    for reader in READERS.values():
        scope = InodeScope(site="s", view=f"v{sorted(reader.groups)}")
        same_table(prune(site, reader, scope, whole), InodeTable(visible_entries(site.entries, reader), scope))
