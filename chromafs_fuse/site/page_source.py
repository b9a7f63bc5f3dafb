"""Where page bytes come from: in-process cache, then Redis, then Chroma or the blob store.

Runs on the trio loop; every blocking backend call goes to a worker thread
under a deadline, so a dead backend fails a read in seconds, never hangs it.
Concurrent reads of one page share a single fetch. Only pages of this mount's
visible tree are ever asked for: the caller hands in entries from its pruned
inode table, never a path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import trio
from cachetools import TTLCache

from chromafs_fuse.backends.blobstore import BlobError, read_blob_range
from chromafs_fuse.backends.chroma_store import BackendError, ChromaPages
from chromafs_fuse.backends.redis_cache import RedisCache
from chromafs_fuse.chunks import DEFAULT_JOINER, CorruptPage, Expected, check_bytes, reassemble
from chromafs_fuse.filesystem import PageTimedOut, PageUnavailable
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.tree import PathEntry

log = logging.getLogger(__name__)
T = TypeVar("T")
BLOB_BLOCK = 128 * 1024  # a lazy file is fetched in ranged requests of this size


class PageSource:
    def __init__(
        self,
        site: str,
        open_chroma: Callable[[], ChromaPages],
        cache: PageCache,
        tree_version: str,
        joiner: str = DEFAULT_JOINER,
        timeout_s: float = 10.0,
        shared: RedisCache | None = None,
        max_backend_threads: int = 8,
    ) -> None:
        self.site = site
        self._open_chroma = open_chroma
        self._chroma: ChromaPages | None = None
        self._chroma_lock = threading.Lock()
        self.cache = cache
        self.shared = shared
        self.tree_version = tree_version
        self.joiner = joiner
        self.timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(max_backend_threads)
        self._inflight: dict[str, trio.Event] = {}
        # Pages whose read just timed out. The kernel reads a failed page once more at once (its
        # read-ahead read, then a read of its own): the second read fails at once too, so a
        # reader waits one --backend-timeout, not two. The backend is tried again after this.
        self._timed_out: TTLCache[str, bool] = TTLCache(maxsize=4096, ttl=min(1.0, timeout_s))
        self.learned_sizes: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None  # while running(): where read-ahead batches run
        self.backend_errors: Counter[str] = Counter()
        self.backend_seconds: Counter[str] = Counter()

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

    def chroma(self) -> ChromaPages:
        """The Chroma client, opened on first use (a mount booted from Redis may never need it)."""
        with self._chroma_lock:
            if self._chroma is None:
                self._chroma = self._open_chroma()
            return self._chroma

    def use_chroma(self, pages: ChromaPages) -> None:
        with self._chroma_lock:
            self._chroma = pages

    def _memory_key(self, page_key: str, sha256: str | None) -> str:
        return f"{sha256 or self.tree_version}:{page_key}"

    def _cache_key(self, entry: PathEntry) -> str:
        return self._memory_key(entry.key, entry.sha256)

    def _shared_key(self, entry: PathEntry) -> str:
        assert self.shared is not None
        return self.shared.page_key(self.site, entry.sha256 or self.tree_version, entry.key)

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        with trio.fail_after(self.timeout_s):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._limiter)

    def size_of(self, entry: PathEntry) -> int | None:
        if entry.size is not None:
            return entry.size
        return self.learned_sizes.get(entry.key)

    async def read(self, entry: PathEntry, offset: int, size: int) -> bytes:
        """A range of a file. One deadline, `timeout_s`, covers the whole read: waiting for a
        read-ahead batch already fetching the page, the fetch of its own after it, every block
        of a lazy file."""
        if entry.key in self._timed_out:
            raise PageUnavailable(entry.key)
        try:
            with trio.fail_after(self.timeout_s):
                if entry.blob is not None:
                    return await self._read_blob(entry, offset, size)
                data = await self.page(entry)
        except trio.TooSlowError as exc:
            log.error("reading %s: no answer within %.1fs", entry.key, self.timeout_s)
            self._timed_out[entry.key] = True
            raise PageTimedOut(entry.key) from exc
        except PageTimedOut:
            self._timed_out[entry.key] = True
            raise
        return data[offset : offset + size]

    async def page(self, entry: PathEntry) -> bytes:
        key = self._cache_key(entry)
        data = self.cache.get(key)
        if data is not None:
            return data
        try:
            with trio.fail_after(self.timeout_s):
                return await self._fetch_page(entry, key)
        except trio.TooSlowError as exc:
            log.error("reading %s: no answer within %.1fs", entry.key, self.timeout_s)
            raise PageTimedOut(entry.key) from exc

    async def _fetch_page(self, entry: PathEntry, key: str) -> bytes:
        pending = self._inflight.get(key)
        if pending is not None:  # a read or a read-ahead batch is already fetching it
            await pending.wait()
            data = self.cache.peek(key)
            if data is not None:
                return data
        own = key not in self._inflight
        done = trio.Event()
        if own:
            self._inflight[key] = done
        try:
            data = await self._off_loop(self._load_one, entry)
            self._remember(entry, data)
            return data
        finally:
            if own:
                del self._inflight[key]
                done.set()

    def is_cached(self, entry: PathEntry) -> bool:
        return self._cache_key(entry) in self.cache

    def is_cached_or_loading(self, page_key: str, sha256: str | None) -> bool:
        key = self._memory_key(page_key, sha256)
        return key in self.cache or key in self._inflight

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
        done = trio.Event()
        for entry in todo:
            self._inflight[self._cache_key(entry)] = done
        self._nursery.start_soon(self._load_batch, todo, done, on_done)
        return True

    async def _load_batch(self, todo: list[PathEntry], done: trio.Event, on_done: Callable[[bool], None]) -> None:
        loaded = False
        try:
            if todo:
                with trio.fail_after(self.timeout_s):
                    results = await trio.to_thread.run_sync(
                        self.load_many, todo, abandon_on_cancel=True, limiter=self._limiter
                    )
                for entry in todo:
                    data = results.get(entry.key)
                    if isinstance(data, bytes):
                        self._remember(entry, data)
            loaded = True
        except Exception as exc:  # the readers waiting on the batch fetch (and report) themselves
            log.debug("read-ahead batch failed: %r", exc)
        finally:
            for entry in todo:
                self._inflight.pop(self._cache_key(entry), None)
            done.set()
            try:
                on_done(loaded)
            except Exception:  # the scheduler's bookkeeping must never end the mount's loop
                log.exception("after a read-ahead batch")

    def _remember(self, entry: PathEntry, data: bytes) -> None:
        self.cache.put(self._cache_key(entry), data)
        if entry.size is None:
            self.learned_sizes[entry.key] = len(data)

    def peek(self, page_key: str, sha256: str | None) -> bytes | None:
        """The page with this key (a PathEntry's) and sha256 if it is in memory; counts nothing."""
        return self.cache.peek(self._memory_key(page_key, sha256))

    def release(self, page_key: str, sha256: str | None) -> None:
        """Drop a page the kernel now holds in its own page cache: it asks again only if it
        evicts the page, and then the shared cache or Chroma serves it."""
        self.cache.pop(self._memory_key(page_key, sha256))

    # -- worker-thread side --------------------------------------------------

    def _from_shared(self, entries: Sequence[PathEntry]) -> dict[str, bytes]:
        if self.shared is None:
            return {}
        found: dict[str, bytes] = {}
        values = self.shared.get_many([self._shared_key(e) for e in entries])
        for entry, value in zip(entries, values, strict=True):
            if value is None:
                continue
            try:
                check_bytes(value, Expected(entry.size, entry.sha256))
            except CorruptPage as exc:
                log.warning("ignoring the shared cache's copy of %s: %s", entry.key, exc)
                continue
            found[entry.key] = value
        return found

    def _load_one(self, entry: PathEntry) -> bytes:
        result = self.load_many([entry])[entry.key]
        if isinstance(result, PageUnavailable):
            raise result
        return result

    def load_cached(self, entries: Sequence[PathEntry]) -> dict[str, bytes | PageUnavailable]:
        """As `load_many`, with this process's page cache first and what was loaded kept in it:
        for callers with no loop (a command, the MCP server), one thread at a time."""
        loaded: dict[str, bytes | PageUnavailable] = {}
        for entry in entries:
            data = self.cache.get(self._cache_key(entry))
            if data is not None:
                loaded[entry.key] = data
        missing = [e for e in entries if e.key not in loaded]
        if missing:
            loaded.update(self.load_many(missing))
            for entry in missing:
                data = loaded[entry.key]
                if isinstance(data, bytes):
                    self._remember(entry, data)
        return loaded

    def load_many(self, entries: Sequence[PathEntry]) -> dict[str, bytes | PageUnavailable]:
        """Blocking (a worker thread, or a command with no loop): these pages, shared cache
        first, then one Chroma query for the rest; a page that cannot be had is a PageUnavailable."""
        loaded: dict[str, bytes | PageUnavailable] = dict(self._from_shared(entries))
        missing = [e for e in entries if e.key not in loaded]
        if not missing:
            return loaded
        started = time.perf_counter()
        try:
            chunks = self.chroma().fetch_many(missing)
        except Exception as exc:
            self.backend_errors["chroma"] += 1  # BackendError, or the collection vanished (SiteNotFound), ...
            log.error("%s", exc if isinstance(exc, BackendError) else f"reading from Chroma failed: {exc!r}")
            for entry in missing:
                loaded[entry.key] = PageUnavailable(entry.key)
            return loaded
        finally:
            self.backend_seconds["chroma"] += time.perf_counter() - started
        fresh: dict[str, bytes] = {}
        corrupt: dict[str, CorruptPage] = {}
        for entry in missing:
            try:
                data = reassemble(chunks[entry.key], self.joiner, Expected(entry.size, entry.sha256))
            except CorruptPage as exc:
                corrupt[entry.key] = exc
                continue
            loaded[entry.key] = fresh[self._shared_key(entry) if self.shared else entry.key] = data
        if corrupt:
            second = self._second_opinion([e for e in missing if e.key in corrupt], corrupt)
            for entry in missing:
                outcome = second.get(entry.key)
                if isinstance(outcome, bytes):
                    loaded[entry.key] = fresh[self._shared_key(entry) if self.shared else entry.key] = outcome
                elif outcome is not None:
                    log.error("page %s is corrupt: %s", entry.key, outcome)
                    loaded[entry.key] = PageUnavailable(entry.key)
        if self.shared is not None and fresh:
            self.shared.set_many(fresh)
        return loaded

    def _second_opinion(
        self, entries: list[PathEntry], errors: dict[str, CorruptPage]
    ) -> dict[str, bytes | CorruptPage]:
        """Pages that failed their checks as read from Chroma's SQLite file directly are read
        once more through chromadb; each comes back as its bytes or the reason it is corrupt."""
        outcome: dict[str, bytes | CorruptPage] = {e.key: errors[e.key] for e in entries}
        try:
            other = self.chroma().through_chromadb()
            if other is None:
                return outcome
            for entry in entries:
                log.warning(
                    "page %s failed its checks as read directly (%s): reading it through chromadb",
                    entry.key,
                    errors[entry.key],
                )
            chunks = other.fetch_many(entries)
        except Exception as exc:
            log.error("reading through chromadb failed: %s", exc)
            return outcome
        for entry in entries:
            try:
                outcome[entry.key] = reassemble(chunks[entry.key], self.joiner, Expected(entry.size, entry.sha256))
            except CorruptPage as exc:
                outcome[entry.key] = exc
        return outcome

    # -- warm start ---------------------------------------------------------

    async def preload(
        self, entries: Sequence[PathEntry], batch_pages: int = 200, after_batch: Callable[[], object] | None = None
    ) -> int:
        """Load pages in a few batched calls, calling `after_batch` after each; returns how
        many were loaded."""
        todo = [e for e in entries if e.blob is None and self._cache_key(e) not in self.cache]
        done = 0
        for start in range(0, len(todo), batch_pages):
            batch = todo[start : start + batch_pages]
            try:
                with trio.fail_after(self.timeout_s * 3):
                    results = await trio.to_thread.run_sync(
                        self.load_many, batch, abandon_on_cancel=True, limiter=self._limiter
                    )
            except trio.TooSlowError:
                log.warning("preload stopped: the backend is too slow")
                return done
            except Exception:
                log.exception("preload stopped")
                return done
            for entry in batch:
                data = results.get(entry.key)
                if isinstance(data, bytes):
                    self._remember(entry, data)
                    done += 1
            if after_batch is not None:
                after_batch()
        return done

    # -- blobs ---------------------------------------------------------------

    async def _read_blob(self, entry: PathEntry, offset: int, size: int) -> bytes:
        """Serve a range of a lazy file from fixed-size blocks, each fetched by one
        ranged request and kept in the bytes-bounded cache."""
        assert entry.blob is not None
        end = min(offset + size, entry.blob.size)
        if end <= offset:
            return b""
        first, last = offset // BLOB_BLOCK, (end - 1) // BLOB_BLOCK
        parts = [await self._blob_block(entry, block) for block in range(first, last + 1)]
        data = b"".join(parts)
        start = offset - first * BLOB_BLOCK
        return data[start : start + (end - offset)]

    async def _blob_block(self, entry: PathEntry, block: int) -> bytes:
        assert entry.blob is not None
        key = f"blob:{entry.blob.url}:{block}"
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        offset = block * BLOB_BLOCK
        length = min(BLOB_BLOCK, entry.blob.size - offset)
        try:
            data = await self._off_loop(read_blob_range, entry.blob.url, offset, length)
        except trio.TooSlowError:
            self.backend_errors["blob"] += 1
            raise
        except BlobError as exc:
            self.backend_errors["blob"] += 1
            log.error("reading %s: %s", entry.key, exc)
            raise PageUnavailable(entry.key) from exc
        if len(data) != length:
            log.error("reading %s: blob is shorter than the tree says", entry.key)
            raise PageUnavailable(entry.key)
        self.cache.put(key, data)
        return data
