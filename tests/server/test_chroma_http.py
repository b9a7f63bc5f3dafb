"""The standard-library REST adapter against a real Chroma server: the same answers as chromadb's
own client, errors, reconnects, and a mount daemon that never imports chromadb."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import chromadb
import pytest
from chromadb.config import Settings

from chromafs_fuse.backends.chroma_http import ChromaHttpError, HttpCollection, check_server_version
from chromafs_fuse.backends.chroma_http import ChromaServer as ChromaServerClient
from chromafs_fuse.backends.chroma_store import BackendError, ChromaLocation, ChromaPages, SiteNotFound
from chromafs_fuse.grep import GrepQuery, candidate_pages
from chromafs_fuse.names import PAGE_FIELD, TREE_RECORD_ID
from chromafs_fuse.tree import parse_tree
from infra import SAMPLE_SITE, ChromaServer, chromadb_libraries_loaded, expected_visible, ingest, mounted, try_mount

SITE = "http-adapter"


def _client(url: str, **scope: str) -> Any:
    parsed = urlparse(url)
    settings = Settings(anonymized_telemetry=False)
    return chromadb.HttpClient(host=parsed.hostname, port=parsed.port, settings=settings, **scope)  # type: ignore[arg-type]


def _records(result: dict[str, Any]) -> dict[str, tuple[object, object]]:
    """id -> (document, metadata), so answers compare whatever their order."""
    ids = result["ids"]
    documents = result.get("documents") or [None] * len(ids)
    metadatas = result.get("metadatas") or [None] * len(ids)
    assert len(documents) == len(metadatas) == len(ids)
    return {i: (d, m) for i, d, m in zip(ids, documents, metadatas, strict=True)}


@pytest.fixture(scope="module")
def served_site(chroma_server, tmp_path_factory: pytest.TempPathFactory) -> str:  # type: ignore[no-untyped-def]
    blobs = tmp_path_factory.mktemp("http-blobs")
    ingest(SAMPLE_SITE, "--site", SITE, "--chroma-url", chroma_server.url, "--blob-store", blobs.as_uri(), "--quiet")
    return str(chroma_server.url)


@pytest.fixture
def own_server(fresh_chroma_server: Callable[..., ChromaServer]) -> ChromaServer:
    """A server of this test's own: it is stopped and restarted on purpose."""
    return fresh_chroma_server()


def test_get_answers_as_chromadb_does(served_site: str) -> None:
    ours = HttpCollection.open(served_site, SITE, timeout_s=10)
    theirs = _client(served_site).get_collection(SITE, embedding_function=None)
    assert ours.name == theirs.name == SITE and ours.id == str(theirs.id)

    tree = ours.get(ids=[TREE_RECORD_ID], include=["documents", "metadatas"])
    assert _records(tree) == _records(theirs.get(ids=[TREE_RECORD_ID], include=["documents", "metadatas"]))
    assert list(_records(tree)) == [TREE_RECORD_ID]

    entries = parse_tree(tree["documents"][0]).entries
    slugs = sorted({s for e in entries.values() for s in (e.key, "/" + e.key, e.source_key)})
    by_page = {PAGE_FIELD: {"$in": slugs}}
    calls: list[dict[str, Any]] = [
        {"where": by_page, "include": ["documents", "metadatas"]},
        {"where": by_page, "where_document": {"$contains": "the"}, "include": ["documents", "metadatas"]},
        {"where": by_page, "where_document": {"$regex": "(?m)^## "}, "include": ["documents", "metadatas"]},
        {"where": by_page, "include": ["metadatas"]},
        {"where": {PAGE_FIELD: {"$in": sorted(entries)[:3]}}, "include": ["documents"]},
    ]
    for kwargs in calls:
        got, expected = ours.get(**kwargs), theirs.get(**kwargs)
        assert _records(got) == _records(expected), kwargs
        assert got["ids"], kwargs  # not vacuous
        for field in ("documents", "metadatas"):
            assert (got[field] is None) == (expected[field] is None) == (field not in kwargs["include"]), field
    assert len(ours.get(where=by_page, include=["metadatas"])["ids"]) > len(entries)  # pages have several chunks

    # What ChromaPages makes of them is the same too.
    visible = list(entries.values())
    assert ChromaPages(ours).fetch_many(visible) == ChromaPages(theirs).fetch_many(visible)

    # search.py relies on a get that Chroma cannot evaluate raising.
    with pytest.raises(ChromaHttpError) as info:
        ours.get(where=by_page, where_document={"$regex": "(?m)^wor("}, include=["metadatas"])
    assert info.value.status == 400 and "regex" in str(info.value).lower() and "\n" not in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 - chromadb raises its own kind
        theirs.get(where=by_page, where_document={"$regex": "(?m)^wor("}, include=["metadatas"])
    for query in (GrepQuery("Install"), GrepQuery("install", fixed=True, ignore_case=True), GrepQuery("^## ")):
        found = candidate_pages(ChromaPages(ours), visible, query)
        assert found and found == candidate_pages(ChromaPages(theirs), visible, query), query
    assert candidate_pages(ChromaPages(ours), visible, GrepQuery("wor(")) is None
    ours.close()


def test_missing_collection_tenant_and_database(served_site: str) -> None:
    with pytest.raises(SiteNotFound, match="no collection 'no-such-site'"):
        ChromaPages.open(ChromaLocation(url=served_site, collection="no-such-site"))
    with pytest.raises(BackendError, match=r"Tenant \[no-such-tenant\] not found"):
        ChromaPages.open(ChromaLocation(url=served_site, collection=SITE, tenant="no-such-tenant"))
    with pytest.raises(BackendError, match=r"404 NotFoundError: Database \[no-such-db\] not found"):
        ChromaPages.open(ChromaLocation(url=served_site, collection=SITE, database="no-such-db"))
    with pytest.raises(BackendError, match=r"--chroma-url must be http\(s\)://host:port, got 'ftp://x'"):
        ChromaPages.open(ChromaLocation(url="ftp://x", collection=SITE))


def test_server_down_fails_fast_and_the_same_object_reconnects(own_server: ChromaServer) -> None:
    collection = _client(own_server.url).create_collection("reconnect", embedding_function=None)
    collection.add(ids=[TREE_RECORD_ID], documents=["{}"], embeddings=[[0.0, 1.0]])
    pages = ChromaPages.open(ChromaLocation(url=own_server.url, collection="reconnect"), timeout_s=5)
    assert pages.load_tree_document()[0] == "{}"

    # Restarted while idle: the kept-alive connection is dead; the next call reopens it.
    own_server.stop()
    own_server.start()
    assert pages.load_tree_document()[0] == "{}"

    own_server.stop()
    started = time.monotonic()
    with pytest.raises(BackendError, match="reading the path tree failed: no answer"):
        pages.load_tree_document()
    assert time.monotonic() - started < 3
    started = time.monotonic()
    refused = r"cannot open Chroma at http://127\.0\.0\.1:\d+ collection=reconnect: no answer"
    with pytest.raises(BackendError, match=refused):
        ChromaPages.open(ChromaLocation(url=own_server.url, collection="reconnect"), timeout_s=5)
    assert time.monotonic() - started < 3

    own_server.start()  # same port, same data
    assert pages.load_tree_document()[0] == "{}"
    pages.collection.close()


def test_mount_reads_through_the_adapter_without_chromadb(
    served_site: str, mnt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHROMAFS_MOUNTD_SOCKET", raising=False)  # a daemon of its own, not a mount server's child
    visible = sorted(expected_visible(SAMPLE_SITE, "public", None))
    with mounted(mnt, "--site", SITE, "--chroma-url", served_site, "--preload", "off"):
        for rel in visible:
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes(), rel
        loaded = chromadb_libraries_loaded(mnt)
        assert not loaded, f"the daemon loaded chromadb or its dependencies: {loaded}"


def test_tenant_and_database(chroma_server, mnt: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parsed = urlparse(chroma_server.url)
    admin = chromadb.AdminClient(
        Settings(
            chroma_api_impl="chromadb.api.fastapi.FastAPI",
            chroma_server_host=parsed.hostname,
            chroma_server_http_port=parsed.port,
            anonymized_telemetry=False,
        )
    )
    tenant, database, site = "chromafs-tenant", "docs-db", "tenanted"
    admin.create_tenant(tenant)
    admin.create_database(database, tenant=tenant)
    scope = ["--chroma-tenant", tenant, "--chroma-database", database]
    args = ["--site", site, "--chroma-url", chroma_server.url, *scope]
    ingest(SAMPLE_SITE, *args, "--blob-store", (tmp_path / "blobs").as_uri(), "--quiet")

    pages = ChromaPages.open(ChromaLocation(url=chroma_server.url, collection=site, tenant=tenant, database=database))
    theirs = _client(chroma_server.url, tenant=tenant, database=database).get_collection(site, embedding_function=None)
    tree = pages.collection.get(ids=[TREE_RECORD_ID])
    assert _records(tree) == _records(theirs.get(ids=[TREE_RECORD_ID]))
    pages.collection.close()

    visible = sorted(p for p in expected_visible(SAMPLE_SITE, "public", None) if p.endswith((".md", ".mdx")))
    with mounted(mnt, *args, "--preload", "off"):
        for rel in visible:
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes(), rel
    # Not in the default tenant and database: the site is refused with one line.
    refused = try_mount(mnt, "--site", site, "--chroma-url", chroma_server.url)
    assert refused.returncode == 1
    assert refused.stderr.startswith("chromafs-mount: ") and refused.stderr.count("\n") == 1, refused.stderr
    assert f"no collection '{site}'" in refused.stderr
    assert not os.path.ismount(mnt)


def test_the_server_version_is_checked_at_open(served_site: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="chromafs_fuse.backends.chroma_http"):
        HttpCollection.open(served_site, SITE, timeout_s=10)
    assert "version" not in caplog.text, "the server the tests run is one chromafs was tested with"


@pytest.mark.parametrize(
    ("answer", "warning"),
    [(b'"0.6.3"', "version 0.6.3"), (b'"2.0.0"', "version 2.0.0"), (b"{}", "did not say which version")],
)
def test_an_untested_server_version_is_named(answer: bytes, warning: str, caplog: pytest.LogCaptureFixture) -> None:
    """A loopback HTTP peer that answers /api/v2/version with another version."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with caplog.at_level("WARNING", logger="chromafs_fuse.backends.chroma_http"):
            check_server_version(ChromaServerClient(f"http://127.0.0.1:{server.server_address[1]}", None, 5))
    finally:
        server.shutdown()
        server.server_close()
    assert warning in caplog.text


class BusyProxy:
    """A loopback HTTP proxy in front of a real Chroma server that answers "503 Service
    Unavailable" (Retry-After: 0) to the first `busy` requests, as a server under load or a proxy
    in front of one does, and forwards the rest."""

    def __init__(self, upstream: str, busy: int) -> None:
        import http.client
        import http.server
        import threading

        self.busy, self.seen = busy, 0
        host, port = urlparse(upstream).hostname, urlparse(upstream).port
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.seen += 1
                if proxy.seen <= proxy.busy:
                    payload = b'{"error": "ServiceUnavailable", "message": "busy"}'
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                else:
                    upstream_conn = http.client.HTTPConnection(host, port, timeout=10)
                    upstream_conn.request(self.command, self.path, body=body or None, headers=dict(self.headers))
                    answer = upstream_conn.getresponse()
                    payload = answer.read()
                    upstream_conn.close()
                    self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> BusyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_busy_server_is_asked_again_within_the_timeout(served_site: str) -> None:
    """Every request of the adapter only reads: a busy answer (here 503) is asked again, backing
    off, until the timeout has passed since the first try; then the busy answer is the error."""
    with BusyProxy(served_site, busy=4) as proxy:
        collection = HttpCollection.open(proxy.url, SITE, timeout_s=5)
        tree = collection.get(ids=[TREE_RECORD_ID], include=["documents"])
        assert tree["ids"] == [TREE_RECORD_ID] and proxy.seen > proxy.busy  # the busy answers, then the real ones
    with BusyProxy(served_site, busy=10**6) as proxy:
        started = time.monotonic()
        with pytest.raises(ChromaHttpError) as info:
            HttpCollection.open(proxy.url, SITE, timeout_s=1)
        took = time.monotonic() - started
    assert info.value.status == 503 and 1.0 <= took < 3.0, took
    assert proxy.seen > 3, "it gave up without asking again"
