"""Directory read-ahead, seen from Redis: reading a directory's files in order fetches
each page once, in batches, and never stops to fetch pages one by one."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from conftest import RedisServer

from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving.fuse_ops import STREAM_DEPTH, ChromaOperations
from chromafs_fuse.serving.kernel_push import KernelPusher
from chromafs_fuse.tree import PathEntry, parse_tree
from helpers import ingest, mounted, run

FILES = 100


def test_reading_a_directory_in_order_fetches_pages_in_batches(
    redis_server: RedisServer, mnt: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    (site / "many").mkdir(parents=True)
    for i in range(FILES):
        (site / "many" / f"page-{i:03d}.md").write_text(f"# Page {i}\n\n" + f"line {i}\n" * (i + 1))
    chroma = tmp_path / "chroma"
    ingest(site, "--site", "readahead", "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    base = ["--site", "readahead", "--chroma-path", str(chroma), "--redis-url", redis_server.url]
    with mounted(tmp_path / "prime", *base, "--prefetch", "on"):
        run(["grep", "-rq", "never-matches", str(tmp_path / "prime")])  # every page into Redis

    monitor = subprocess.Popen(
        ["redis-cli", "-p", str(redis_server.port), "monitor"], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.3)
        with mounted(mnt, *base, "--prefetch", "off"):
            for i in range(FILES):  # one reader, in order, like `cat many/*`
                name = f"page-{i:03d}.md"
                assert (mnt / "many" / name).read_bytes() == (site / "many" / name).read_bytes()
            time.sleep(0.5)
    finally:
        monitor.terminate()
        seen = monitor.communicate(timeout=10)[0]
    fetches = [line for line in seen.splitlines() if re.search(r'"(MGET|GET)"', line) and ":page:" in line]
    fetched = re.findall(r":page:many/(page-\d+\.md)", "\n".join(fetches))
    assert sorted(fetched) == sorted(set(fetched)), "a page was fetched twice"
    assert len(set(fetched)) == FILES
    assert len(fetches) <= FILES // 16 + 1, f"{len(fetches)} fetches for {FILES} files: not batched"


class _Batches:
    """The part of PageSource that read-ahead scheduling calls: records each batch asked for,
    leaves out pages asked for before (as loading or loaded), and refuses a speculative batch
    beyond `room` in flight, as PageSource does when the backend is busy."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.speculative = 0
        self.loaded: set[str] = set()
        self.asked: list[tuple[str, int, bool]] = []  # (first key, pages, reader waits)

    def is_cached(self, entry: PathEntry) -> bool:
        return entry.key in self.loaded

    def read_ahead(self, entries: list[PathEntry], reader_waits: bool = False, on_loaded: object = None) -> bool:
        if not reader_waits and self.speculative >= self.room:
            return False
        todo = [e for e in entries if e.key not in self.loaded]
        if todo:
            self.speculative += not reader_waits
            self.loaded.update(e.key for e in todo)
            self.asked.append((todo[0].key, len(todo), reader_waits))
        return True


def test_a_reader_whose_pages_are_pushed_keeps_the_next_batches_requested() -> None:
    """A miss with no neighbour read loads its page alone (scattered `cat`s load nothing
    else). Once a reader goes through the tree, and in push mode reads arrive only now and
    then, each read keeps STREAM_DEPTH batches of four windows requested after its own block:
    a slow backend always has work queued ahead of the reader, each page is asked for once,
    and a reader that jumps elsewhere restarts."""
    tree = {f"d{d:02d}/p{p:03d}.md": {"isPublic": True, "size": 1} for d in range(20) for p in range(50)}
    table = InodeTable(parse_tree(json.dumps(tree)).entries)
    source = _Batches(room=STREAM_DEPTH)
    ops = ChromaOperations(table, source, readahead_pages=32, no_open=True, push_pages=True)  # type: ignore[arg-type]
    ops._pusher = KernelPusher(lambda pages: [0] * len(pages), lambda: None, len(table.file_order))

    def read(order: int) -> None:
        node = table.file_at(order)
        assert node is not None and node.entry is not None
        ops._read_ahead(node, node.entry)

    def key(order: int) -> str:
        node = table.file_at(order)
        assert node is not None
        return node.path

    read(0)  # a miss with no neighbour read: its page alone, fetched by the read itself
    assert source.asked == []
    ops._delivered[0] = 1
    read(1)  # a miss next to a file read: its block (less what the kernel has), then two batches of 128
    assert source.asked == [(key(1), 31, True), (key(32), 128, False), (key(160), 128, False)]
    source.asked.clear()
    read(10)  # still inside the requested window: nothing new
    assert source.asked == []
    source.speculative = 0  # those two batches arrived
    read(100)  # the window slides: only the batch that was not asked for yet
    assert source.asked == [(key(288), 128, False)]
    source.asked.clear()
    source.asked.clear()
    source.speculative = source.room  # the backend is busy: nothing more starts...
    read(300)
    assert source.asked == []
    source.speculative = 0  # ...and the next read asks for what was left out
    read(301)
    assert source.asked == [(key(416), 128, False), (key(544), 128, False)]
    source.asked.clear()
    source.speculative = 0
    read(700)  # a jump: its page alone, then (a neighbour read) its block and a new window there
    assert source.asked == []
    ops._delivered[700] = 1
    read(701)
    assert source.asked == [(key(672), 31, True), (key(704), 128, False), (key(832), 128, False)]
