"""Filesystem semantics in-process, without a mount: DocsFilesystem and the pyfuse3 adapter
against a fake page source (the adapter over a mount of its own's ServingFilesystem, as
chromafs-mount --no-mountd serves it). The same rules are checked through real mounts elsewhere; here
every errno and every corner is cheap to reach: attributes, old versions after a re-ingest,
and the --search-dir directory included."""

from __future__ import annotations

import errno
import inspect
import json
import os
from typing import Any

import pyfuse3
import pytest
import trio

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.attributes import DAEMON_OWNER, DIR_MODE, FILE_MODE, AttributeMaker, Attributes, keep_record
from chromafs_fuse.errors import FsError
from chromafs_fuse.filesystem import DocsFilesystem, PageUnavailable
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.search_dir import SEARCH_INODE, SearchDir
from chromafs_fuse.serving.fuse_adapter import FuseAdapter, attribute_maker, entry_attributes, table_attributes
from chromafs_fuse.serving_filesystem import ServingFilesystem
from chromafs_fuse.tree import PathEntry, parse_tree
from chromafs_fuse.tree_diff import diff_tables

PAGES = {
    "index.md": b"# Home\n",
    "guides/intro.md": b"# Intro\nhello\n",
    "guides/secret.md": b"# Secret\n",
    "guides/deep/nested.md": b"nested\n",
}
MTIME = 1_700_000_000.5
MOUNT_TIME_NS = 1_600_000_000_000_000_000
TREE = {
    "index.md": {"isPublic": True, "size": 7, "mtime": MTIME},
    "guides/intro.md": {"isPublic": True, "size": 14},
    "guides/secret.md": {"isPublic": False, "groups": ["staff"], "size": 9},
    "guides/deep/nested.md": {"isPublic": True},  # no size: learned by reading
}


class FakePages:
    def __init__(self) -> None:
        self.failing: dict[str, Exception] = {}
        self.learned: dict[str, int] = {}
        self.reads: list[tuple[str, int, int]] = []

    async def read(self, entry: PathEntry, offset: int, size: int) -> bytes:
        self.reads.append((entry.key, offset, size))
        if entry.key in self.failing:
            raise self.failing[entry.key]
        data = PAGES[entry.key]
        self.learned[entry.key] = len(data)
        return data[offset : offset + size]

    def size_of(self, entry: PathEntry) -> int | None:
        return entry.size if entry.size is not None else self.learned.get(entry.key)

    # what the scheduler needs: nothing is ever in memory, batches never start
    def is_cached(self, entry: PathEntry) -> bool:
        return False

    def is_cached_or_loading(self, page_key: str, sha256: str | None) -> bool:
        return False

    def start_batch(self, entries: Any, on_done: Any) -> bool:
        return False

    def peek(self, page_key: str, sha256: str | None) -> bytes | None:
        return None

    def release(self, page_key: str, sha256: str | None) -> None:
        pass


def table_of(tree: dict[str, Any], principal: Principal) -> InodeTable:
    return InodeTable(visible_entries(parse_tree(json.dumps(tree)).entries, principal))


def build(principal: Principal, no_open: bool = False, sized: bool = False) -> tuple[FuseAdapter, FakePages]:
    tree = dict(TREE)
    if sized:
        tree["guides/deep/nested.md"] = {"isPublic": True, "size": 7}
    table = table_of(tree, principal)
    pages = FakePages()
    fs = DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), no_open, attribute_maker(60, MOUNT_TIME_NS))
    served = ServingFilesystem(entry_attributes, MOUNT_TIME_NS, no_open, own_mount=True)
    served.add("docs", "root", fs)
    return FuseAdapter(served), pages


def core(
    table: InodeTable,
    pages: FakePages | None = None,
    search_dir: SearchDir | None = None,
    replaced: dict[int, PathEntry] | None = None,
    no_open: bool = False,
) -> DocsFilesystem[Attributes]:
    """The filesystem alone, answering with plain attribute records."""
    pages = pages or FakePages()
    maker = AttributeMaker(60, MOUNT_TIME_NS, keep_record)
    return DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), no_open, maker, replaced, search_dir)


def call(fn: Any, *args: Any) -> Any:
    async def run() -> Any:
        return await fn(*args)

    return trio.run(run)


def errno_of(fn: Any, *args: Any) -> int:
    with pytest.raises(pyfuse3.FUSEError) as info:
        call(fn, *args)
    return info.value.errno


def inode(ops: FuseAdapter, path: str) -> int:
    parent = ROOT_INODE
    for part in path.split("/"):
        attrs = call(ops.lookup, parent, part.encode(), None)
        assert attrs.st_ino, f"{part} of {path} not found"
        parent = attrs.st_ino
    return parent


def listing(ops: FuseAdapter, ino: int) -> list[bytes]:
    names: list[bytes] = []
    original = pyfuse3.readdir_reply
    try:
        pyfuse3.readdir_reply = lambda token, name, attrs, next_id: names.append(name) or True  # type: ignore[assignment]
        call(ops.readdir, ino, 0, None)
    finally:
        pyfuse3.readdir_reply = original
    return names


def test_a_hidden_page_answers_exactly_like_a_missing_one() -> None:
    anonymous, _ = build(Principal.anonymous())
    guides = inode(anonymous, "guides")
    hidden = call(anonymous.lookup, guides, b"secret.md", None)
    missing = call(anonymous.lookup, guides, b"no-such.md", None)
    assert hidden.st_ino == missing.st_ino == 0 and hidden.entry_timeout == missing.entry_timeout
    assert listing(anonymous, guides) == [b"deep", b"intro.md"]
    staff, _ = build(Principal.of(["staff"]))
    assert listing(staff, inode(staff, "guides")) == [b"deep", b"intro.md", b"secret.md"]
    secret = inode(staff, "guides/secret.md")  # a valid inode for staff means nothing to anonymous
    assert errno_of(anonymous.getattr, secret, None) == errno.ENOENT
    assert errno_of(anonymous.read, secret, 0, 100) == errno.ENOENT
    assert errno_of(anonymous.open, secret, os.O_RDONLY, None) == errno.ENOENT


def test_read_returns_the_page_bytes_and_stat_its_size() -> None:
    ops, _ = build(Principal.anonymous())
    intro = inode(ops, "guides/intro.md")
    assert call(ops.getattr, intro, None).st_size == len(PAGES["guides/intro.md"])
    assert call(ops.read, intro, 0, 4096) == PAGES["guides/intro.md"]
    assert call(ops.read, intro, 8, 3) == b"hel"
    assert call(ops.read, intro, 100, 10) == b""


def test_a_file_without_a_size_shows_zero_uncached_until_read_then_its_size() -> None:
    ops, _ = build(Principal.anonymous())
    nested = inode(ops, "guides/deep/nested.md")
    before = call(ops.getattr, nested, None)
    assert before.st_size == 0 and before.attr_timeout == 0
    reply = call(ops.open, nested, os.O_RDONLY, None)
    assert reply.direct_io and not reply.keep_cache  # the kernel must not clamp reads to size 0
    assert call(ops.read, nested, 0, 4096) == PAGES["guides/deep/nested.md"]
    after = call(ops.getattr, nested, None)
    assert after.st_size == len(PAGES["guides/deep/nested.md"]) and after.attr_timeout == 60


def test_errnos_of_misuse() -> None:
    ops, _ = build(Principal.anonymous())
    guides, intro = inode(ops, "guides"), inode(ops, "guides/intro.md")
    assert errno_of(ops.opendir, intro, None) == errno.ENOTDIR
    assert errno_of(ops.open, guides, os.O_RDONLY, None) == errno.EISDIR
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_RDONLY | os.O_APPEND):
        assert errno_of(ops.open, intro, flags, None) == errno.EROFS
    assert errno_of(ops.getattr, 12345, None) == errno.ENOENT
    assert errno_of(ops.getxattr, intro, b"user.x", None) == errno.ENOSYS
    assert errno_of(ops.mkdir, guides, b"new", 0o755, None) == errno.EROFS
    assert errno_of(ops.write, intro, 0, b"x") == errno.EROFS
    assert call(ops.access, intro, os.R_OK, None) is True
    assert call(ops.access, intro, os.W_OK, None) is False


def test_no_open_mode_answers_enosys_to_open_and_opendir() -> None:
    ops, _ = build(Principal.anonymous(), no_open=True, sized=True)
    assert ops.fs.no_open
    assert errno_of(ops.open, inode(ops, "index.md"), os.O_RDONLY, None) == errno.ENOSYS
    assert errno_of(ops.opendir, inode(ops, "guides"), None) == errno.ENOSYS


def test_in_no_open_mode_getattr_reads_a_file_of_unknown_size_to_give_its_size() -> None:
    """The kernel clamps reads to the size it holds and asks getattr before reading past it:
    an unknown size is learned then, never answered as an empty file."""
    ops, pages = build(Principal.anonymous(), no_open=True)
    nested = inode(ops, "guides/deep/nested.md")
    pages.failing["guides/deep/nested.md"] = PageUnavailable("guides/deep/nested.md")
    assert errno_of(ops.getattr, nested, None) == errno.EIO  # the backend fails: stat fails
    del pages.failing["guides/deep/nested.md"]
    attributes = call(ops.getattr, nested, None)
    assert attributes.st_size == len(PAGES["guides/deep/nested.md"]) and attributes.attr_timeout == 60
    assert call(ops.read, nested, 0, 4096) == PAGES["guides/deep/nested.md"]
    reads = len(pages.reads)
    call(ops.getattr, nested, None)
    call(ops.getattr, inode(ops, "guides/intro.md"), None)  # a size the tree gives: nothing read
    assert len(pages.reads) == reads


def test_an_unavailable_page_is_eio_and_the_next_read_tries_again() -> None:
    ops, pages = build(Principal.anonymous())
    intro = inode(ops, "guides/intro.md")
    pages.failing["guides/intro.md"] = PageUnavailable("guides/intro.md")
    assert errno_of(ops.read, intro, 0, 4096) == errno.EIO
    del pages.failing["guides/intro.md"]
    assert call(ops.read, intro, 0, 4096) == PAGES["guides/intro.md"]


def test_a_bug_in_any_handler_costs_one_request_with_eio(caplog: pytest.LogCaptureFixture) -> None:
    ops, pages = build(Principal.anonymous())
    intro = inode(ops, "guides/intro.md")
    pages.failing["guides/intro.md"] = RuntimeError("a bug")
    assert errno_of(ops.read, intro, 0, 4096) == errno.EIO
    assert "a bug" in caplog.text

    def broken(*args: Any) -> Any:
        raise KeyError("another bug")

    ops.fs.lookup = broken  # type: ignore[method-assign]
    ops.fs.getattr = broken  # type: ignore[method-assign]
    ops.fs.stat = broken  # type: ignore[method-assign]
    ops.fs.listing = broken  # type: ignore[method-assign]
    assert errno_of(ops.lookup, ROOT_INODE, b"index.md", None) == errno.EIO
    assert errno_of(ops.getattr, intro, None) == errno.EIO
    assert errno_of(ops.readdir, ROOT_INODE, 0, None) == errno.EIO
    assert ops.requests["lookup"] >= 1 and ops.latency["readdir"].total_s > 0


def test_statfs_counts_the_visible_tree_only() -> None:
    anonymous, _ = build(Principal.anonymous())
    staff, _ = build(Principal.of(["staff"]))
    assert call(staff.statfs, None).f_files == call(anonymous.statfs, None).f_files + 1
    assert call(anonymous.statfs, None).f_bfree == 0


# -- attributes -------------------------------------------------------------------------


def fs_errno(fn: Any, *args: Any) -> int:
    """The errno a filesystem call, plain or async, fails with."""

    async def run() -> None:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result

    with pytest.raises(FsError) as info:
        trio.run(run)
    return info.value.errno


def test_attributes_give_modes_links_sizes_owner_and_times() -> None:
    fs = core(table_of(TREE, Principal.anonymous()))
    root = fs.getattr(ROOT_INODE)
    assert (root.mode, root.nlink, root.size, root.time_ns) == (DIR_MODE, 3, 0, MOUNT_TIME_NS)  # ., .., guides
    guides = call(fs.lookup, ROOT_INODE, b"guides")
    assert (guides.mode, guides.nlink) == (DIR_MODE, 3)  # guides/deep
    index = call(fs.lookup, ROOT_INODE, b"index.md")
    assert (index.mode, index.nlink, index.size, index.blocks) == (FILE_MODE, 1, 7, 1)
    assert index.time_ns == int(MTIME * 1e9)  # the tree's mtime; the mount's time without one
    assert call(fs.lookup, guides.inode, b"intro.md").time_ns == MOUNT_TIME_NS
    assert (index.uid, index.gid) == DAEMON_OWNER
    assert index.entry_timeout == index.attr_timeout == 60 and index.block_size == 4096
    assert fs.getattr(index.inode) is index  # built once per node
    absent = call(fs.lookup, ROOT_INODE, b"nothing.md")
    assert absent.inode == 0 and absent.entry_timeout == 60


def test_a_size_learned_by_reading_makes_the_attributes_final() -> None:
    fs = core(table_of(TREE, Principal.anonymous()))
    deep = call(fs.lookup, call(fs.lookup, ROOT_INODE, b"guides").inode, b"deep")
    nested = call(fs.lookup, deep.inode, b"nested.md")
    assert (nested.size, nested.attr_timeout, nested.entry_timeout) == (0, 0, 60)
    assert fs.getattr(nested.inode) is not nested  # not kept: built again until the size is known
    call(fs.read, nested.inode, 0, 4096)
    after = fs.getattr(nested.inode)
    assert (after.size, after.attr_timeout) == (len(PAGES["guides/deep/nested.md"]), 60)
    assert fs.getattr(nested.inode) is after
    [(name, listed, _)] = list(fs.listing(deep.inode, 0))
    assert name == b"nested.md" and listed is after


def test_attributes_built_ahead_are_the_ones_answered() -> None:
    table = table_of(TREE, Principal.anonymous())
    built = table_attributes(table, MOUNT_TIME_NS, 60)
    assert [a is None for a in built] == [
        table.size_at(i) is None and not table.is_dir_at(i) for i in range(len(table))
    ]
    pages = FakePages()
    maker = attribute_maker(60, MOUNT_TIME_NS)
    fs = DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), False, maker, built=built)
    ops = FuseAdapter(fs)
    index = inode(ops, "index.md")
    assert call(ops.getattr, index, None) is built[table.index_of(index)]
    # the adapter's pyfuse3 attributes say what the records say
    record = core(table).getattr(index)
    attrs = call(ops.getattr, index, None)
    assert (attrs.st_ino, attrs.st_mode, attrs.st_nlink, attrs.st_size, attrs.st_blocks) == (
        record.inode,
        record.mode,
        record.nlink,
        record.size,
        record.blocks,
    )
    assert attrs.st_mtime_ns == attrs.st_atime_ns == attrs.st_ctime_ns == record.time_ns
    assert (attrs.st_uid, attrs.st_gid, attrs.attr_timeout) == (*DAEMON_OWNER, 60)
    assert entry_attributes(record).st_ino == index


def test_after_a_reingest_a_held_old_version_keeps_its_attributes_until_forgotten() -> None:
    sha = {"old": "a" * 64, "new": "b" * 64}
    before = dict(TREE, **{"guides/intro.md": {"isPublic": True, "size": 14, "sha256": sha["old"], "mtime": 5.0}})
    after = dict(TREE, **{"guides/intro.md": {"isPublic": True, "size": 20, "sha256": sha["new"]}})
    old_fs = core(table_of(before, Principal.anonymous()))
    guides = call(old_fs.lookup, ROOT_INODE, b"guides").inode
    old_inode = call(old_fs.lookup, guides, b"intro.md").inode
    new_table = table_of(after, Principal.anonymous())
    change = diff_tables(old_fs.table, new_table)
    replaced, dropped = old_fs.carry_replaced(change.replaced, new_table)
    new_fs = core(new_table, replaced=replaced)
    assert old_inode in replaced and not dropped
    held = new_fs.getattr(old_inode)
    assert (held.inode, held.mode, held.nlink, held.size) == (old_inode, FILE_MODE, 1, 14)
    assert held.time_ns == 5_000_000_000 and held.attr_timeout == 0
    current = call(new_fs.lookup, guides, b"intro.md")
    assert current.inode != old_inode and current.size == 20
    assert call(new_fs.read, old_inode, 0, 4096) == PAGES["guides/intro.md"]
    assert new_fs.may_access(old_inode, os.R_OK)
    new_fs.forget([old_inode])
    assert fs_errno(new_fs.getattr, old_inode) == errno.ENOENT


# -- the search directory -----------------------------------------------------------------


def searching() -> tuple[SearchDir, list[str]]:
    queries: list[str] = []

    async def search(query: str) -> bytes:
        queries.append(query)
        return f"hits for {query}\n".encode()

    return SearchDir(".search", search), queries


def test_the_search_directory_is_found_by_name_and_never_listed() -> None:
    search_dir, _ = searching()
    fs = core(table_of(TREE, Principal.anonymous()), search_dir=search_dir)
    directory = call(fs.lookup, ROOT_INODE, b".search")
    assert (directory.inode, directory.mode, directory.nlink, directory.size) == (SEARCH_INODE, DIR_MODE, 2, 0)
    assert fs.getattr(SEARCH_INODE) == directory
    assert b".search" not in [name for name, _, _ in fs.listing(ROOT_INODE, 0)]
    assert list(fs.listing(SEARCH_INODE, 0)) == []
    assert fs.open_dir(SEARCH_INODE) is None
    assert call(fs.lookup, call(fs.lookup, ROOT_INODE, b"guides").inode, b".search").inode == 0  # the root's only
    assert fs_errno(fs.open_file, SEARCH_INODE, os.O_RDONLY) == errno.EISDIR
    without = core(table_of(TREE, Principal.anonymous()))
    assert call(without.lookup, ROOT_INODE, b".search").inode == 0
    assert fs_errno(without.getattr, SEARCH_INODE) == errno.ENOENT
    assert fs_errno(without.open_dir, SEARCH_INODE) == errno.ENOENT


def test_each_lookup_of_a_query_searches_again_into_a_new_uncached_file() -> None:
    search_dir, queries = searching()
    fs = core(table_of(TREE, Principal.anonymous()), search_dir=search_dir)
    first = call(fs.lookup, SEARCH_INODE, b"how to start")
    again = call(fs.lookup, SEARCH_INODE, b"how to start")
    assert queries == ["how to start", "how to start"] and first.inode != again.inode
    answer = b"hits for how to start\n"
    assert (first.mode, first.nlink, first.size) == (FILE_MODE, 1, len(answer))
    assert first.entry_timeout == first.attr_timeout == 0
    assert SearchDir.owns(first.inode) and fs.getattr(first.inode) == first
    reply = fs.open_file(first.inode, os.O_RDONLY)
    assert not reply.keep_cache and not reply.direct_io
    assert fs_errno(fs.open_file, first.inode, os.O_WRONLY) == errno.EROFS
    assert call(fs.read, first.inode, 0, 4096) == answer
    assert call(fs.read, first.inode, 5, 3) == answer[5:8]
    assert fs.may_access(first.inode, os.R_OK) and not fs.may_access(first.inode, os.W_OK)
    fs.forget([first.inode])
    assert fs_errno(fs.getattr, first.inode) == errno.ENOENT
    assert fs_errno(fs.read, first.inode, 0, 4096) == errno.ENOENT
    assert call(fs.read, again.inode, 0, 4096) == answer


def test_in_no_open_mode_the_search_directory_answers_enosys_like_the_tree() -> None:
    search_dir, _ = searching()
    sized = dict(TREE, **{"guides/deep/nested.md": {"isPublic": True, "size": 7}})
    fs = core(table_of(sized, Principal.anonymous()), search_dir=search_dir, no_open=True)
    assert fs.no_open
    assert fs_errno(fs.open_dir, SEARCH_INODE) == errno.ENOSYS
    result = call(fs.lookup, SEARCH_INODE, b"q").inode
    assert fs_errno(fs.open_file, result, os.O_RDONLY) == errno.ENOSYS
