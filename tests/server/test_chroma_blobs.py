"""Binary files kept in Chroma itself, for a site on a Chroma server with no blob store (issue 38):
the sample site plus pages with odd bytes ingests clean, every reader's mount equals the same tree
ingested embedded (a file blob store) byte for byte, through every reader backend, and no grep or
search ever sees the pieces."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import chromadb
import pytest

from chromafs_fuse.backends.chroma_sqlite import SqliteCollection
from chromafs_fuse.backends.chroma_store import ChromaLocation, ChromaPages
from chromafs_fuse.blob_pieces import PIECE_BYTES
from chromafs_fuse.names import BLOB_DATA_FIELD, BLOB_PIECE_FIELD, BLOB_SHA_FIELD, blob_piece_id
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.tree import parse_tree
from infra import (
    BIN,
    INGEST,
    SAMPLE_SITE,
    ChromaServer,
    MountServer,
    child_env,
    copy_subset,
    expected_visible,
    mounted,
    reader_args,
    run,
    try_mount,
)

SITE = "acme"  # the tokens' site
COLLECTION = "blobs-acme"
BIG = "data/big.bin"  # three pieces
# Files with odd bytes: (bytes, visible to an anonymous reader)
ODD = {
    "odd/latin1-public.md": (b"---\npublic: true\ntitle: Caf\xe9\n---\n# Caf\xe9 cr\xe8me\n\nPrix: 5\xa4\n", True),
    "odd/latin1-admin.md": (b"---\ngroups: [admin]\n---\n# R\xe9serv\xe9\n\nna\xefve\n", False),
    "odd/nul.md": (b"---\npublic: true\n---\n# Authors\n\nby jane\x00doe\n", True),
    "odd/nul-latin1.md": (b"---\ngroups: [admin]\n---\n# Both\n\nnul\x00 and \xff\xfe\n", False),
    "data/blob.bin": (bytes(range(256)) * 8, True),
    "images/logo-copy.png": ((SAMPLE_SITE / "images/logo.png").read_bytes(), True),  # same bytes as logo.png
}
BINARIES = {"images/logo.png", "images/diagram.png", "images/logo-copy.png", "data/blob.bin", BIG}
BINARIES |= {"odd/latin1-public.md", "odd/latin1-admin.md", "odd/nul-latin1.md"}


def ingest_cli(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [INGEST, str(source), "--site", SITE, "--quiet", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())


@dataclass
class Ingested:
    source: Path
    server: ChromaServer
    embedded: Path  # the same tree in an embedded Chroma with its file blob store: the reference
    report: dict

    @property
    def server_args(self) -> list[str]:
        return ["--site", SITE, "--collection", COLLECTION, "--chroma-url", self.server.url]

    def collection(self) -> chromadb.Collection:
        client = chromadb.HttpClient(host="127.0.0.1", port=self.server.port)
        return client.get_collection(COLLECTION, embedding_function=None)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory, chroma_server: ChromaServer) -> Iterator[Ingested]:
    root = tmp_path_factory.mktemp("chroma-blobs")
    source = root / "site"
    shutil.copytree(SAMPLE_SITE, source)
    for rel, (data, _) in ODD.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(data)
    (source / BIG).write_bytes(os.urandom(2 * PIECE_BYTES + 12345))
    report = root / "report.json"  # the session's Chroma: only our own collection is read and written
    done = ingest_cli(source, "--collection", COLLECTION, "--chroma-url", chroma_server.url, "--report", str(report))
    assert done.returncode == 0, done.stderr
    done = ingest_cli(source, "--chroma-path", str(root / "embedded"))
    assert done.returncode == 0, done.stderr
    yield Ingested(source, chroma_server, root / "embedded", json.loads(report.read_text()))


def visible_to(reader: str) -> set[str]:
    sample = expected_visible(SAMPLE_SITE, "public", {"admin"} if reader == "admin" else None)
    return sample | {BIG} | {rel for rel, (_, public) in ODD.items() if public or reader == "admin"}


def reader_flags(reader: str, token_file: Callable[..., Path], secret_file: Path) -> list[str]:
    return reader_args(token_file(["admin"]), secret_file) if reader == "admin" else []


def diff(a: Path, b: Path) -> str:
    done = run(["diff", "-r", str(a), str(b)])
    return "" if done.returncode == 0 else done.stdout + done.stderr


@pytest.mark.parametrize("reader", ["admin", "anonymous"])
def test_a_server_mount_equals_the_embedded_reference_byte_for_byte(
    ingested: Ingested, reader: str, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    assert ingested.report["chroma_blobs"] == len(BINARIES) and ingested.report["errors"] == 0
    expected = copy_subset(ingested.source, visible_to(reader), tmp_path / "expected")
    token = reader_flags(reader, token_file, secret_file)
    served = tmp_path / "served"
    reference = tmp_path / "reference"
    with (
        mounted(served, *ingested.server_args, "--no-mountd", *token),
        mounted(reference, "--site", SITE, "--chroma-path", str(ingested.embedded), "--no-mountd", *token),
    ):
        assert diff(expected, served) == ""  # the source's bytes, every visible file and no other
        assert diff(reference, served) == ""
        for rel in BINARIES & visible_to(reader):
            cat = subprocess.run(["cat", str(served / rel)], capture_output=True, timeout=60, check=True)
            assert cat.stdout == (ingested.source / rel).read_bytes(), rel
            assert os.stat(served / rel).st_size == os.stat(reference / rel).st_size
        for rel in BINARIES - visible_to(reader):
            assert not (served / rel).exists()


def test_mount_server_sessions_serve_the_same_bytes(
    ingested: Ingested,
    start_mount_server: Callable[..., MountServer],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """Each reader's session of chromafs-mountd (a view of a serving process's mount)."""
    server = start_mount_server()
    for reader in ("admin", "anonymous"):
        session = tmp_path / reader
        session.mkdir()
        token = reader_flags(reader, token_file, secret_file)
        done = try_mount(session, *ingested.server_args, "--mountd", str(server.socket), *token)
        assert done.returncode == 0, done.stderr
        expected = copy_subset(ingested.source, visible_to(reader), tmp_path / f"expected-{reader}")
        assert diff(expected, session) == "", reader


def test_every_reader_backend_serves_the_bytes(ingested: Ingested, tmp_path: Path) -> None:
    """The REST adapter (a mount of a server), chromadb's client, and Chroma's SQLite file read
    directly (the server's data directory, copied once it is idle)."""
    copy = tmp_path / "chroma-copy"
    shutil.copytree(ingested.server.data, copy)

    def refuse() -> object:
        raise AssertionError("chromadb was opened though the SQLite file answers")

    direct = SqliteCollection.open(str(copy), COLLECTION, refuse)
    assert direct is not None and direct.is_current()
    readers = {
        "rest": ChromaPages.open(ChromaLocation(url=ingested.server.url, collection=COLLECTION)),
        "chromadb": ChromaPages(ingested.collection()),
        "sqlite": ChromaPages(direct),
    }
    tree = parse_tree(readers["rest"].load_tree_document()[0])
    entries = [tree.entries[rel] for rel in sorted(BINARIES)]
    for name, pages in readers.items():
        source = PageSource(SITE, lambda pages=pages: pages, PageCache(), tree.version)
        loaded = source.load_many(entries)
        assert {rel: loaded[rel] for rel in BINARIES} == {
            rel: (ingested.source / rel).read_bytes() for rel in BINARIES
        }, name
    with mounted(tmp_path / "mnt", "--site", SITE, "--chroma-path", str(copy), "--collection", COLLECTION) as mnt:
        assert diff(copy_subset(ingested.source, visible_to("anonymous"), tmp_path / "expected"), mnt) == ""


def test_pieces_are_kept_as_the_format_says(ingested: Ingested) -> None:
    data = (ingested.source / BIG).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    ids = [blob_piece_id(sha, index) for index in range(3)]
    found = ingested.collection().get(ids=ids, include=["documents", "metadatas", "embeddings"])
    assert found["ids"] == ids
    assert found["documents"] == [None, None, None]  # no text: no full-text index, no $contains
    assert all(not any(vector) for vector in found["embeddings"])  # never embedded
    for index, metadata in enumerate(found["metadatas"]):
        assert metadata[BLOB_SHA_FIELD] == sha and metadata[BLOB_PIECE_FIELD] == index
        assert "page_slug" not in metadata
        piece = data[index * PIECE_BYTES : (index + 1) * PIECE_BYTES]
        assert base64.b64decode(metadata[BLOB_DATA_FIELD], validate=True) == piece
    tree = parse_tree(ChromaPages(ingested.collection()).load_tree_document()[0])
    blob = tree.entries[BIG].blob
    assert blob is not None and blob.url == f"chroma:{sha}" and blob.size == len(data)
    each = (data[i : i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES))
    assert blob.pieces == tuple(hashlib.sha256(piece).hexdigest() for piece in each)
    logo, copy = tree.entries["images/logo.png"].blob, tree.entries["images/logo-copy.png"].blob
    assert logo is not None and copy is not None and logo.url == copy.url  # one file's pieces, shared


def test_grep_and_search_never_see_the_pieces(
    ingested: Ingested, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    collection = ingested.collection()
    sha = hashlib.sha256((ingested.source / BIG).read_bytes()).hexdigest()
    piece = collection.get(ids=[blob_piece_id(sha, 1)], include=["metadatas"])
    fragment = piece["metadatas"][0][BLOB_DATA_FIELD][5000:5040]  # text only a piece record holds
    for where_document in ({"$contains": fragment}, {"$regex": fragment.replace("+", r"\+")}):
        assert collection.get(where_document=where_document, include=[])["ids"] == []
    admin = reader_args(token_file(["admin"]), secret_file)
    with mounted(tmp_path / "mnt", *ingested.server_args, "--no-mountd", *admin) as mnt:
        grep = run(["grep", "-rF", fragment, str(mnt)])
        assert grep.returncode == 1 and grep.stdout == "", grep.stdout + grep.stderr
    chromafs = [str(BIN / "chromafs")]
    done = run([*chromafs, "grep", "-F", fragment, *ingested.server_args, *admin])
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    text_pages = visible_to("admin") - BINARIES
    for query in (fragment, "logo diagram image png", "Caf\xe9 cr\xe8me r\xe9serv\xe9"):
        done = run([*chromafs, "search", query, "-n", "1000", "--json", *ingested.server_args, *admin])
        assert done.returncode in (0, 1), done.stderr
        paths = {json.loads(line)["path"] for line in done.stdout.splitlines()}
        assert paths and paths <= text_pages, paths & BINARIES


def small_site(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_a_binary_above_the_limit_is_named_and_the_rest_ingested(ingested: Ingested, tmp_path: Path) -> None:
    files = {"index.md": b"# Home\n", "small.png": os.urandom(1000), "huge.png": os.urandom(300_000)}
    files["odd/latin1.md"] = b"# Caf\xe9\n" + b"x" * 300_000
    site = small_site(tmp_path / "site", files)
    server = ["--collection", "blobs-limit", "--chroma-url", ingested.server.url]
    done = ingest_cli(site, *server, "--chroma-blob-limit", "200000")
    assert done.returncode == 3, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, done.stderr
    for rel, line in zip(("huge.png", "odd/latin1.md"), errors, strict=True):
        assert re.match(rf"error: {re.escape(rel)}(:\d+)?: ", line) and line.endswith("(not ingested)"), line
        assert "served byte for byte" not in line, f"one final outcome per file: {line}"
        assert "--chroma-blob-limit (200000 bytes)" in line and "set --blob-store" in line, line
    with mounted(tmp_path / "mnt", "--site", SITE, *server, "--no-mountd") as mnt:
        assert sorted(os.listdir(mnt)) == ["index.md", "small.png"]
        assert (mnt / "small.png").read_bytes() == files["small.png"]


def test_a_text_file_with_a_line_longer_than_a_request_is_kept_as_a_binary_file(
    ingested: Ingested, tmp_path: Path
) -> None:
    """A minified JSON of 42 MB is one line, so one chunk: more than Chroma takes in one request."""
    line = b'{"paths": [' + b",".join(b'"/v1/item/%08d"' % i for i in range(2_600_000)) + b"]}"
    assert len(line) > 41 * 1024 * 1024
    site = small_site(tmp_path / "site", {"index.md": b"# Home\n", "openapi.min.json": line})
    server = ["--collection", "blobs-long-line", "--chroma-url", ingested.server.url]
    done = ingest_cli(site, *server, "--chroma-blob-limit", str(64 * 1024 * 1024))
    assert done.returncode == 0, done.stderr
    assert "openapi.min.json: a line longer than 8388608 bytes: kept as a binary file" in done.stderr
    with mounted(tmp_path / "mnt", "--site", SITE, *server, "--no-mountd") as mnt:
        cmp = run(["cmp", str(site / "openapi.min.json"), str(mnt / "openapi.min.json")])
        assert cmp.returncode == 0, cmp.stdout + cmp.stderr


def test_a_page_whose_access_cannot_be_read_is_hidden_from_everyone(
    ingested: Ingested, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """Fail closed: a byte that is not UTF-8 in `public:` hides the page, from the admin too."""
    files = {"index.md": b"# Home\n", "odd/bad.md": b"---\npublic: f\xe9lse\n---\n# Bad\n\n\xff\n"}
    site = small_site(tmp_path / "site", files)
    server = ["--collection", "blobs-closed", "--chroma-url", ingested.server.url]
    done = ingest_cli(site, *server)
    assert done.returncode == 3 and "odd/bad.md:2: " in done.stderr and "(hidden from everyone)" in done.stderr
    admin = reader_args(token_file(["admin"]), secret_file)
    with mounted(tmp_path / "mnt", "--site", SITE, *server, "--no-mountd", *admin) as mnt:
        assert sorted(os.listdir(mnt)) == ["index.md"]


def pieces_of_file(collection: chromadb.Collection, data: bytes) -> list[str]:
    sha = hashlib.sha256(data).hexdigest()
    return sorted(collection.get(where={BLOB_SHA_FIELD: sha}, include=[])["ids"])


def test_a_reingest_writes_no_piece_twice_and_drops_those_of_removed_files(ingested: Ingested, tmp_path: Path) -> None:
    kept, dropped = os.urandom(PIECE_BYTES + 10), os.urandom(5000)
    site = small_site(tmp_path / "site", {"index.md": b"# Home\n", "kept.bin": kept, "dropped.bin": dropped})
    (site / "twin.bin").write_bytes(dropped)  # the same bytes under a second name
    server = ["--collection", "blobs-retire", "--chroma-url", ingested.server.url]
    report = tmp_path / "report.json"
    written = lambda: json.loads(report.read_text())["blob_pieces_written"]  # noqa: E731
    assert ingest_cli(site, *server, "--report", str(report)).returncode == 0
    assert written() == 3  # two pieces of kept.bin, one shared by dropped.bin and twin.bin
    assert ingest_cli(site, *server, "--report", str(report)).returncode == 0
    assert written() == 0
    collection = chromadb.HttpClient(host="127.0.0.1", port=ingested.server.port).get_collection("blobs-retire")
    (site / "dropped.bin").unlink()
    assert ingest_cli(site, *server, "--grace-period", "0").returncode == 0
    assert len(pieces_of_file(collection, dropped)) == 1  # twin.bin still holds those bytes
    (site / "twin.bin").unlink()
    assert ingest_cli(site, *server).returncode == 0  # retired: kept for mounts on the old tree
    assert len(pieces_of_file(collection, dropped)) == 1
    assert ingest_cli(site, *server, "--grace-period", "0", "--report", str(report)).returncode == 0
    assert pieces_of_file(collection, dropped) == []
    assert json.loads(report.read_text())["retired_blobs_deleted"] == 1
    assert len(pieces_of_file(collection, kept)) == 2
    with mounted(tmp_path / "mnt", "--site", SITE, *server, "--no-mountd") as mnt:
        assert sorted(os.listdir(mnt)) == ["index.md", "kept.bin"]
        assert (mnt / "kept.bin").read_bytes() == kept


@pytest.mark.expect_log(r"ERROR .*: reading .*: chroma:[0-9a-f]+: piece \d+ does not match the tree's sha256")
def test_a_corrupt_piece_fails_its_range_only(ingested: Ingested, tmp_path: Path) -> None:
    """Read lazily by range, each piece checked against the tree: a piece whose bytes changed in
    Chroma fails the reads that reach it, with EIO; the pieces before it are still served."""
    data = os.urandom(2 * PIECE_BYTES)
    site = small_site(tmp_path / "site", {"index.md": b"# Home\n", "two.bin": data})
    server = ["--collection", "blobs-corrupt", "--chroma-url", ingested.server.url]
    assert ingest_cli(site, *server).returncode == 0
    collection = chromadb.HttpClient(host="127.0.0.1", port=ingested.server.port).get_collection("blobs-corrupt")
    piece_id = blob_piece_id(hashlib.sha256(data).hexdigest(), 1)
    metadata = dict(collection.get(ids=[piece_id], include=["metadatas"])["metadatas"][0])
    flipped = bytearray(data[PIECE_BYTES:])
    flipped[7] ^= 1
    metadata[BLOB_DATA_FIELD] = base64.b64encode(bytes(flipped)).decode()
    collection.update(ids=[piece_id], metadatas=[metadata])
    with mounted(tmp_path / "mnt", "--site", SITE, *server, "--no-mountd", "--preload", "off") as mnt:
        with open(mnt / "two.bin", "rb") as handle:
            assert handle.read(PIECE_BYTES) == data[:PIECE_BYTES]
            with pytest.raises(OSError) as failed:
                handle.read(100)
        assert failed.value.errno == 5  # EIO
        log = (tmp_path / "mnt.log").read_text()
        assert "piece 1 does not match the tree's sha256" in log, log[-2000:]
        assert (mnt / "index.md").read_bytes() == b"# Home\n"
