"""Filesystem semantics in-process, without a mount: DocsFilesystem and the pyfuse3 adapter
against a fake page source. The same rules are checked through real mounts elsewhere; here
every errno and every corner is cheap to reach."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import pyfuse3
import pytest
import trio

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.filesystem import DocsFilesystem, PageUnavailable
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.serving.fuse_adapter import FuseAdapter
from chromafs_fuse.tree import PathEntry, parse_tree

PAGES = {
    "index.md": b"# Home\n",
    "guides/intro.md": b"# Intro\nhello\n",
    "guides/secret.md": b"# Secret\n",
    "guides/deep/nested.md": b"nested\n",
}
TREE = {
    "index.md": {"isPublic": True, "size": 7},
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


def build(principal: Principal, no_open: bool = False, sized: bool = False) -> tuple[FuseAdapter, FakePages]:
    tree = dict(TREE)
    if sized:
        tree["guides/deep/nested.md"] = {"isPublic": True, "size": 7}
    table = InodeTable(visible_entries(parse_tree(json.dumps(tree)).entries, principal))
    pages = FakePages()
    fs = DocsFilesystem(table, pages, ReadScheduler(table, pages, 32), no_open=no_open)
    return FuseAdapter(fs, cache_timeout_s=60), pages


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


def test_no_open_mode_answers_enosys_once_every_size_is_known() -> None:
    unsized, _ = build(Principal.anonymous(), no_open=True)
    assert not unsized.no_open  # a size unknown: the kernel must not keep pages across opens
    ops, _ = build(Principal.anonymous(), no_open=True, sized=True)
    assert ops.no_open
    assert errno_of(ops.open, inode(ops, "index.md"), os.O_RDONLY, None) == errno.ENOSYS
    assert errno_of(ops.opendir, inode(ops, "guides"), None) == errno.ENOSYS


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
    ops.fs.index = broken  # type: ignore[method-assign]
    ops.fs.children = broken  # type: ignore[method-assign]
    assert errno_of(ops.lookup, ROOT_INODE, b"index.md", None) == errno.EIO
    assert errno_of(ops.getattr, intro, None) == errno.EIO
    assert errno_of(ops.readdir, ROOT_INODE, 0, None) == errno.EIO
    assert ops.requests["lookup"] >= 1 and ops.latency["readdir"].total_s > 0


def test_statfs_counts_the_visible_tree_only() -> None:
    anonymous, _ = build(Principal.anonymous())
    staff, _ = build(Principal.of(["staff"]))
    assert call(staff.statfs, None).f_files == call(anonymous.statfs, None).f_files + 1
    assert call(anonymous.statfs, None).f_bfree == 0
