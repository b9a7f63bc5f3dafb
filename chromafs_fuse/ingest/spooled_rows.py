"""The lexicon rows an ingest makes, kept in an unnamed temporary file until their buckets are
written: its memory holds where each row is, not its text (about a tenth), so a site's size
does not set it. A page whose vector is still being embedded stays in memory until it is in."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, MutableMapping

from chromafs_fuse.lexical import LexiconPage

Row = str | LexiconPage  # a row's text (lexical.encode_row), or its terms while its vector is embedded


class SpooledRows(MutableMapping[str, Row]):
    def __init__(self) -> None:
        # unnamed: gone when closed or when the process ends, however it ends
        self._file = tempfile.TemporaryFile(prefix="chromafs-rows-")  # noqa: SIM115 (closed by close())
        self._end = 0
        self._places: dict[str, tuple[int, int] | LexiconPage] = {}

    def __setitem__(self, key: str, row: Row) -> None:
        if isinstance(row, LexiconPage):
            self._places[key] = row
            return
        data = row.encode("utf-8")
        os.pwrite(self._file.fileno(), data, self._end)
        self._places[key] = (self._end, len(data))
        self._end += len(data)

    def __getitem__(self, key: str) -> Row:
        place = self._places[key]
        if isinstance(place, LexiconPage):
            return place
        start, size = place
        return os.pread(self._file.fileno(), size, start).decode("utf-8")

    def __delitem__(self, key: str) -> None:
        del self._places[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)

    def close(self) -> None:
        self._file.close()
