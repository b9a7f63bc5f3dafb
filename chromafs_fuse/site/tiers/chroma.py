"""The Chroma tier, the store of record: a page's chunks fetched, put back together
(chunks.py) and checked against the tree's size and sha256.

A page that fails its checks as read from Chroma's SQLite file directly is read once more
through chromadb (a second opinion) before it is called corrupt; a corrupt page is left out
(the composer fails its read), never served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from chromafs_fuse.backends.chroma_store import BackendError, ChromaPages
from chromafs_fuse.chunks import JOINER, CorruptPage, Expected, reassemble
from chromafs_fuse.tree import PathEntry

log = logging.getLogger(__name__)


class ChromaTier:
    name = "chroma"

    def __init__(self, open_chroma: Callable[[], ChromaPages], joiner: str = JOINER) -> None:
        self._open_chroma = open_chroma
        self._chroma: ChromaPages | None = None
        self._lock = threading.Lock()
        self.joiner = joiner

    def client(self) -> ChromaPages:
        """The Chroma client, opened on first use (a mount booted from Redis may never need it)."""
        with self._lock:
            if self._chroma is None:
                self._chroma = self._open_chroma()
            return self._chroma

    def use(self, pages: ChromaPages) -> None:
        """A client already open (the loader read the tree through it)."""
        with self._lock:
            self._chroma = pages

    def fetch(self, entries: Sequence[PathEntry], tree_version: str) -> dict[str, bytes]:
        """One query for every page's chunks; BackendError when Chroma cannot be read."""
        try:
            chunks = self.client().fetch_many(entries)
        except BackendError:
            raise
        except Exception as exc:  # the collection vanished (SiteNotFound), ...
            raise BackendError(f"reading from Chroma failed: {exc or 'no reason given'}") from exc
        found: dict[str, bytes] = {}
        corrupt: dict[str, CorruptPage] = {}
        for entry in entries:
            try:
                found[entry.key] = self._reassemble(entry, chunks.get(entry.key, []))
            except CorruptPage as exc:
                corrupt[entry.key] = exc
        if corrupt:
            second = self._second_opinion([e for e in entries if e.key in corrupt], corrupt)
            for key, outcome in second.items():
                if isinstance(outcome, bytes):
                    found[key] = outcome
                else:
                    log.error("page %s is corrupt: %s", key, outcome)
        return found

    def fill(self, pages: Sequence[tuple[PathEntry, bytes]], tree_version: str) -> None:
        """The store of record keeps nothing it is given."""

    def _reassemble(self, entry: PathEntry, chunks: list[tuple[object, object]]) -> bytes:
        return reassemble(chunks, self.joiner, Expected(entry.size, entry.sha256))

    def _second_opinion(
        self, entries: list[PathEntry], errors: dict[str, CorruptPage]
    ) -> dict[str, bytes | CorruptPage]:
        """Pages that failed their checks as read from Chroma's SQLite file directly, read once
        more through chromadb; each comes back as its bytes or the reason it is corrupt."""
        outcome: dict[str, bytes | CorruptPage] = {e.key: errors[e.key] for e in entries}
        try:
            other = self.client().through_chromadb()
            if other is None:
                return outcome
            for entry in entries:
                log.warning(
                    "page %s failed its checks as read directly (%s): reading it through chromadb",
                    entry.key,
                    errors[entry.key],
                )
            chunks = other.fetch_many(entries)
        except Exception as exc:  # chromadb's errors share no base class: the first reading's outcome stands
            log.error("reading through chromadb failed: %s", exc)
            return outcome
        for entry in entries:
            try:
                outcome[entry.key] = self._reassemble(entry, chunks.get(entry.key, []))
            except CorruptPage as exc:
                outcome[entry.key] = exc
        return outcome
