"""The composition of the page tiers (site/page_source.TieredPages), in-process with fake
tiers: the order they are asked in, the faster ones filled on the way back, one deadline per
read, one load for concurrent readers of a page, a timed-out page failing fast for a moment.
The real tiers are tested through real mounts and servers elsewhere (test_shared_cache.py,
test_faults.py, test_lazy_files.py, ...)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

import pytest
import trio
import trio.testing

from chromafs_fuse.backends.blobstore import BlobError
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.site.page_source import BLOB_BLOCK, PageTimedOut, PageUnavailable, TieredPages
from chromafs_fuse.site.tiers.memory import MemoryTier
from chromafs_fuse.tree import PathEntry, parse_tree
from infra import hold_for, trio_hold_for, trio_wait_until

TIMEOUT_S = 1.0
TREE = {
    "a.md": {"isPublic": True},
    "b.md": {"isPublic": True},
    "c.md": {"isPublic": True},
    "big.bin": {"isPublic": True, "blob": {"url": "file:///blobs/big", "size": 3 * BLOB_BLOCK}},
}
ENTRIES = parse_tree(json.dumps(TREE)).entries
GATES: list[threading.Event] = []


@pytest.fixture(autouse=True)
def open_gates() -> Iterator[None]:
    """Threads a test left blocked (abandoned at a deadline) are let go at its end."""
    yield
    for gate in GATES:
        gate.set()
    GATES.clear()


def closed_gate() -> threading.Event:
    gate = threading.Event()
    GATES.append(gate)
    return gate


class FakeStore:
    def __init__(self, name: str, pages: dict[str, bytes] | None = None, fails: bool = False) -> None:
        self.name = name
        self.pages = dict(pages or {})
        self.fails = fails
        self.gate: threading.Event | None = None  # while closed, every fetch blocks
        self.asked: list[list[str]] = []
        self.filled: list[str] = []

    def fetch(self, entries: Sequence[PathEntry], tree_version: str) -> dict[str, bytes]:
        self.asked.append([e.key for e in entries])
        if self.gate is not None:
            self.gate.wait(30)
        if self.fails:
            raise RuntimeError(f"{self.name} is down")
        return {e.key: self.pages[e.key] for e in entries if e.key in self.pages}

    def fill(self, pages: Sequence[tuple[PathEntry, bytes]], tree_version: str) -> None:
        for entry, data in pages:
            self.pages[entry.key] = data
            self.filled.append(entry.key)


class FakeBlobs:
    name = "blob"

    def __init__(self, seconds_per_block: float = 0.0) -> None:
        self.seconds_per_block = seconds_per_block
        self.asked: list[int] = []  # offsets

    def block_size(self, entry: PathEntry) -> int:
        return BLOB_BLOCK

    def read_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        self.asked.append(offset)
        hold_for(self.seconds_per_block, "a slow blob store")
        if entry.blob is None or offset + length > entry.blob.size:
            raise BlobError("no such range")
        return bytes([offset // BLOB_BLOCK]) * length


def composer(*stores: FakeStore, blobs: FakeBlobs | None = None) -> TieredPages:
    return TieredPages(MemoryTier(PageCache()), stores, blobs or FakeBlobs(), "v1", TIMEOUT_S)


def run(fn: Callable[[], Awaitable[object]]) -> object:
    return trio.run(fn)


def read_all(pages: TieredPages, key: str) -> Awaitable[bytes]:
    return pages.read(ENTRIES[key], 0, 1 << 20)


def test_tiers_are_asked_in_order_and_the_faster_ones_filled_on_the_way_back() -> None:
    redis = FakeStore("redis", {"a.md": b"A from redis"})
    chroma = FakeStore("chroma", {"a.md": b"A from chroma", "b.md": b"B"})
    pages = composer(redis, chroma)

    async def main() -> None:
        assert await read_all(pages, "a.md") == b"A from redis"
        assert chroma.asked == []  # redis had it: chroma is never asked
        assert await read_all(pages, "b.md") == b"B"
        assert redis.asked[-1] == ["b.md"] and chroma.asked == [["b.md"]]
        assert redis.filled == ["b.md"]  # what chroma gave is kept in redis
        assert pages.is_cached(ENTRIES["b.md"])  # and in memory
        before = (len(redis.asked), len(chroma.asked))
        assert await read_all(pages, "b.md") == b"B"
        assert (len(redis.asked), len(chroma.asked)) == before  # memory answers
        assert pages.cache.hits == 1

    run(main)


def test_a_tier_that_fails_is_counted_and_the_next_one_asked() -> None:
    redis = FakeStore("redis", fails=True)
    chroma = FakeStore("chroma", {"a.md": b"A"})
    pages = composer(redis, chroma)

    async def main() -> None:
        assert await read_all(pages, "a.md") == b"A"
        with pytest.raises(PageUnavailable):
            await read_all(pages, "c.md")  # no tier has it

    run(main)
    assert pages.backend_errors["redis"] == 2
    assert redis.filled == []  # a tier that failed is not filled
    assert set(pages.backend_seconds) == {"redis", "chroma"}


def test_concurrent_reads_of_a_page_share_one_load() -> None:
    chroma = FakeStore("chroma", {"a.md": b"A"})
    chroma.gate = closed_gate()
    pages = composer(chroma)
    got: list[bytes] = []

    async def reader() -> None:
        got.append(await read_all(pages, "a.md"))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(reader)
            await trio_wait_until(lambda: chroma.asked, 5, "the first reader asking Chroma")
            await trio.testing.wait_all_tasks_blocked()  # every reader is waiting now
            assert chroma.gate is not None
            chroma.gate.set()

    run(main)
    assert got == [b"A"] * 10
    assert chroma.asked == [["a.md"]]


def test_a_read_waits_for_the_read_ahead_batch_loading_its_page() -> None:
    chroma = FakeStore("chroma", {"a.md": b"A", "b.md": b"B", "c.md": b"C"})
    chroma.gate = closed_gate()
    pages = composer(chroma)
    outcomes: list[bool] = []
    got: list[bytes] = []

    async def reader() -> None:
        got.append(await read_all(pages, "b.md"))

    async def main() -> None:
        async with pages.running(), trio.open_nursery() as nursery:
            assert pages.start_batch([ENTRIES[k] for k in ("a.md", "b.md", "c.md")], outcomes.append)
            assert pages.is_cached_or_loading("b.md", None)
            nursery.start_soon(reader)
            await trio_wait_until(lambda: len(chroma.asked) == 1, 5, "the batch asked Chroma (its thread)")
            await trio.testing.wait_all_tasks_blocked()
            assert len(chroma.asked) == 1 and got == []  # the reader waits for the batch
            assert chroma.gate is not None
            chroma.gate.set()

    run(main)
    assert got == [b"B"]
    assert chroma.asked == [["a.md", "b.md", "c.md"]]
    assert outcomes == [True]
    assert pages.peek("c.md", None) == b"C"
    pages.release("c.md", None)
    assert pages.peek("c.md", None) is None


def test_a_read_that_waited_for_a_stuck_batch_fails_within_one_deadline() -> None:
    chroma = FakeStore("chroma", {"a.md": b"A"})
    chroma.gate = closed_gate()
    pages = composer(chroma)

    async def main() -> float:
        async with pages.running():
            pages.start_batch([ENTRIES["a.md"]], lambda loaded: None)
            await trio_hold_for(TIMEOUT_S / 2, "half the deadline spent on the stuck batch")
            started = trio.current_time()
            with pytest.raises(PageTimedOut):
                await read_all(pages, "a.md")
            return trio.current_time() - started

    elapsed = run(main)
    assert isinstance(elapsed, float) and elapsed < TIMEOUT_S + 0.3


def test_the_blocks_of_one_read_share_its_deadline() -> None:
    """Each block alone is within the deadline; the three of one read are not."""
    blobs = FakeBlobs(seconds_per_block=TIMEOUT_S * 0.45)
    pages = composer(FakeStore("chroma"), blobs=blobs)

    async def main() -> float:
        started = trio.current_time()
        with pytest.raises(PageTimedOut):
            await read_all(pages, "big.bin")
        return trio.current_time() - started

    elapsed = run(main)
    assert isinstance(elapsed, float) and elapsed < TIMEOUT_S + 0.3
    assert pages.backend_errors["blob"] == 1


def test_a_lazy_file_is_read_in_blocks_kept_in_memory() -> None:
    blobs = FakeBlobs()
    pages = composer(FakeStore("chroma"), blobs=blobs)

    async def main() -> None:
        entry = ENTRIES["big.bin"]
        assert await pages.read(entry, BLOB_BLOCK - 1, 2) == b"\x00\x01"
        assert await pages.read(entry, BLOB_BLOCK, 3) == b"\x01\x01\x01"  # block 1 from memory
        assert await pages.read(entry, 3 * BLOB_BLOCK, 10) == b""

    run(main)
    assert blobs.asked == [0, BLOB_BLOCK]


def test_a_timed_out_page_fails_at_once_for_a_moment_then_is_tried_again() -> None:
    chroma = FakeStore("chroma", {"a.md": b"A"})
    chroma.gate = closed_gate()
    pages = composer(chroma)

    async def main() -> None:
        with pytest.raises(PageTimedOut):
            await read_all(pages, "a.md")
        started = trio.current_time()
        with pytest.raises(PageUnavailable):
            await read_all(pages, "a.md")
        assert trio.current_time() - started < 0.1
        assert len(chroma.asked) == 1  # the second read did not ask the backend
        assert chroma.gate is not None
        chroma.gate.set()
        pages.switch("v2")  # a new tree forgets the timeouts
        assert await read_all(pages, "a.md") == b"A"

    run(main)


def test_sizes_are_learned_and_forgotten_with_the_tree() -> None:
    pages = composer(FakeStore("chroma", {"a.md": b"12345"}))
    entry = ENTRIES["a.md"]
    assert pages.size_of(entry) is None
    assert trio.run(pages.read, entry, 1, 2) == b"23"
    assert pages.size_of(entry) == 5
    pages.switch("v2")
    assert pages.size_of(entry) is None
    assert not pages.is_cached(entry)  # a tree without sha256s keeps pages under its version


def test_preload_loads_in_batches() -> None:
    chroma = FakeStore("chroma", {"a.md": b"A", "b.md": b"B", "c.md": b"C"})
    pages = composer(chroma)
    batches: list[int] = []
    entries = [ENTRIES[k] for k in ("a.md", "b.md", "c.md", "big.bin")]
    loaded = trio.run(lambda: pages.preload(entries, 2, lambda: batches.append(1)))
    assert loaded == 3 and len(batches) == 2
    assert chroma.asked == [["a.md", "b.md"], ["c.md"]]


def test_the_blocking_path_reads_the_same_tiers_within_the_deadline() -> None:
    redis = FakeStore("redis")
    chroma = FakeStore("chroma", {"a.md": b"A"})
    blobs = FakeBlobs()
    pages = composer(redis, chroma, blobs=blobs)
    loaded = pages.load_cached([ENTRIES["a.md"], ENTRIES["big.bin"], ENTRIES["c.md"]])
    assert loaded["a.md"] == b"A" and redis.filled == ["a.md"] and pages.is_cached(ENTRIES["a.md"])
    assert loaded["big.bin"] == b"\x00" * (3 * BLOB_BLOCK)  # whole, one request
    assert isinstance(loaded["c.md"], PageUnavailable)
    assert pages.load_cached([ENTRIES["a.md"]]) == {"a.md": b"A"}
    assert chroma.asked == [["a.md", "c.md"]]

    chroma.gate = closed_gate()
    started = time.monotonic()
    stuck = pages.load_many([ENTRIES["b.md"]])
    assert isinstance(stuck["b.md"], PageTimedOut)
    assert time.monotonic() - started < TIMEOUT_S + 0.3
