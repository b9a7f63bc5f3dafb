"""Many reader classes of many sites in one inode space (pure, no mount)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.inodes import ROOT_INODE, InodeScope, InodeTable
from chromafs_fuse.serving_views import InodeClash, ServingNamespace, scope_for, site_dir_name, view_name
from chromafs_fuse.tree import PathEntry


def page(key: str, body: str, groups: tuple[str, ...] = (), public: bool = True) -> PathEntry:
    data = body.encode()
    return PathEntry(key, key, public, frozenset(groups), len(data), hashlib.sha256(data).hexdigest(), 1.0)


SITE = {
    e.key: e
    for e in [
        page("index.md", "home"),
        page("guides/start.md", "start"),
        page("guides/admin.md", "admin only", ("admin",), public=False),
        page("internal/secret.md", "secret", ("admin",), public=False),
    ]
}
ANON = Principal.anonymous()
ADMIN = Principal.of(["admin"])


@dataclass
class View:
    table: InodeTable


def view_of(site: str, principal: Principal, entries: dict[str, PathEntry] = SITE) -> tuple[str, View]:
    name = view_name(site, repr(principal.reader_class()))
    return name, View(InodeTable(visible_entries(entries, principal), scope_for(site, name)))


def inode(view: View, path: str) -> int:
    node = view.table.resolve(path)
    assert node is not None, path
    return node.inode


def test_a_page_has_one_inode_in_every_view_of_its_site_and_directories_have_their_own() -> None:
    _, anon = view_of("docs", ANON)
    _, admin = view_of("docs", ADMIN)
    assert inode(anon, "index.md") == inode(admin, "index.md")
    assert inode(anon, "guides/start.md") == inode(admin, "guides/start.md")
    assert inode(anon, "guides") != inode(admin, "guides")  # listings differ: one inode each
    assert ROOT_INODE not in (inode(anon, ""), inode(admin, ""))
    assert anon.table.resolve("internal") is None and anon.table.resolve("guides/admin.md") is None


def test_another_site_with_the_same_page_gets_other_inodes() -> None:
    _, docs = view_of("docs", ANON)
    _, copy = view_of("copy", ANON)
    assert inode(docs, "index.md") != inode(copy, "index.md")  # mtimes may differ between sites


def test_a_views_inode_numbers_do_not_depend_on_hidden_pages() -> None:
    more = {**SITE, "internal/more.md": page("internal/more.md", "x", ("admin",), public=False)}
    _, anon = view_of("docs", ANON)
    _, anon_more = view_of("docs", ANON, more)
    inodes = [anon.table.inode_at(i) for i in range(len(anon.table))]
    assert inodes == [anon_more.table.inode_at(i) for i in range(len(anon_more.table))]


def test_the_default_scope_numbers_a_mount_of_its_own_as_before() -> None:
    table = InodeTable(SITE)
    assert table.inode_at(0) == ROOT_INODE
    assert InodeTable(SITE, InodeScope()).inode_at(3) == table.inode_at(3)
    assert InodeTable(SITE, scope_for("docs", "v")).inode_at(3) != table.inode_at(3)


def test_routes_follow_views_joining_and_leaving() -> None:
    space: ServingNamespace[View] = ServingNamespace()
    anon_name, anon = view_of("docs", ANON)
    admin_name, admin = view_of("docs", ADMIN)
    space.add("docs", anon_name, anon)
    space.add("docs", admin_name, admin)
    shared = inode(anon, "index.md")
    assert space.route(shared) in (anon, admin)
    assert space.route(inode(admin, "internal/secret.md")) is admin
    assert space.route(inode(anon, "guides")) is anon and space.route(inode(admin, "guides")) is admin
    space.remove("docs", anon_name)
    assert space.route(shared) is admin and space.route(inode(anon, "guides")) is None
    space.remove("docs", admin_name)
    assert space.route(shared) is None and space.views() == []
    assert space.top_children(ROOT_INODE) == []


def test_the_top_two_levels_list_sites_and_their_views() -> None:
    space: ServingNamespace[View] = ServingNamespace()
    anon_name, anon = view_of("docs", ANON)
    space.add("docs", anon_name, anon)
    odd = "team docs/v2"
    odd_name, odd_view = view_of(odd, ANON)
    space.add(odd, odd_name, odd_view)
    names = [name for name, _ in space.top_children(ROOT_INODE)]
    assert names == sorted([b"docs", site_dir_name(odd).encode()]) and b"/" not in b"".join(names)
    site_inode = space.top_lookup(ROOT_INODE, b"docs")
    assert site_inode is not None and space.is_top(site_inode)
    assert space.top_children(site_inode) == [(anon_name.encode(), inode(anon, ""))]
    assert space.top_lookup(site_inode, anon_name.encode()) == inode(anon, "")
    assert space.top_lookup(site_inode, b"nope") is None and space.top_lookup(ROOT_INODE, b"\xff") is None


def test_a_replaced_view_keeps_old_versions_it_still_serves() -> None:
    space: ServingNamespace[View] = ServingNamespace()
    name, before = view_of("docs", ANON)
    space.add("docs", name, before)
    old = inode(before, "index.md")
    changed = {**SITE, "index.md": page("index.md", "home, edited")}
    _, after = view_of("docs", ANON, changed)
    space.add("docs", name, after, extra_inodes=[old])
    assert space.route(old) is after and space.route(inode(after, "index.md")) is after
    space.add("docs", name, view_of("docs", ANON, changed)[1])  # the old version closed
    assert space.route(old) is None


def test_a_view_whose_inodes_clash_with_another_is_refused() -> None:
    space: ServingNamespace[View] = ServingNamespace()
    name, anon = view_of("docs", ANON)
    space.add("docs", name, anon)
    impostor = View(InodeTable(SITE, InodeScope(site="other", view=f"docs\0{name}")))  # same directories
    with pytest.raises(InodeClash):
        space.add("other", "x", impostor)
    assert space.route(inode(anon, "guides")) is anon and space.view("other", "x") is None
