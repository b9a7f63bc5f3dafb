"""Where page bytes come from: the composer of the page tiers (site/tiers/).

A page is asked of memory, then Redis, then Chroma; a lazy file's blocks of memory, then the
blob store. What a slower tier gives is kept in the faster ones on the way back. One deadline,
`timeout_s` (--backend-timeout), covers a whole read, set in one place (`_deadline`): a dead
backend fails a read in seconds, never hangs it. Concurrent reads of one page (or block) share
one load (tiers/inflight.py). Runs on the trio loop; the store tiers block, so they run on worker
threads. The front ends with no loop (`chromafs grep`, `search`, the MCP server) read through the
same tiers with `load_cached` / `load_many`, under the same deadline.

Only pages of a reader's visible tree are ever asked for: the caller hands in entries from
its pruned inode table, never a path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import trio
from cachetools import TTLCache

from chromafs_fuse.backends.blobstore import BlobError, BlobReader
from chromafs_fuse.backends.chroma_store import ChromaPages
from chromafs_fuse.backends.deadline import with_deadline
from chromafs_fuse.chunks import JOINER
from chromafs_fuse.filesystem import PageTimedOut, PageUnavailable
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.site.tiers import BLOB_BLOCK, BlobTier, PageTier
from chromafs_fuse.site.tiers.blob import BlobStoreTier
from chromafs_fuse.site.tiers.chroma import ChromaTier
from chromafs_fuse.site.tiers.chroma_blob import ChromaBlobTier
from chromafs_fuse.site.tiers.inflight import Claim, InFlight
from chromafs_fuse.site.tiers.memory import MemoryTier, block_key, memory_key
from chromafs_fuse.site.tiers.redis import RedisTier
from chromafs_fuse.tree import PathEntry

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache  # imports redis: only when configured

__all__ = ["BLOB_BLOCK", "PageSource", "PageTimedOut", "PageUnavailable", "TieredPages"]

log = logging.getLogger(__name__)
T = TypeVar("T")
PRELOAD_DEADLINES = 3  # a preload batch (many pages) may take this many --backend-timeouts
Loaded = dict[str, bytes | PageUnavailable]


class TieredPages:
    """The composition: memory, then `stores` in order, then (lazy files) `blobs`."""

    def __init__(
        self,
        memory: MemoryTier,
        stores: Sequence[PageTier],
        blobs: BlobTier,
        tree_version: str,
        timeout_s: float = 10.0,
        max_backend_threads: int = 8,
    ) -> None:
        self.memory = memory
        self.cache: PageCache = memory.cache
        self.stores = list(stores)
        self.blobs = blobs
        self.tree_version = tree_version
        self.timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(max_backend_threads)
        self._loading = InFlight()  # memory keys of pages and blocks being loaded
        # Pages whose read just timed out. The kernel reads a failed page once more at once (its
        # read-ahead read, then a read of its own): the second read fails at once too, so a
        # reader waits one --backend-timeout, not two. The backend is tried again after this.
        self._timed_out: TTLCache[str, bool] = TTLCache(maxsize=4096, ttl=min(1.0, timeout_s))
        self.learned_sizes: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None  # while running(): where read-ahead batches run
        self.backend_errors: Counter[str] = Counter()
        self.backend_seconds: defaultdict[str, float] = defaultdict(float)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run read-ahead batches in the background while the body runs; cancelled at its end."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def switch(self, tree_version: str) -> None:
        """Serve pages of a new tree from now on. Pages are kept under their sha256, so an
        unchanged page stays cached and a changed one is never served for the new tree; pages
        of a tree without sha256s are kept under the tree version, and learned sizes dropped."""
        self.tree_version = tree_version
        self.learned_sizes.clear()
        self._timed_out.clear()

    def size_of(self, entry: PathEntry) -> int | None:
        if entry.size is not None:
            return entry.size
        return self.learned_sizes.get(entry.key)

    # -- what memory holds -----------------------------------------------------------------

    def _key(self, entry: PathEntry) -> str:
        return self.memory.key_of(entry, self.tree_version)

    def is_cached(self, entry: PathEntry) -> bool:
        return self._key(entry) in self.memory

    def is_cached_or_loading(self, page_key: str, sha256: str | None) -> bool:
        key = memory_key(page_key, sha256, self.tree_version)
        return key in self.memory or key in self._loading

    def peek(self, page_key: str, sha256: str | None) -> bytes | None:
        """The page with this key (a PathEntry's) and sha256 if it is in memory; counts nothing."""
        return self.memory.peek(memory_key(page_key, sha256, self.tree_version))

    def release(self, page_key: str, sha256: str | None) -> None:
        """Drop a page the kernel now holds in its own page cache: it asks again only if it
        evicts the page, and then the shared cache or Chroma serves it."""
        self.memory.pop(memory_key(page_key, sha256, self.tree_version))

    def _remember(self, entry: PathEntry, data: bytes) -> None:
        self.memory.fill([(entry, data)], self.tree_version)
        if entry.size is None:
            self.learned_sizes[entry.key] = len(data)

    # -- a read: one deadline --------------------------------------------------------------

    @contextlib.contextmanager
    def _deadline(self, entry: PathEntry) -> Iterator[None]:
        """The one deadline of a read, `timeout_s`: waiting for a load already under way (a
        read-ahead batch), the load of its own after it, every block of a lazy file."""
        if entry.key in self._timed_out:
            raise PageUnavailable(entry.key)
        try:
            with trio.fail_after(self.timeout_s):
                yield
        except trio.TooSlowError as exc:
            log.error("reading %s: no answer within %.1fs", entry.key, self.timeout_s)
            self._timed_out[entry.key] = True
            if entry.blob is not None:
                self.backend_errors[self.blobs.name] += 1
            raise PageTimedOut(entry.key) from exc

    async def read(self, entry: PathEntry, offset: int, size: int) -> bytes:
        """A range of a file, within the read's deadline."""
        with self._deadline(entry):
            if entry.blob is not None:
                return await self._read_blob(entry, offset, size)
            data = await self._page(entry)
        return data[offset : offset + size]

    async def page(self, entry: PathEntry) -> bytes:
        """A whole page, within the read's deadline."""
        with self._deadline(entry):
            return await self._page(entry)

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """A blocking call on a worker thread, abandoned when the caller's deadline passes."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._limiter)

    async def _once(self, key: str, load: Callable[[], Awaitable[bytes]]) -> bytes:
        """Memory's copy under `key`; else the one a load already under way (a read, a read-ahead
        batch) gives; else `load()`'s, which keeps it in memory before the waiters wake."""
        data = self.memory.get(key)
        if data is not None:
            return data
        while key in self._loading:
            await self._loading.wait(key)
            data = self.memory.peek(key)
            if data is not None:
                return data
        with self._loading.claim([key]):
            return await load()

    async def _page(self, entry: PathEntry) -> bytes:
        return await self._once(self._key(entry), partial(self._load_page, entry))

    async def _load_page(self, entry: PathEntry) -> bytes:
        result = (await self._in_thread(self._from_stores, [entry], self.tree_version))[entry.key]
        if isinstance(result, PageUnavailable):
            raise result
        self._remember(entry, result)
        return result

    async def _read_blob(self, entry: PathEntry, offset: int, size: int) -> bytes:
        """A range of a lazy file from fixed-size blocks (the blob tier's size for it), each
        fetched by one ranged request and kept in memory."""
        assert entry.blob is not None
        end = min(offset + size, entry.blob.size)
        if end <= offset:
            return b""
        block_size = self.blobs.block_size(entry)
        first, last = offset // block_size, (end - 1) // block_size
        parts = [await self._blob_block(entry, block, block_size) for block in range(first, last + 1)]
        start = offset - first * block_size
        return b"".join(parts)[start : start + (end - offset)]

    async def _blob_block(self, entry: PathEntry, block: int, block_size: int) -> bytes:
        assert entry.blob is not None
        key = block_key(entry.blob.url, block)
        return await self._once(key, partial(self._load_block, entry, block, block_size))

    async def _load_block(self, entry: PathEntry, block: int, block_size: int) -> bytes:
        assert entry.blob is not None
        offset = block * block_size
        data = await self._in_thread(self._blob_range, entry, offset, min(block_size, entry.blob.size - offset))
        self.memory.put(block_key(entry.blob.url, block), data)
        return data

    # -- batches: read-ahead and preload -----------------------------------------------------

    def start_batch(self, entries: Sequence[PathEntry], on_done: Callable[[bool], None]) -> bool:
        """Start loading these pages in one batch in the background (one Redis MGET, one Chroma
        query), so that reading files one by one, as `grep -r` and `cat *` do, costs one round
        trip per batch instead of one per file. Reads of a page in the batch wait for it instead
        of fetching it again. `on_done(loaded)` runs on the loop when the batch ends, its pages
        in memory if `loaded`. False if the mount is not serving (no nursery to run it in).
        Which batches to start is the ReadScheduler's decision (readahead.py)."""
        if self._nursery is None:
            return False
        todo = [e for e in entries if e.blob is None and not self.is_cached_or_loading(e.key, e.sha256)]
        claim = self._loading.claim(self._key(e) for e in todo)
        self._nursery.start_soon(self._load_batch, todo, claim, on_done)
        return True

    async def _load_batch(self, todo: list[PathEntry], claim: Claim, on_done: Callable[[bool], None]) -> None:
        loaded = False
        try:
            with claim:
                if todo:
                    with trio.fail_after(self.timeout_s):  # the batch's own; a reader waits within its read's
                        results = await self._in_thread(self._from_stores, todo, self.tree_version)
                    self._remember_all(todo, results)
                loaded = True
        except Exception as exc:  # the readers waiting on the batch load (and report) themselves
            log.debug("read-ahead batch failed: %r", exc)
        finally:
            try:
                on_done(loaded)
            except Exception:  # the scheduler's bookkeeping must never end the mount's loop
                log.exception("after a read-ahead batch")

    def _remember_all(self, entries: Sequence[PathEntry], results: Loaded) -> int:
        remembered = 0
        for entry in entries:
            data = results.get(entry.key)
            if isinstance(data, bytes):
                self._remember(entry, data)
                remembered += 1
        return remembered

    async def preload(
        self, entries: Sequence[PathEntry], batch_pages: int = 200, after_batch: Callable[[], object] | None = None
    ) -> int:
        """Load pages in a few batched calls, calling `after_batch` after each; returns how
        many were loaded."""
        todo = [e for e in entries if e.blob is None and self._key(e) not in self.memory]
        done = 0
        for start in range(0, len(todo), batch_pages):
            batch = todo[start : start + batch_pages]
            try:
                with trio.fail_after(self.timeout_s * PRELOAD_DEADLINES):
                    results = await self._in_thread(self._from_stores, batch, self.tree_version)
            except trio.TooSlowError:
                log.warning("preload stopped: the backend is too slow")
                return done
            except Exception:  # a preload is an optimisation: whatever stops it, reads go on
                log.exception("preload stopped")
                return done
            done += self._remember_all(batch, results)
            if after_batch is not None:
                after_batch()
        return done

    # -- with no loop: the front ends --------------------------------------------------------

    def load_cached(self, entries: Sequence[PathEntry]) -> Loaded:
        """As `load_many`, with memory first and what was loaded kept in it: for callers with
        no loop (a command, the MCP server), one thread at a time."""
        loaded: Loaded = dict(self.memory.fetch([e for e in entries if e.blob is None], self.tree_version))
        missing = [e for e in entries if e.key not in loaded]
        if missing:
            results = self.load_many(missing)
            self._remember_all([e for e in missing if e.blob is None], results)
            loaded.update(results)
        return loaded

    def load_many(self, entries: Sequence[PathEntry]) -> Loaded:
        """Blocking, within one `timeout_s`: these files, pages from the stores (one round trip
        each) and lazy files whole from the blob store; memory is neither asked nor filled. A
        file that cannot be had is a PageUnavailable."""
        tree_version = self.tree_version
        try:
            return with_deadline(lambda: self._load_blocking(entries, tree_version), self.timeout_s)
        except TimeoutError:
            log.error("reading %d files: no answer within %.1fs", len(entries), self.timeout_s)
            return {e.key: PageTimedOut(e.key) for e in entries}

    def _load_blocking(self, entries: Sequence[PathEntry], tree_version: str) -> Loaded:
        loaded = self._from_stores([e for e in entries if e.blob is None], tree_version)
        for entry in entries:
            if entry.blob is not None:
                try:
                    loaded[entry.key] = self._blob_range(entry, 0, entry.blob.size)
                except PageUnavailable as exc:
                    loaded[entry.key] = exc
        return loaded

    # -- worker-thread side ------------------------------------------------------------------

    def _from_stores(self, entries: Sequence[PathEntry], tree_version: str) -> Loaded:
        """Each store in order for the pages the ones before it did not have; what one gives is
        kept in the stores before it. A page no store gives is a PageUnavailable."""
        loaded: Loaded = {}
        missing = list(entries)
        asked: list[PageTier] = []
        for tier in self.stores:
            if not missing:
                break
            started = time.perf_counter()
            try:
                found = tier.fetch(missing, tree_version)
            except Exception as exc:  # a tier that cannot be asked: the next one is
                self.backend_errors[tier.name] += 1
                log.error("%s: %s", tier.name, exc)
                continue
            finally:
                self.backend_seconds[tier.name] += time.perf_counter() - started
            given = [(entry, found[entry.key]) for entry in missing if entry.key in found]
            for faster in asked:
                faster.fill(given, tree_version)
            loaded.update(found)
            asked.append(tier)
            missing = [entry for entry in missing if entry.key not in found]
        for entry in missing:
            loaded[entry.key] = PageUnavailable(entry.key)
        return loaded

    def _blob_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        try:
            return self.blobs.read_range(entry, offset, length)
        except BlobError as exc:
            self.backend_errors[self.blobs.name] += 1
            log.error("reading %s: %s", entry.key, exc)
            raise PageUnavailable(entry.key) from exc


class PageSource(TieredPages):
    """The page tiers of a site: memory, Redis (when configured), Chroma, the blob store (or
    Chroma's blob pieces, for a `chroma:` URL)."""

    def __init__(
        self,
        site: str,
        open_chroma: Callable[[], ChromaPages],
        cache: PageCache,
        tree_version: str,
        joiner: str = JOINER,
        timeout_s: float = 10.0,
        shared: RedisCache | None = None,
        max_backend_threads: int = 8,
        s3_endpoint_url: str | None = None,
    ) -> None:
        self.site = site
        self.shared = shared
        self.joiner = joiner
        self._chroma = ChromaTier(open_chroma, joiner)
        stores: list[PageTier] = [RedisTier(shared, site)] if shared is not None else []
        stores.append(self._chroma)
        blobs = BlobStoreTier(BlobReader(s3_endpoint_url), ChromaBlobTier(self._chroma.client))
        super().__init__(MemoryTier(cache), stores, blobs, tree_version, timeout_s, max_backend_threads)

    def chroma(self) -> ChromaPages:
        """The Chroma client, opened on first use (a mount booted from Redis may never need it)."""
        return self._chroma.client()

    def use_chroma(self, pages: ChromaPages) -> None:
        self._chroma.use(pages)
