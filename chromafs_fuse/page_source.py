"""Where page bytes come from: cache first, then Chroma or the blob store.

Runs on the trio loop; every blocking backend call goes to a worker thread
under a deadline, so a dead backend fails a read in seconds, never hangs it.
Concurrent reads of one page share a single fetch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import trio

from .blobstore import BlobError, read_blob_range
from .chroma_store import BackendError, ChromaPages
from .chunks import DEFAULT_JOINER, CorruptPage, Expected, reassemble
from .page_cache import PageCache
from .tree import PathEntry

log = logging.getLogger(__name__)
T = TypeVar("T")


class PageUnavailable(Exception):
    """The page cannot be served now (corrupt, backend down, timed out)."""


class PageSource:
    def __init__(
        self,
        pages: ChromaPages,
        cache: PageCache,
        tree_version: str,
        joiner: str = DEFAULT_JOINER,
        timeout_s: float = 10.0,
        max_backend_threads: int = 8,
    ) -> None:
        self.pages = pages
        self.cache = cache
        self.tree_version = tree_version
        self.joiner = joiner
        self.timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(max_backend_threads)
        self._inflight: dict[str, trio.Event] = {}
        self.learned_sizes: dict[str, int] = {}

    def _cache_key(self, entry: PathEntry) -> str:
        return f"{self.tree_version}:{entry.key}"

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        with trio.fail_after(self.timeout_s):
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._limiter)

    def size_of(self, entry: PathEntry) -> int | None:
        if entry.size is not None:
            return entry.size
        return self.learned_sizes.get(entry.key)

    async def read(self, entry: PathEntry, offset: int, size: int) -> bytes:
        if entry.blob is not None:
            return await self._read_blob(entry, offset, size)
        data = await self.page(entry)
        return data[offset : offset + size]

    async def page(self, entry: PathEntry) -> bytes:
        key = self._cache_key(entry)
        while True:
            data = self.cache.get(key)
            if data is not None:
                return data
            pending = self._inflight.get(key)
            if pending is None:
                break
            await pending.wait()
            if key in self._inflight or self.cache.get(key) is None:
                # The shared fetch failed (or the page does not fit the cache): fetch ourselves.
                break
        done = trio.Event()
        self._inflight[key] = done
        try:
            data = await self._fetch(entry)
            self.cache.put(key, data)
            self.learned_sizes[entry.key] = len(data)
            return data
        finally:
            del self._inflight[key]
            done.set()

    async def _fetch(self, entry: PathEntry) -> bytes:
        try:
            chunks = await self._off_loop(self.pages.fetch_chunks, entry)
        except trio.TooSlowError as exc:
            log.error("reading %s: Chroma did not answer within %.1fs", entry.key, self.timeout_s)
            raise PageUnavailable(entry.key) from exc
        except BackendError as exc:
            log.error("reading %s: %s", entry.key, exc)
            raise PageUnavailable(entry.key) from exc
        try:
            return reassemble(chunks, self.joiner, Expected(entry.size, entry.sha256))
        except CorruptPage as exc:
            log.error("page %s is corrupt: %s", entry.key, exc)
            raise PageUnavailable(entry.key) from exc

    async def _read_blob(self, entry: PathEntry, offset: int, size: int) -> bytes:
        assert entry.blob is not None
        length = max(0, min(size, entry.blob.size - offset))
        if length == 0:
            return b""
        try:
            data = await self._off_loop(read_blob_range, entry.blob.url, offset, length)
        except trio.TooSlowError as exc:
            log.error("reading %s: blob store did not answer within %.1fs", entry.key, self.timeout_s)
            raise PageUnavailable(entry.key) from exc
        except BlobError as exc:
            log.error("reading %s: %s", entry.key, exc)
            raise PageUnavailable(entry.key) from exc
        if len(data) != length:
            log.error("reading %s: blob is shorter than the tree says", entry.key)
            raise PageUnavailable(entry.key)
        return data
