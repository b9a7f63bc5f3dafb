"""A site big enough that its classes' tables are filtered from one table of the whole tree
(site/tables.WHOLE_TABLE_FILES), through chromafs-mountd: every session shows exactly its
reader's pages and folders, a page has one inode in every class, and a re-ingest that edits a
page and hides another reaches every class."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.site.tables import WHOLE_TABLE_FILES
from infra import MountServer, ingest, reader_args, tree_listing, try_mount, wait_until

PAGES = WHOLE_TABLE_FILES + 1_000
GROUPS = {0: None, 1: ["billing"], 2: ["admin"]}  # page number % 3 -> its groups (None: public)


def page_path(n: int) -> str:
    folder = "vault" if n % 3 == 2 and n % 5 == 0 else f"d{n % 40}/e{n % 7}"  # vault: admin pages only
    return f"{folder}/p{n}.md"


def page_text(n: int, groups: list[str] | None, note: str = "") -> str:
    access = "public: true" if groups is None else f"groups: [{', '.join(groups)}]"
    return f"---\n{access}\n---\n# Page {n}\n\nword{n} {note}\n"


def visible(pages: dict[int, list[str] | None], reader: set[str] | None) -> set[str]:
    """Files and their folders a reader sees (None: anonymous), from the pages as written."""
    seen = set()
    for n, groups in pages.items():
        if groups is None or (reader is not None and set(groups) & reader):
            path = page_path(n)
            seen.add(path)
            parts = path.split("/")
            seen.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return seen


def test_classes_of_a_big_tree_show_their_own_pages_share_inodes_and_follow_a_reingest(
    start_mount_server: Callable[..., MountServer],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    pages = {n: GROUPS[n % 3] for n in range(PAGES)}
    for n, groups in pages.items():
        (site / page_path(n)).parent.mkdir(parents=True, exist_ok=True)
        (site / page_path(n)).write_text(page_text(n, groups))
    chroma = tmp_path / "chroma"
    ingest(site, "--site", "big", "--chroma-path", str(chroma), "--quiet")
    server = start_mount_server()
    log = server.class_root / "serving.log"
    readers: dict[str, set[str] | None] = {"anon": None, "billing": {"billing"}, "admin": {"admin"}}
    readers["both"] = {"admin", "billing"}
    sessions = {}
    for name, groups in readers.items():
        mountpoint = tmp_path / name
        mountpoint.mkdir()
        token = None if groups is None else token_file(sorted(groups), site="big")
        args = [
            "--site",
            "big",
            "--chroma-path",
            str(chroma),
            "--mountd",
            str(server.socket),
            "--refresh-interval",
            "1",
        ]
        done = try_mount(mountpoint, *args, *reader_args(token, secret_file))
        assert done.returncode == 0, done.stderr
        sessions[name] = mountpoint
        if name == "anon":  # the site's first class: its table built, the whole tree's made after it
            wait_until(lambda: "the whole tree's table" in log.read_text(), 30, "the whole tree's table")

    for name, mountpoint in sessions.items():
        assert tree_listing(mountpoint) == visible(pages, readers[name]), name
    assert "filtered from the whole tree's" in log.read_text()
    public = page_path(3)
    assert len({os.stat(m / public).st_ino for m in sessions.values()}) == 1, "one inode per page in every class"
    assert not (sessions["billing"] / "vault").exists() and (sessions["admin"] / "vault").is_dir()

    # a re-ingest: a public page edited, a billing page made admin-only
    edited, hidden = 3, 4
    (site / page_path(edited)).write_text(page_text(edited, None, "edited"))
    (site / page_path(hidden)).write_text(page_text(hidden, ["admin"]))
    pages[hidden] = ["admin"]
    ingest(site, "--site", "big", "--chroma-path", str(chroma), "--quiet")
    wanted = page_text(edited, None, "edited").encode()
    deadline = time.monotonic() + 30
    for mountpoint in sessions.values():
        wait_until(lambda m=mountpoint: (m / public).read_bytes() == wanted, deadline - time.monotonic(), "the edit")
    for name, mountpoint in sessions.items():
        assert tree_listing(mountpoint) == visible(pages, readers[name]), name
    with pytest.raises(OSError) as gone:
        (sessions["billing"] / page_path(hidden)).read_bytes()
    assert gone.value.errno == errno.ENOENT
    assert (sessions["both"] / page_path(hidden)).read_bytes() == page_text(hidden, ["admin"]).encode()
    assert "(tables filtered from the whole tree's)" in log.read_text()
