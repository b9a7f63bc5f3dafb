"""The serving mount's filesystem in-process (issue 30): many views answering as one mount, against
a fake page source. Real mounts of it are in test_shared_mount.py."""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any

import pytest
import trio
from test_filesystem import PAGES, TREE, FakePages

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.attributes import DIR_MODE, FILE_MODE, AttributeMaker, Attributes, keep_record
from chromafs_fuse.errors import FsError
from chromafs_fuse.filesystem import DocsFilesystem
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.search_dir import SEARCH_INODE, SearchDir
from chromafs_fuse.serving_filesystem import SHARED_STATS, ServingFilesystem
from chromafs_fuse.serving_views import scope_for, view_name
from chromafs_fuse.sessions import SessionSpace
from chromafs_fuse.tree import parse_tree
from chromafs_fuse.tree_diff import diff_tables

ANON = Principal.anonymous()
STAFF = Principal.of(["staff"])
MAKER = AttributeMaker(60, 1_600_000_000_000_000_000, keep_record)  # one per site


def view_fs(site: str, reader: Principal, tree: dict[str, Any] = TREE) -> tuple[str, DocsFilesystem[Attributes]]:
    name = view_name(site, repr(reader.reader_class()))
    entries = visible_entries(parse_tree(json.dumps(tree)).entries, reader)
    table = InodeTable(entries, scope_for(site, name))
    pages = FakePages()
    return name, DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), False, MAKER)


def shared(*views: tuple[str, Principal]) -> tuple[ServingFilesystem[Attributes], dict[str, str]]:
    fs: ServingFilesystem[Attributes] = ServingFilesystem(keep_record, 1)
    names = {}
    for site, reader in views:
        name, view = view_fs(site, reader)
        fs.add(site, name, view)
        names[f"{site}:{reader.describe()}"] = name
    return fs, names


def call(fn: Any, *args: Any) -> Any:
    async def run() -> Any:
        return await fn(*args)

    return trio.run(run)


def resolve(fs: ServingFilesystem[Attributes], path: str) -> Attributes:
    attributes = fs.getattr(ROOT_INODE)
    for part in path.split("/"):
        attributes = call(fs.lookup, attributes.inode, part.encode())
        if attributes.inode == 0:
            raise FsError(errno.ENOENT)
    return attributes


def test_the_top_levels_list_sites_and_views_and_are_never_timed() -> None:
    fs, names = shared(("docs", ANON), ("docs", STAFF), ("other", ANON))
    root = fs.getattr(ROOT_INODE)
    assert root.mode == DIR_MODE and root.nlink == 4 and root.entry_timeout == 0
    assert [name for name, _, _ in fs.listing(ROOT_INODE, 0)] == [b"docs", b"other"]
    docs = resolve(fs, "docs")
    listed = {name.decode(): attrs for name, attrs, _ in fs.listing(docs.inode, 0)}
    assert set(listed) == {names["docs:anonymous"], names["docs:user=? groups=staff"]}
    assert all(a.mode == DIR_MODE and a.entry_timeout == 0 for a in listed.values())
    # a view root's attributes are timed as its own getattr times them: a walk from a session's
    # root asks nothing, though the root's name under its site is never cached
    for name, attrs in listed.items():
        assert attrs.attr_timeout == fs.getattr(attrs.inode).attr_timeout > 0
        assert call(fs.lookup, docs.inode, name.encode()).attr_timeout > 0
    absent = call(fs.lookup, docs.inode, b"nope")
    assert absent.inode == 0 and absent.entry_timeout == 0  # a view may come under that name
    with pytest.raises(FsError) as info:
        fs.open_file(docs.inode, os.O_RDONLY)
    assert info.value.errno == errno.EISDIR
    assert fs.stats() == SHARED_STATS and not fs.may_access(ROOT_INODE, os.W_OK)


def test_the_top_levels_mtime_moves_as_views_come_and_go() -> None:
    """In no-open mode the kernel caches listings, the top ones too: it lists again when the
    directory's mtime moved. Opening a top directory answers ENOSYS, as a view's would."""
    fs, _ = shared(("docs", ANON))
    fs.no_open = True
    with pytest.raises(FsError) as info:
        fs.open_dir(ROOT_INODE)
    assert info.value.errno == errno.ENOSYS
    times = [fs.getattr(ROOT_INODE).time_ns]
    name, view = view_fs("docs", STAFF)
    fs.add("docs", name, view)
    times.append(fs.getattr(ROOT_INODE).time_ns)
    fs.add("docs", name, view)  # a view switched to a new tree: no listing changed
    times.append(resolve(fs, "docs").time_ns)
    fs.remove("docs", name)
    times.append(resolve(fs, "docs").time_ns)
    assert times[0] < times[1] == times[2] < times[3]


def test_a_page_of_two_views_is_one_inode_and_hidden_pages_are_missing() -> None:
    fs, names = shared(("docs", ANON), ("docs", STAFF))
    anon, staff = f"docs/{names['docs:anonymous']}", f"docs/{names['docs:user=? groups=staff']}"
    intro_anon, intro_staff = resolve(fs, f"{anon}/guides/intro.md"), resolve(fs, f"{staff}/guides/intro.md")
    assert intro_anon == intro_staff and intro_anon.mode == FILE_MODE and intro_anon.nlink == 1
    assert resolve(fs, f"{anon}/guides") != resolve(fs, f"{staff}/guides")  # directories: one each
    assert call(fs.read, intro_anon.inode, 0, 100) == PAGES["guides/intro.md"]
    assert resolve(fs, f"{staff}/guides/secret.md").size == 9
    guides = resolve(fs, f"{anon}/guides")
    assert call(fs.lookup, guides.inode, b"secret.md") == call(fs.lookup, guides.inode, b"missing.md")
    assert [n for n, _, _ in fs.listing(guides.inode, 0)] == [b"deep", b"intro.md"]


def test_nothing_a_view_shows_depends_on_the_others() -> None:
    alone, names = shared(("docs", ANON))
    crowded, _ = shared(("docs", ANON), ("docs", STAFF), ("other", ANON), ("other", STAFF))
    view = f"docs/{names['docs:anonymous']}"

    def seen(fs: ServingFilesystem[Attributes]) -> list[object]:
        root = resolve(fs, view)
        out: list[object] = [fs.getattr(root.inode), fs.stats()]
        for directory in [root.inode, resolve(fs, f"{view}/guides").inode]:
            out += [(n, a) for n, a, _ in fs.listing(directory, 0)]
        return out

    assert seen(alone) == seen(crowded)


def test_a_view_that_goes_leaves_the_pages_others_show() -> None:
    fs, names = shared(("docs", ANON), ("docs", STAFF))
    anon = f"docs/{names['docs:anonymous']}"
    page, guides = resolve(fs, f"{anon}/index.md"), resolve(fs, f"{anon}/guides")
    fs.remove("docs", names["docs:anonymous"])
    assert call(fs.read, page.inode, 0, 100) == PAGES["index.md"]  # the staff view shows it too
    with pytest.raises(FsError) as info:
        fs.getattr(guides.inode)
    assert info.value.errno == errno.ENOENT
    assert [n for n, _, _ in fs.listing(resolve(fs, "docs").inode, 0)] == [names["docs:user=? groups=staff"].encode()]


def test_an_old_version_held_by_two_views_is_forgotten_by_both() -> None:
    fs, names = shared(("docs", ANON), ("docs", STAFF))
    changed = {**TREE, "index.md": {"isPublic": True, "size": 7, "sha256": "ab" * 32}}
    old_inode = resolve(fs, f"docs/{names['docs:anonymous']}/index.md").inode
    for name in names.values():
        view = fs.view("docs", name)
        assert view is not None
        old = view.fs
        reader = ANON if name == names["docs:anonymous"] else STAFF
        _, new = view_fs("docs", reader, changed)
        change = diff_tables(old.table, new.table)
        new.replaced, _ = old.carry_replaced(change.replaced, new.table)
        fs.add("docs", name, new, extra_inodes=new.replaced)
    assert old_inode in fs.namespace.route(old_inode).fs.replaced  # type: ignore[union-attr]
    assert call(fs.read, old_inode, 0, 100) == PAGES["index.md"]
    fs.forget([old_inode])
    assert all(old_inode not in entry.fs.replaced for _, _, entry in fs.namespace.views())
    with pytest.raises(FsError):
        fs.getattr(old_inode)


# -- sessions (issue 45): each its own directories, owner and expiry; files the class's --------


def session_root(fs: ServingFilesystem[Attributes], slot: int) -> Attributes:
    sessions = call(fs.lookup, ROOT_INODE, b".sessions")
    return call(fs.lookup, sessions.inode, str(slot).encode())


def walk(fs: ServingFilesystem[Attributes], start: Attributes, path: str) -> Attributes:
    attributes = start
    for part in path.split("/"):
        attributes = call(fs.lookup, attributes.inode, part.encode())
    return attributes


def test_a_session_has_its_own_directories_and_owner_and_shares_the_class_files() -> None:
    fs, names = shared(("docs", ANON))
    name = names["docs:anonymous"]
    mine = fs.open_session("docs", name, 1000, 1000, None, allow_other=False)
    theirs = fs.open_session("docs", name, 0, 0, None, allow_other=True)
    root, other_root = session_root(fs, mine.slot), session_root(fs, theirs.slot)
    assert root.inode != other_root.inode and root.inode >= 1 << 63
    assert (root.mode & 0o777, root.uid, root.gid) == (0o500, 1000, 1000)  # the kernel refuses others
    assert (other_root.mode & 0o777, other_root.uid) == (0o555, 0)
    guides, other_guides = walk(fs, root, "guides"), walk(fs, other_root, "guides")
    assert guides.inode != other_guides.inode and guides.mode & 0o777 == 0o500
    page, class_page = walk(fs, root, "guides/intro.md"), resolve(fs, f"docs/{name}/guides/intro.md")
    assert page.inode == walk(fs, other_root, "guides/intro.md").inode == class_page.inode
    listed = {entry_name: attributes for entry_name, attributes, _ in fs.listing(root.inode, 0)}
    assert listed[b"guides"].inode == guides.inode and listed[b"index.md"].inode == walk(fs, root, "index.md").inode
    assert walk(fs, guides, "..").inode == root.inode
    assert walk(fs, root, "guides/secret.md").inode == 0  # hidden: as missing


def test_an_ended_or_expired_session_refuses_every_directory_request_and_others_go_on() -> None:
    fs, names = shared(("docs", ANON))
    name = names["docs:anonymous"]
    now = time.time()
    short = fs.open_session("docs", name, 0, 0, now + 3600, False)
    ended = fs.open_session("docs", name, 0, 0, None, False)
    kept = fs.open_session("docs", name, 0, 0, None, False)
    short_guides = walk(fs, session_root(fs, short.slot), "guides")
    ended_guides = walk(fs, session_root(fs, ended.slot), "guides")
    fs.sessions.end(ended.slot)
    fs.sessions.sessions[short.slot].expires_at = now - 1  # its exp passed (requests check the clock)
    for guides in (short_guides, ended_guides):
        for request in (
            lambda inode: fs.getattr(inode),
            lambda inode: call(fs.stat, inode),
            lambda inode: call(fs.lookup, inode, b"intro.md"),
            lambda inode: list(fs.listing(inode, 0)),
            lambda inode: fs.open_dir(inode),
            lambda inode: fs.may_access(inode, os.R_OK),
        ):
            with pytest.raises(FsError) as refused:
                request(guides.inode)
            assert refused.value.errno == errno.EACCES
    with pytest.raises(FsError) as refused:
        session_root(fs, ended.slot)
    assert refused.value.errno == errno.EACCES
    with pytest.raises(FsError) as missing:
        session_root(fs, 999)  # a slot never given
    assert missing.value.errno == errno.ENOENT
    assert walk(fs, session_root(fs, kept.slot), "guides/intro.md").inode > 0
    assert short_guides.inode in fs.session_inodes(short)  # what the kernel is told to forget


def test_sessions_expire_in_order_and_a_slot_is_never_given_twice() -> None:
    space = SessionSpace()
    late = space.open("docs", "v", 0, 0, 200.0)
    early = space.open("docs", "v", 0, 0, 100.0)
    forever = space.open("docs", "v", 0, 0, None)
    assert space.next_expiry() == 100.0
    assert space.expire(150.0) == [early] and space.next_expiry() == 200.0
    assert space.expire(250.0) == [late] and space.next_expiry() is None
    space.end(forever.slot)
    assert len({late.slot, early.slot, forever.slot, space.open("docs", "v", 0, 0, None).slot}) == 4
    with pytest.raises(FsError) as refused:
        space.live(early.slot, 0.0)
    assert refused.value.errno == errno.EACCES
    with pytest.raises(FsError) as missing:
        space.live(10**6, 0.0)
    assert missing.value.errno == errno.ENOENT


def test_a_renewed_session_lives_until_its_new_expiry_not_its_first() -> None:
    """kubelet's republish with a later token: the deadline left in the heap from the first
    token ends nothing; the new one does."""
    space = SessionSpace()
    renewed = space.open("docs", "v", 0, 0, 100.0)
    other = space.open("docs", "v", 0, 0, 150.0)
    space.set_expiry(renewed, 300.0)
    assert space.expire(200.0) == [other]
    assert renewed.alive(200.0) and space.live(renewed.slot, 200.0) is renewed
    space.set_expiry(renewed, 400.0)
    assert space.next_expiry() == 400.0
    assert space.expire(350.0) == [] and space.expire(400.0) == [renewed] and space.next_expiry() is None


def test_a_reingest_tells_the_kernel_what_each_session_must_forget() -> None:
    fs, names = shared(("docs", ANON))
    name = names["docs:anonymous"]
    session = fs.open_session("docs", name, 0, 0, None, False)
    root = session_root(fs, session.slot)
    guides = walk(fs, root, "guides")
    old = fs.view("docs", name)
    assert old is not None
    tree = {**TREE, "guides/new.md": {"isPublic": True, "size": 3}}
    _, new_fs = view_fs("docs", ANON, tree)
    change = diff_tables(old.fs.table, new_fs.table)
    fs.add("docs", name, new_fs)
    told = fs.session_change("docs", name, change)
    assert guides.inode in told.stale_inodes and (guides.inode, b"new.md") in told.stale_names
    assert walk(fs, root, "guides").inode == guides.inode  # a path keeps its inode across re-ingests
    assert walk(fs, guides, "new.md").inode > 0


# -- a mount of its own: one view at the root ------------------------------------------------


def own_mount(reader: Principal, search: SearchDir | None = None) -> ServingFilesystem[Attributes]:
    """`chromafs-mount --no-mountd`'s filesystem: one view, numbered as a mount of its own's."""
    entries = visible_entries(parse_tree(json.dumps(TREE)).entries, reader)
    table = InodeTable(entries)
    pages = FakePages()
    view = DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), False, MAKER, None, search)
    fs: ServingFilesystem[Attributes] = ServingFilesystem(keep_record, 1, own_mount=True)
    fs.add("docs", "root", view)
    return fs


def test_a_mount_of_its_own_is_its_one_view_at_the_root_numbered_as_its_own() -> None:
    async def search(query: str) -> bytes:
        return f"hits for {query}\n".encode()

    fs = own_mount(STAFF, SearchDir(".search", search))
    plain = own_mount(ANON)
    # the root is the view's: inode 1, its files and directories listed, no site, view or .sessions
    assert [name for name, _, _ in fs.listing(ROOT_INODE, 0)] == [b"guides", b"index.md"]
    assert call(fs.lookup, ROOT_INODE, b".sessions").inode == 0
    # SEMANTICS.md "Inode numbers": a mount's own numbers, the same for every reader of any mount
    intro = resolve(fs, "guides/intro.md")
    own_table = InodeTable(visible_entries(parse_tree(json.dumps(TREE)).entries, ANON))
    assert fs.getattr(ROOT_INODE).inode == ROOT_INODE
    assert intro.inode == resolve(plain, "guides/intro.md").inode == own_table.resolve("guides/intro.md").inode
    assert call(fs.read, intro.inode, 0, 100) == PAGES["guides/intro.md"]
    assert resolve(fs, "guides/secret.md").size == len(PAGES["guides/secret.md"])
    with pytest.raises(FsError):
        resolve(plain, "guides/secret.md")
    # statfs: the reader's visible files (SHARED_STATS is the serving mount's), from any inode
    assert fs.stats().files == plain.stats().files + 1 > SHARED_STATS.files
    assert fs.stats_of(intro.inode) == fs.stats()
    # the search directory's inodes carry the top bit, as a session's directories do: still the view's
    directory = call(fs.lookup, ROOT_INODE, b".search")
    assert directory.inode == SEARCH_INODE and fs.getattr(SEARCH_INODE) == directory
    answer = call(fs.lookup, SEARCH_INODE, b"intro")
    assert call(fs.read, answer.inode, 0, 100) == b"hits for intro\n"
    # a re-ingest: the view replaced in one step; the view never goes while mounted
    entries = visible_entries(parse_tree(json.dumps({"index.md": TREE["index.md"]})).entries, STAFF)
    table = InodeTable(entries)
    pages = FakePages()
    fs.add("docs", "root", DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), False, MAKER))
    assert fs.remove("docs", "root") is None
    assert [name for name, _, _ in fs.listing(ROOT_INODE, 0)] == [b"index.md"]
