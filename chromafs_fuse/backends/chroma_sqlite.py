"""An embedded Chroma directory read through its SQLite file, without chromadb.

Opening a collection with chromadb costs a mount about 1.6 s before it can
answer `ls` (0.7 s to import it, ~0.9 s on the first call to load the vector
index, which a filesystem never uses) and hundreds of megabytes. Everything a
mount reads - the tree record and the chunks of pages, by id or by the page
field - is in Chroma's SQLite metadata segment, so this adapter reads it
there, read-only, with the standard library.

It is an optimisation with a safe way out: chromadb is used instead
(`fallback`) when the file's layout is not the one this adapter knows, when
the collection's write-ahead log holds records the metadata segment has not
applied yet, and for any query other than the two a mount makes. Every page
is still checked against the tree's size and sha256 before a byte is served.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)
DOCUMENT_KEY = "chroma:document"
METADATA_SEGMENT = ("METADATA", "urn:chroma:segment/metadata/sqlite")
MAX_PARAMETERS = 500  # per IN (...) list, under SQLite's variable limit
_LAYOUT = {
    "databases": {"id", "name", "tenant_id"},
    "collections": {"id", "name", "database_id"},
    "segments": {"id", "type", "scope", "collection"},
    "embeddings": {"id", "segment_id", "embedding_id"},
    "embedding_metadata": {"id", "key", "string_value", "int_value", "float_value", "bool_value"},
    "max_seq_id": {"segment_id", "seq_id"},
    "embeddings_queue": {"seq_id", "topic"},
}
# The newest schema migration of each kind this adapter was tested with (files of chromadb 1.5).
# A file migrated further was written by a newer Chroma: chromadb reads it instead.
KNOWN_MIGRATIONS = {"sysdb": 10, "metadb": 6, "embeddings_queue": 2}


def _connect(database: str, timeout_s: float) -> sqlite3.Connection:
    uri = "file:" + database.replace("?", "%3f").replace("#", "%23") + "?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False)


def _batches(values: Sequence[Any]) -> list[Sequence[Any]]:
    return [values[i : i + MAX_PARAMETERS] for i in range(0, len(values), MAX_PARAMETERS)]


def collection_names(directory: str, tenant: str, database: str, timeout_s: float) -> list[str] | None:
    """The names of the collections in an embedded Chroma's database, or None when its file cannot
    be read this way."""
    path = os.path.join(directory, "chroma.sqlite3")
    try:
        connection = _connect(path, timeout_s)
        try:
            rows = connection.execute(
                "SELECT c.name FROM collections c JOIN databases d ON d.id = c.database_id"
                " WHERE d.name = ? AND d.tenant_id = ? ORDER BY c.name",
                (database, tenant),
            ).fetchall()
        finally:
            connection.close()
    except sqlite3.Error:
        return None
    return [str(row[0]) for row in rows]


class SqliteCollection:
    """The part of chromadb's Collection API a mount uses, answered from SQLite."""

    def __init__(
        self,
        database: str,
        name: str,
        collection_id: str,
        segment_id: str,
        fallback: Callable[[], Any],
        timeout_s: float,
    ) -> None:
        self.name = name
        self._database = database
        self._collection_id = collection_id
        self._segment_id = segment_id
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._fallback_factory = fallback
        self._fallback: Any = None
        self._fallback_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        directory: str,
        name: str,
        fallback: Callable[[], Any],
        tenant: str = "default_tenant",
        database: str = "default_database",
        timeout_s: float = 10.0,
    ) -> SqliteCollection | None:
        """The collection, or None when this directory cannot be read this way (chromadb then
        opens it, and reports a missing collection in its own words)."""
        path = os.path.join(directory, "chroma.sqlite3")
        if not os.path.isfile(path):
            return None
        try:
            connection = _connect(path, timeout_s)
            try:
                migrations = dict(connection.execute("SELECT dir, max(version) FROM migrations GROUP BY dir"))
                unknown = {d: v for d, v in migrations.items() if v > KNOWN_MIGRATIONS.get(d, -1)}
                if unknown:
                    log.info(
                        "Chroma's SQLite file has migrations this adapter does not know (%s); using chromadb",
                        ", ".join(f"{d} {v}" for d, v in sorted(unknown.items())),
                    )
                    return None
                for table, columns in _LAYOUT.items():
                    have = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
                    if not columns <= have:
                        log.info("Chroma's SQLite layout is not the known one (%s); using chromadb", table)
                        return None
                row = connection.execute(
                    "SELECT c.id FROM collections c JOIN databases d ON d.id = c.database_id"
                    " WHERE c.name = ? AND d.name = ? AND d.tenant_id = ?",
                    (name, database, tenant),
                ).fetchone()
                if row is None:
                    return None
                segments = connection.execute(
                    "SELECT id FROM segments WHERE collection = ? AND scope = ? AND type = ?",
                    (row[0], *METADATA_SEGMENT),
                ).fetchall()
                if len(segments) != 1:
                    return None
            finally:
                connection.close()
        except sqlite3.Error as exc:
            log.info("cannot read %s directly (%s); using chromadb", path, exc)
            return None
        return cls(path, name, str(row[0]), str(segments[0][0]), fallback, timeout_s)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = _connect(self._database, self._timeout_s)
        return connection

    def chromadb(self) -> Any:
        """The same collection opened with chromadb (opened once, on first use)."""
        with self._fallback_lock:
            if self._fallback is None:
                self._fallback = self._fallback_factory()
            return self._fallback

    @property
    def metadata(self) -> Any:
        """The collection's own metadata, as chromadb gives it."""
        return self.chromadb().metadata

    def is_current(self) -> bool:
        """True when the metadata segment has applied every record in the collection's log."""
        connection = self._connection()
        segment = (self._segment_id,)
        applied = connection.execute("SELECT seq_id FROM max_seq_id WHERE segment_id = ?", segment).fetchone()
        newest = connection.execute(
            "SELECT max(seq_id) FROM embeddings_queue WHERE topic LIKE ?", (f"%{self._collection_id}",)
        ).fetchone()[0]
        if newest is None:
            return True
        return applied is not None and isinstance(applied[0], int) and applied[0] >= newest

    def get(self, ids: Sequence[str] | None = None, where: Any = None, **kwargs: Any) -> dict[str, Any]:
        in_filter = _page_filter(where)
        direct = not kwargs.keys() - {"include"} and (ids is not None) != (in_filter is not None)
        if direct and self.is_current():
            if ids is not None:
                rows = self._ids_where("embedding_id", list(ids))
            else:
                assert in_filter is not None
                rows = self._ids_by_metadata(*in_filter)
            return self._records(rows, with_metadata="metadatas" in kwargs.get("include", ("metadatas",)))
        if direct:
            log.info("collection %s has writes Chroma has not applied yet: reading through chromadb", self.name)
        return dict(self.chromadb().get(ids=ids, where=where, **kwargs))

    def _row_ids(self, query: str, values: list[str], before: tuple[str, ...], after: tuple[str, ...]) -> list[int]:
        """Run `query` (its `{marks}` an IN list) over `values` in batches; the rows' ids."""
        connection = self._connection()
        found: list[int] = []
        for batch in _batches(values):
            sql = query.format(marks=",".join("?" * len(batch)))
            found += [row[0] for row in connection.execute(sql, (*before, *batch, *after))]
        return found

    def _ids_where(self, column: str, values: list[str]) -> list[int]:
        query = f"SELECT id FROM embeddings WHERE segment_id = ? AND {column} IN ({{marks}})"
        return self._row_ids(query, values, (self._segment_id,), ())

    def _ids_by_metadata(self, key: str, values: list[str]) -> list[int]:
        query = (
            "SELECT m.id FROM embedding_metadata m JOIN embeddings e ON e.id = m.id"
            " WHERE m.key = ? AND m.string_value IN ({marks}) AND e.segment_id = ?"
        )
        return self._row_ids(query, values, (key,), (self._segment_id,))

    def _records(self, rows: list[int], with_metadata: bool = True) -> dict[str, Any]:
        connection = self._connection()
        # Chroma keeps each record's document among its metadata rows, under DOCUMENT_KEY.
        only_document = "" if with_metadata else " AND key = ?"
        record_ids: dict[int, str] = {}
        documents: dict[int, str | None] = {}
        metadatas: dict[int, dict[str, Any]] = {}
        for batch in _batches(sorted(set(rows))):
            marks = ",".join("?" * len(batch))
            for row_id, embedding_id in connection.execute(
                f"SELECT id, embedding_id FROM embeddings WHERE id IN ({marks})", batch
            ):
                record_ids[row_id] = embedding_id
            for row_id, key, text, integer, real, boolean in connection.execute(
                "SELECT id, key, string_value, int_value, float_value, bool_value"
                f" FROM embedding_metadata WHERE id IN ({marks}){only_document}",
                (*batch, DOCUMENT_KEY) if only_document else batch,
            ):
                if key == DOCUMENT_KEY:
                    documents[row_id] = text
                    continue
                if text is not None:
                    value: Any = text
                elif integer is not None:
                    value = integer
                elif real is not None:
                    value = real
                elif boolean is not None:
                    value = bool(boolean)
                else:
                    continue
                metadatas.setdefault(row_id, {})[key] = value
        order = sorted(record_ids)
        return {
            "ids": [record_ids[r] for r in order],
            "documents": [documents.get(r) for r in order],
            "metadatas": [metadatas.get(r) for r in order] if with_metadata else None,
        }


def _page_filter(where: Any) -> tuple[str, list[str]] | None:
    """(field, values) for `{field: {"$in": [str, ...]}}`, the one filter a mount uses."""
    if not isinstance(where, dict) or len(where) != 1:
        return None
    ((field, condition),) = where.items()
    if not isinstance(field, str) or field.startswith("$") or not isinstance(condition, dict):
        return None
    values = condition.get("$in") if len(condition) == 1 else None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return field, values
