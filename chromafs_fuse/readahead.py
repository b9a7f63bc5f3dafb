"""Which pages to load before anyone asks, and which to hand the kernel (policy, no I/O).

`ReadScheduler` owns every read-ahead and push decision of one mount and the state they
need: which files the kernel already holds, which directories it has listed, which batches
are in flight, where a streaming reader's batches end. It acts only through two small
interfaces, a `PageLoader` (the page tiers: start a batch, say what is in memory) and a
`Pusher` (offers pages to the kernel's cache), so its rules are tested without FUSE or a
backend (tests/unit/test_readahead_rules.py).

The rules, in the order `grep -r` and `rg` read a tree (file order = tree order):
- A read of a page not in memory, next to a file the kernel already has, loads the aligned
  block of `window` files around it in one batch (the reader waits for it either way). Any
  other miss loads its page alone: `cat` of a few scattered files loads nothing it does not read.
- A first read of a page in memory looks half a window further; if that file is neither
  loaded nor loading, a speculative batch four windows long starts there, so the backend
  works ahead of the reader instead of the reader waiting at each block boundary.
- When pages are pushed to the kernel, reads reach the daemon only now and then: each read
  keeps STREAM_DEPTH batches requested past its block instead.
- Speculative batches are dropped while MAX_BATCHES_IN_FLIGHT are loading; a batch a
  reader waits for always starts. Files the kernel holds are never loaded again.
- A page loaded for a directory the kernel has not listed stays in memory (the kernel would
  refuse it) until a read in that directory shows the kernel holds it; then every loaded
  sibling is offered at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from chromafs_fuse.inodes import InodeTable, Node
from chromafs_fuse.tree import PathEntry

MAX_BATCHES_IN_FLIGHT = 4  # one per reader thread of rg on 2-4 cores; more queue behind each other
STREAM_DEPTH = 2  # batches kept requested ahead of a reader when pages are pushed


class PageLoader(Protocol):
    """The page tiers as the scheduler sees them (PageSource)."""

    def is_cached(self, entry: PathEntry) -> bool: ...

    def is_cached_or_loading(self, page_key: str, sha256: str | None) -> bool: ...

    def start_batch(self, entries: Sequence[PathEntry], on_done: Callable[[bool], None]) -> bool:
        """Load these pages in the background, one round trip; `on_done(loaded)` runs on the
        loop when the batch ends. False if no batch can run (the mount is not serving)."""
        ...

    def peek(self, page_key: str, sha256: str | None) -> bytes | None: ...

    def release(self, page_key: str, sha256: str | None) -> None: ...


class Pusher(Protocol):
    """Offers whole files to the kernel's page cache (KernelPusher)."""

    being_read: bytearray  # by tag (file order): the kernel asked for it itself
    outcomes: deque[tuple[int, bool]]  # (tag, stored), drained by the scheduler

    def offer(self, tag: int, inode: int, data: bytes) -> None: ...


class ReadScheduler:
    def __init__(self, table: InodeTable, pages: PageLoader, window: int) -> None:
        self.table = table
        self.pages = pages
        self.window = window
        self.pusher: Pusher | None = None
        self.batches_in_flight = 0
        files = len(table.file_order)
        self._delivered = bytearray(files)  # by file order: the kernel holds the whole file
        self._listed = bytearray(len(table))  # by node index: the kernel has listed this directory
        self._swept = bytearray(len(table))  # by node index: the kernel holds its entries; loaded pages offered
        self._offered: dict[int, tuple[str, str | None]] = {}  # file order -> (key, sha256) offered
        self._frontier = 0  # file order where the batches requested so far end (push mode)

    # -- what the kernel holds ---------------------------------------------------

    def holds(self, order: int) -> bool:
        """The kernel has the whole file at this file order."""
        return self._delivered[order] == 1

    def push_through(self, pusher: Pusher) -> None:
        self.pusher = pusher

    # -- events --------------------------------------------------------------------

    def listed(self, index: int) -> None:
        """The kernel has read the whole listing of this directory."""
        self._listed[index] = 1

    def reading(self, node: Node, offset: int) -> None:
        """A read of this file arrived (before it is answered)."""
        entry = node.entry
        assert entry is not None
        if self.pusher is not None:
            self.pusher.being_read[node.order] = 1  # a store now would wait for this read
        if offset == 0 and self.window and entry.blob is None:
            self._read_ahead(node, entry)

    def answered(self, node: Node, end: int) -> None:
        """A read of this file was answered with its bytes up to `end`."""
        entry = node.entry
        assert entry is not None
        if entry.size is not None and entry.blob is None and end >= entry.size:
            # The kernel caches every file of known size (keep_cache, or no-open mode): once it
            # has the last bytes, the copy in memory only costs memory.
            self.pages.release(entry.key, entry.sha256)
            self._delivered[node.order] = 1
        if self.pusher is not None:
            self._sweep(node.index)

    def take_outcomes(self) -> None:
        """Drain what the pusher reports: stored pages are the kernel's now."""
        if self.pusher is None:
            return
        outcomes, offered = self.pusher.outcomes, self._offered
        while outcomes:
            order, stored = outcomes.popleft()
            page = offered.pop(order, None)
            if stored and page is not None:
                self._delivered[order] = 1
                self.pages.release(*page)

    # -- read-ahead ------------------------------------------------------------------

    def _read_ahead(self, node: Node, entry: PathEntry) -> None:
        window = self.window
        block = node.order - node.order % window
        if not self.pages.is_cached(entry):
            if not self._next_to_delivered(node.order):
                return
            # The aligned block, not the files after this one: readers that jump around within
            # a directory (rg's threads take files last in, first out) hit it too.
            self._load(block, window, reader_waits=True)
            if self.pusher is None:
                return
        if self.pusher is not None:
            self._stream(block + window, window * 4)
            return
        ahead = self.table.file_at(node.order + window // 2)
        if (
            ahead is not None
            and ahead.entry is not None
            and not self._delivered[ahead.order]
            and not self.pages.is_cached_or_loading(ahead.entry.key, ahead.entry.sha256)
        ):
            self._load(ahead.order, window * 4)

    def _next_to_delivered(self, order: int) -> bool:
        delivered = self._delivered
        return (order > 0 and delivered[order - 1] == 1) or (order + 1 < len(delivered) and delivered[order + 1] == 1)

    def _stream(self, first: int, batch: int) -> None:
        """Keep STREAM_DEPTH batches requested from `first` on; a reader that jumps elsewhere
        restarts the frontier."""
        horizon = min(first + STREAM_DEPTH * batch, len(self.table.file_order))
        if not first <= self._frontier <= horizon:
            self._frontier = first
        while self._frontier < horizon:
            if not self._load(self._frontier, batch):
                return  # enough batches in flight
            self._frontier += batch

    def _load(self, order: int, count: int, reader_waits: bool = False) -> bool:
        """Load the files from `order` on that are neither held nor in memory, in one batch;
        False if the batch was dropped (speculative while the backend is busy) or cannot run."""
        if self.batches_in_flight >= MAX_BATCHES_IN_FLIGHT and not reader_waits:
            return False
        # By index: this runs for many reads, and making nodes would cost more than the batch
        delivered, pages, table = self._delivered, self.pages, self.table
        first = max(order, 0)
        indexes = [
            index
            for at, index in enumerate(table.file_order[first : first + count], first)
            if not delivered[at]
            and not table.is_blob_at(index)
            and not pages.is_cached_or_loading(table.key_at(index), table.sha_at(index))
        ]
        if not indexes:
            return True

        def on_done(loaded: bool) -> None:
            self.batches_in_flight -= 1
            if loaded and self.pusher is not None:
                self._offer_listed(indexes)

        self.batches_in_flight += 1
        entries = [table.node(index).entry for index in indexes]
        if pages.start_batch([e for e in entries if e is not None], on_done):
            return True
        self.batches_in_flight -= 1
        return False

    # -- pushing into the kernel's cache ------------------------------------------------

    def holds_directory(self, index: int) -> None:
        """The kernel holds every entry of this directory (a read in it, or a finished walk of
        its listing, shows it): offer every loaded file of it now, and later loads as they come."""
        self.take_outcomes()
        if self.pusher is None or self._swept[index]:
            return
        self._swept[index] = self._listed[index] = 1
        self._offer_files_of(index)

    def offer_loaded(self, indexes: Sequence[int]) -> None:
        """Offer these files (node indexes) if they are in memory and the kernel holds their
        directory: a warm-up batch that was just loaded."""
        if self.pusher is None:
            return
        self.take_outcomes()
        self._offer_listed(indexes)

    def pushes_pending(self) -> int:
        """Pages offered to the kernel whose outcome has not come back yet."""
        self.take_outcomes()
        return len(self._offered)

    def _offer_files_of(self, directory: int) -> None:
        table = self.table
        for child in table.children_at(directory):
            if not table.is_dir_at(child):
                self._offer(child)

    def _offer(self, index: int) -> None:
        assert self.pusher is not None
        order = self.table.order_at(index)
        if self._delivered[order] or order in self._offered:
            return
        page = (self.table.key_at(index), self.table.sha_at(index))
        data = self.pages.peek(*page)
        if data is None:
            return
        self._offered[order] = page
        self.pusher.offer(order, self.table.inode_at(index), data)

    def _offer_listed(self, indexes: Sequence[int]) -> None:
        listed, parent_at = self._listed, self.table.parent_at
        for index in indexes:
            if listed[parent_at(index)]:
                self._offer(index)

    def _sweep(self, index: int) -> None:
        """A read shows the kernel holds this file's directory: offer every loaded sibling."""
        self.holds_directory(self.table.parent_at(index))
