"""A Chroma server's REST API (v2) with the standard library: reads, and an existing
collection's upserts and deletes for a re-ingest (importing chromadb costs a re-ingest ~1.2 s).

The mount daemon needs one call, a collection's `get`; importing the chromadb
package for it costs ~0.7 s and ~100 MB. This adapter sends the requests
chromadb's HttpClient sends (chromadb/api/fastapi.py), with the same bodies:

    GET  /api/v2/tenants/{tenant}/databases/{database}/collections/{name}
    POST /api/v2/tenants/{tenant}/databases/{database}/collections/{id}/get

Tenant and database default to `default_tenant` and `default_database`, as
HttpClient's do (it also asks /auth/identity, but with default settings it
ignores the answer, so ingest and mount always agree on where a site is).

Calls are blocking and thread-safe: each thread keeps one keep-alive
connection, and a kept-alive connection the server has closed (an idle
timeout, a restart) is reopened once. Every request has the timeout on
connect and on each read. Every request here only reads or writes records under
given ids (the same answer when asked twice), so a busy answer (429, 502, 503,
504: a server under an ingest, a proxy in front of one) is asked again, backing
off, until the timeout has passed since the first try.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlparse

from chromafs_fuse import __version__
from chromafs_fuse.errors import NotFound, Unavailable

API_PATH = "/api/v2"
log = logging.getLogger(__name__)
CHROMA_TENANT = "default_tenant"
CHROMA_DATABASE = "default_database"
GET_INCLUDE = ("documents", "metadatas")
# Chroma server versions this adapter was tested against (major, minor), oldest and newest.
TESTED_SERVER_VERSIONS = ((1, 0), (1, 5))
BUSY = frozenset({429, 502, 503, 504})  # "try again later": a read is asked again within its deadline
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.05, 1.0


class ChromaHttpError(Unavailable, RuntimeError):
    """Chroma answered with an error status; `error_name` is Chroma's (NotFoundError, ...)."""

    def __init__(self, status: int, error_name: str, detail: str, retry_after: str | None = None) -> None:
        self.status = status
        self.error_name = error_name
        self.detail = detail
        self.retry_after = retry_after  # the Retry-After header of a busy answer
        super().__init__(f"HTTP {status} {error_name or _reason(status)}: {detail}")


class CollectionNotFound(NotFound, ChromaHttpError):
    """The tenant and database exist, the collection does not."""


class ChromaUnreachable(Unavailable, RuntimeError):
    """No answer: connection refused, dropped or timed out."""


def parse_server_url(url: str) -> tuple[bool, str, int]:
    """(https, host, port) of a Chroma server URL; ValueError unless it is http(s)://host[:port]."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1:
        raise ValueError(f"--chroma-url must be http(s)://host:port, got {url!r}")
    https = parsed.scheme == "https"
    return https, parsed.hostname, port or (443 if https else 8000)


class ChromaServer:
    """JSON requests to one Chroma server: a keep-alive connection per thread."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self.https, self.host, self.port = parse_server_url(url)
        self.timeout_s = timeout_s
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"chromafs/{__version__}",
            **dict(headers or {}),
        }
        self._local = threading.local()
        self._all: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._lock = threading.Lock()

    def request(self, method: str, path: str, body: object = None) -> Any:
        """The decoded JSON answer; ChromaHttpError on an error status (a busy one once the
        timeout has passed since the first try), ChromaUnreachable on no answer."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        deadline = time.monotonic() + self.timeout_s
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                return self._request_once(method, path, data)
            except ChromaHttpError as exc:
                remaining = deadline - time.monotonic()
                if exc.status not in BUSY or remaining <= 0:
                    raise
                wait = min(backoff, _retry_after(exc), remaining)
                log.debug("Chroma is busy (%s): asking again in %.2f s", exc, wait)
                time.sleep(wait)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _request_once(self, method: str, path: str, data: bytes | None) -> Any:
        for attempt in (1, 2):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request(method, API_PATH + path, body=data, headers=self._headers)
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if attempt == 1 and reused and not isinstance(exc, TimeoutError):
                    continue  # the server closed a kept-alive connection: once more on a new one
                raise ChromaUnreachable(self._failure(exc)) from exc
            return _decode(response.status, payload, response.getheader("Retry-After"))
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every thread's connection (a later request opens a new one)."""
        with self._lock:
            connections = list(self._all)
        for conn in connections:
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.https:
                import ssl

                context = ssl.create_default_context()
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._all.add(conn)
        return conn

    def _failure(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout_s:g} s"
        if isinstance(exc, http.client.RemoteDisconnected):
            return "the server closed the connection without answering"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "no reason given"
        return f"no answer from {self.host}:{self.port}: {reason}"  # which server: its caller may not say


class HttpCollection:
    """A collection on a Chroma server, read with `get` the way chromadb's Collection reads it."""

    def __init__(
        self,
        server: ChromaServer,
        tenant: str,
        database: str,
        collection_id: str,
        name: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.tenant = tenant
        self.database = database
        self.id = collection_id
        self.name = name
        self.metadata = metadata  # the collection's own, as chromadb's Collection.metadata
        self._get_path = f"{_database_path(tenant, database)}/collections/{_segment(collection_id)}/get"

    @classmethod
    def open(
        cls,
        url: str,
        name: str,
        headers: Mapping[str, str] | None = None,
        tenant: str | None = None,
        database: str | None = None,
        timeout_s: float = 10.0,
    ) -> HttpCollection:
        """Look the collection up by name (one request). CollectionNotFound if it does not exist;
        ChromaHttpError naming the tenant or database if one of those does not."""
        server = ChromaServer(url, headers, timeout_s)
        check_server_version(server)
        tenant = tenant or CHROMA_TENANT
        database = database or CHROMA_DATABASE
        base = _database_path(tenant, database)
        try:
            model = server.request("GET", f"{base}/collections/{_segment(name)}")
        except ChromaHttpError as exc:
            if exc.status == 404 and (exc.error_name == "NotFoundError" or "does not exist" in exc.detail):
                # The server answers the same for a missing tenant or database: say which.
                server.request("GET", f"/tenants/{_segment(tenant)}")
                server.request("GET", base)
                raise CollectionNotFound(exc.status, exc.error_name, exc.detail) from exc
            raise
        if not isinstance(model, dict) or not isinstance(model.get("id"), str):
            raise ChromaHttpError(200, "", f"collection lookup answered without an id: {_snippet(model)}")
        metadata = model.get("metadata")
        return cls(
            server,
            tenant,
            database,
            model["id"],
            str(model.get("name") or name),
            metadata if isinstance(metadata, dict) else None,
        )

    def get(
        self,
        ids: Sequence[str] | None = None,
        where: Mapping[str, Any] | None = None,
        where_document: Mapping[str, Any] | None = None,
        include: Iterable[str] = GET_INCLUDE,
        limit: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        """Records by id and/or filter, in chromadb's GetResult shape (ids, documents, metadatas, ...)."""
        included = list(include)
        body = {
            "ids": None if ids is None else list(ids),
            "where": where,
            "limit": limit,
            "offset": offset,
            "where_document": where_document,
            "include": [i for i in included if i != "data"],  # chromadb hydrates "data" itself
        }
        result = self.server.request("POST", self._get_path, body)
        if not isinstance(result, dict) or not isinstance(result.get("ids"), list):
            raise ChromaHttpError(200, "", f"get answered without ids: {_snippet(result)}")
        return {
            "ids": result["ids"],
            "embeddings": result.get("embeddings"),
            "documents": result.get("documents"),
            "uris": result.get("uris"),
            "data": None,
            "metadatas": result.get("metadatas"),
            "included": included,
        }

    def upsert(
        self,
        ids: Sequence[str],
        embeddings: Sequence[Sequence[float]],
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        documents: Sequence[str | None] | None = None,
    ) -> None:
        """Records written under `ids` (replaced where they exist), as chromadb's upsert."""
        body = {
            "ids": list(ids),
            "embeddings": [[float(x) for x in vector] for vector in embeddings],
            "metadatas": None if metadatas is None else [None if m is None else dict(m) for m in metadatas],
            "documents": None if documents is None else list(documents),
            "uris": None,
        }
        self.server.request("POST", self._get_path.removesuffix("/get") + "/upsert", body)

    def delete(self, ids: Sequence[str] | None = None, where: Mapping[str, Any] | None = None) -> None:
        body = {"ids": None if ids is None else list(ids), "where": where, "where_document": None}
        self.server.request("POST", self._get_path.removesuffix("/get") + "/delete", body)

    def max_batch_size(self) -> int:
        """The most records the server takes in one write (its pre-flight checks); -1 if it says none."""
        checks = self.server.request("GET", "/pre-flight-checks")
        size = checks.get("max_batch_size") if isinstance(checks, dict) else None
        return size if isinstance(size, int) else -1

    def close(self) -> None:
        self.server.close()


def collection_names(
    url: str, headers: Mapping[str, str] | None, tenant: str | None, database: str | None, timeout_s: float
) -> list[str]:
    """The names of the collections of a Chroma server's database (the first 1000). Raises
    ChromaHttpError or ChromaUnreachable."""
    server = ChromaServer(url, headers, timeout_s)
    try:
        base = _database_path(tenant or CHROMA_TENANT, database or CHROMA_DATABASE)
        models = server.request("GET", f"{base}/collections?limit=1000")
    finally:
        server.close()
    if not isinstance(models, list):
        raise ChromaHttpError(200, "", f"the collections answered as {_snippet(models)}")
    return sorted(str(m["name"]) for m in models if isinstance(m, dict) and isinstance(m.get("name"), str))


def _segment(value: str) -> str:
    return quote(value, safe="")


def _database_path(tenant: str, database: str) -> str:
    return f"/tenants/{_segment(tenant)}/databases/{_segment(database)}"


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _snippet(value: object, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    text = " ".join(text.split())  # one line: Chroma's messages (a regex error) span several
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _retry_after(exc: ChromaHttpError) -> float:
    """Seconds the server asked to wait (Retry-After in seconds), else no bound."""
    try:
        return max(0.0, float(exc.retry_after)) if exc.retry_after else float("inf")
    except ValueError:
        return float("inf")  # an HTTP date: our own backoff


def _decode(status: int, payload: bytes, retry_after: str | None = None) -> Any:
    if 200 <= status < 300:
        try:
            return json.loads(payload)
        except ValueError:
            raise ChromaHttpError(status, "", f"answer is not JSON: {_snippet(payload)}") from None
    kind, message = "", _snippet(payload) or _reason(status)
    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    if isinstance(body, dict):
        kind = str(body.get("error") or "")
        message = _snippet(body.get("message") or body.get("detail") or message)
    raise ChromaHttpError(status, kind, message, retry_after)


def check_server_version(server: ChromaServer) -> str | None:
    """The server's version; a warning when it is outside the versions this adapter was tested with."""
    try:
        version = server.request("GET", "/version")
    except ChromaHttpError:
        version = None
    parts = str(version).split(".") if isinstance(version, str) else []
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        log.warning("the Chroma server did not say which version it is; tested with %s", _tested())
        return None
    oldest, newest = TESTED_SERVER_VERSIONS
    if not oldest <= major_minor <= newest:
        log.warning("the Chroma server is version %s; chromafs was tested with %s", version, _tested())
    return str(version)


def _tested() -> str:
    (a, b), (c, d) = TESTED_SERVER_VERSIONS
    return f"{a}.{b} to {c}.{d}"
