"""The read-ahead and push rules of ReadScheduler, without FUSE or a backend: a fake page
loader records the batches asked for, a fake pusher the pages offered to the kernel."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence

import pytest

from chromafs_fuse.inodes import InodeTable, Node
from chromafs_fuse.readahead import MAX_BATCHES_IN_FLIGHT, STREAM_DEPTH, ReadScheduler
from chromafs_fuse.tree import PathEntry, parse_tree

WINDOW = 32


class FakePages:
    """The page tiers: batches start at once and finish when the test says so."""

    def __init__(self) -> None:
        self.memory: dict[str, bytes] = {}
        self.loading: set[str] = set()
        self.batches: list[tuple[list[str], Callable[[bool], None]]] = []
        self.released: list[str] = []
        self.serving = True

    def is_cached(self, entry: PathEntry) -> bool:
        return entry.key in self.memory

    def is_cached_or_loading(self, page_key: str, sha256: str | None) -> bool:
        return page_key in self.memory or page_key in self.loading

    def start_batch(self, entries: Sequence[PathEntry], on_done: Callable[[bool], None]) -> bool:
        if not self.serving:
            return False
        keys = [e.key for e in entries]
        self.loading.update(keys)
        self.batches.append((keys, on_done))
        return True

    def finish(self, loaded: bool = True) -> None:
        for keys, on_done in self.batches:
            self.loading.difference_update(keys)
            if loaded:
                self.memory.update({k: k.encode() for k in keys})
            on_done(loaded)
        self.batches.clear()

    def asked(self) -> list[tuple[str, int]]:
        return [(keys[0], len(keys)) for keys, _ in self.batches]

    def peek(self, page_key: str, sha256: str | None) -> bytes | None:
        return self.memory.get(page_key)

    def release(self, page_key: str, sha256: str | None) -> None:
        self.released.append(page_key)
        self.memory.pop(page_key, None)


class FakePusher:
    def __init__(self, files: int) -> None:
        self.being_read = bytearray(files)
        self.outcomes: deque[tuple[int, bool]] = deque()
        self.offered: list[int] = []  # file orders

    def offer(self, tag: int, inode: int, data: bytes) -> None:
        self.offered.append(tag)


def site(dirs: int, files: int) -> InodeTable:
    tree = {f"d{d:02d}/p{p:03d}.md": {"isPublic": True, "size": 1} for d in range(dirs) for p in range(files)}
    return InodeTable(parse_tree(json.dumps(tree)).entries)


def file(table: InodeTable, order: int) -> Node:
    node = table.file_at(order)
    assert node is not None and node.entry is not None
    return node


def read_whole(scheduler: ReadScheduler, table: InodeTable, order: int) -> None:
    """A read of a whole file (size 1), as the kernel sends it and the daemon answers it."""
    node = file(table, order)
    scheduler.reading(node, 0)
    scheduler.answered(node, 1)


@pytest.fixture
def table() -> InodeTable:
    return site(20, 50)


def test_a_scattered_miss_loads_its_page_alone(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    for order in (5, 400, 77):  # `cat` of a few files here and there
        read_whole(scheduler, table, order)
    assert pages.asked() == []


def test_a_miss_next_to_a_file_the_kernel_holds_loads_its_aligned_block(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    read_whole(scheduler, table, 40)
    assert scheduler.holds(40)
    scheduler.reading(file(table, 41), 0)
    # the block 32..63, less file 40: the kernel has it
    assert pages.asked() == [(file(table, 32).path, WINDOW - 1)]


def test_a_reader_going_backwards_also_counts_as_going_through_the_tree(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    read_whole(scheduler, table, 70)
    scheduler.reading(file(table, 69), 0)
    assert pages.asked() == [(file(table, 64).path, WINDOW - 1)]


def test_a_hit_starts_a_speculative_batch_half_a_window_ahead(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    pages.memory[file(table, 3).path] = b"x"
    scheduler.reading(file(table, 3), 0)
    assert pages.asked() == [(file(table, 3 + WINDOW // 2).path, 4 * WINDOW)]
    scheduler.reading(file(table, 3), 0)  # the file ahead is loading now: nothing more
    assert len(pages.asked()) == 1


def test_only_first_reads_of_chunked_pages_schedule(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    read_whole(scheduler, table, 10)
    scheduler.reading(file(table, 11), 4096)  # a later block of the file: its page is being read
    assert pages.asked() == []
    off = ReadScheduler(table, pages, 0)  # --readahead-pages 0
    read_whole(off, table, 10)
    off.reading(file(table, 11), 0)
    assert pages.asked() == []


def test_speculative_batches_wait_for_room_but_a_batch_a_reader_waits_for_starts(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, 4)
    for order in range(MAX_BATCHES_IN_FLIGHT):
        start = order * 100
        pages.memory[file(table, start).path] = b"x"
        scheduler.reading(file(table, start), 0)
    assert scheduler.batches_in_flight == MAX_BATCHES_IN_FLIGHT
    pages.memory[file(table, 600).path] = b"x"
    scheduler.reading(file(table, 600), 0)  # speculative: dropped while the backend is busy
    assert len(pages.asked()) == MAX_BATCHES_IN_FLIGHT
    read_whole(scheduler, table, 800)
    scheduler.reading(file(table, 801), 0)  # a reader waits for this one: it starts
    assert len(pages.asked()) == MAX_BATCHES_IN_FLIGHT + 1
    pages.finish()
    assert scheduler.batches_in_flight == 0


def test_a_failed_batch_frees_its_room(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    pages.memory[file(table, 0).path] = b"x"
    scheduler.reading(file(table, 0), 0)
    pages.finish(loaded=False)
    assert scheduler.batches_in_flight == 0
    pages.serving = False  # not serving: a batch cannot start, and takes no room
    pages.memory[file(table, 300).path] = b"x"
    scheduler.reading(file(table, 300), 0)
    assert scheduler.batches_in_flight == 0


def test_files_the_kernel_holds_and_lazy_files_are_never_loaded_ahead() -> None:
    tree = {f"d/p{p:03d}.md": {"isPublic": True, "size": 1} for p in range(8)}
    tree["d/p004.md"] = {"isPublic": True, "blob": {"url": "s3://b/k", "size": 10}}
    table = InodeTable(parse_tree(json.dumps(tree)).entries)
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, 8)
    read_whole(scheduler, table, 0)
    scheduler.reading(file(table, 1), 0)
    assert [keys for keys, _ in pages.batches] == [
        ["d/p001.md", "d/p002.md", "d/p003.md", "d/p005.md", "d/p006.md", "d/p007.md"]
    ]


def test_the_whole_file_answered_is_released_and_held_a_partial_one_is_not(table: InodeTable) -> None:
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    node = file(table, 9)
    scheduler.reading(node, 0)
    scheduler.answered(node, 0)  # short read: the kernel does not have the last byte
    assert not scheduler.holds(9) and pages.released == []
    scheduler.answered(node, 1)
    assert scheduler.holds(9) and pages.released == [node.path]


def test_pushed_readers_keep_the_next_batches_requested(table: InodeTable) -> None:
    """With pages pushed, reads arrive only now and then: each keeps STREAM_DEPTH batches of
    four windows requested past its block, each page asked for once; a jump restarts."""
    pages = FakePages()
    scheduler = ReadScheduler(table, pages, WINDOW)
    scheduler.push_through(FakePusher(len(table.file_order)))
    batch = 4 * WINDOW

    def key(order: int) -> str:
        return file(table, order).path

    read_whole(scheduler, table, 0)
    assert pages.asked() == []  # a miss with no neighbour held: its page alone
    scheduler.reading(file(table, 1), 0)
    assert pages.asked() == [(key(1), WINDOW - 1), (key(WINDOW), batch), (key(WINDOW + batch), batch)]
    pages.finish()
    scheduler.reading(file(table, 10), 0)  # inside what was requested: nothing new
    assert pages.asked() == []
    scheduler.reading(file(table, 100), 0)  # the window slides: only the batch not asked yet
    assert pages.asked() == [(key(WINDOW + STREAM_DEPTH * batch), batch)]
    pages.finish()
    scheduler.reading(file(table, 700), 0)  # a jump: a miss with no neighbour: alone
    assert pages.asked() == []
    scheduler.answered(file(table, 700), 1)
    scheduler.reading(file(table, 701), 0)
    assert pages.asked() == [(key(672), WINDOW - 1), (key(704), batch), (key(704 + batch), batch)]


def test_pages_reach_the_kernel_only_for_listed_directories() -> None:
    table = site(2, 4)  # d00: orders 0-3, d01: orders 4-7
    pages = FakePages()
    pusher = FakePusher(len(table.file_order))
    scheduler = ReadScheduler(table, pages, 4)
    scheduler.push_through(pusher)
    d00 = table.parent_at(file(table, 0).index)
    scheduler.listed(d00)
    read_whole(scheduler, table, 0)  # d00 is swept: nothing loaded yet to offer
    scheduler.reading(file(table, 1), 0)  # its block loads, then the next blocks stream
    pages.finish()
    # d00's loaded pages (the pusher itself skips file 1, being read); d01 is not listed yet
    assert sorted(pusher.offered) == [1, 2, 3]
    assert pusher.being_read[1] == 1
    scheduler.answered(file(table, 1), 1)
    read_whole(scheduler, table, 4)  # a read in d01 shows the kernel holds d01: its loaded siblings go
    assert sorted(pusher.offered) == [1, 2, 3, 5, 6, 7]
    pusher.outcomes.extend([(2, True), (3, False)])
    scheduler.take_outcomes()
    assert scheduler.holds(2) and not scheduler.holds(3)
    assert file(table, 2).path in pages.released and file(table, 3).path not in pages.released
