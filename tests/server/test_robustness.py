"""Backends that flap, a signal during heavy reads, a very large page, a very large tree."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from chromafs_fuse.access import Principal, visible_entries
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.packed import unpack
from chromafs_fuse.tree import encode_tree_document, parse_tree
from infra import (
    INGEST,
    MOUNT,
    SAMPLE_SITE,
    Backend,
    RedisServer,
    S3Server,
    expected_visible,
    hold_for,
    is_mounted,
    mounted,
    unmount,
    wait_until,
)


def _read_loop(mnt: Path, pages: list[str], stop: threading.Event, failures: list[str], reads: list[str]) -> None:
    while not stop.is_set():
        for rel in pages:
            try:
                if (mnt / rel).read_bytes() != (SAMPLE_SITE / rel).read_bytes():
                    failures.append(f"wrong bytes: {rel}")
            except OSError as exc:
                failures.append(f"{rel}: {exc}")
            reads.append(rel)


@pytest.mark.expect_log(
    r"WARNING .*: Redis \(.*\) unavailable, reading from the backend instead",
    r"WARNING .*: Redis \(.*\) is reachable again",
)
def test_redis_flapping_during_reads(
    redis_server: RedisServer, sample_backend: Callable[..., Backend], mnt: Path
) -> None:
    pages = sorted(p for p in expected_visible(SAMPLE_SITE, "public", None) if not p.endswith(".png"))
    # a small page cache forces reads through Redis/Chroma again and again
    args = [
        *sample_backend().args,
        "--redis-url",
        redis_server.url,
        "--cache-bytes",
        "300000",
        "--cache-timeout",
        "0",
        "--preload",
        "off",
    ]
    with mounted(mnt, *args):
        stop, failures, reads = threading.Event(), [], []
        reader = threading.Thread(target=_read_loop, args=(mnt, pages, stop, failures, reads))
        reader.start()

        def more_reads() -> None:  # each phase, up or down, sees a round of reads
            done = len(reads)
            wait_until(lambda: len(reads) >= done + len(pages), 30, "a round of reads", 0.02)

        try:
            for _ in range(3):
                more_reads()
                redis_server.stop()
                more_reads()
                redis_server.start()
            more_reads()
        finally:
            stop.set()
            reader.join(60)
        assert failures == []


@pytest.mark.expect_log(r"ERROR .*: reading images/.*: cannot read s3://")
def test_s3_flapping_fails_only_lazy_reads_and_recovers(s3_server: S3Server, mnt: Path, tmp_path: Path) -> None:
    s3_server.client().create_bucket(Bucket="docs")
    chroma = tmp_path / "chroma"
    proc = subprocess.run(
        [
            INGEST,
            str(SAMPLE_SITE),
            "--site",
            "acme",
            "--chroma-path",
            str(chroma),
            "--blob-store",
            "s3://docs/acme",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **s3_server.env},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    with mounted(
        mnt,
        "--site",
        "acme",
        "--chroma-path",
        str(chroma),
        "--cache-bytes",
        "1",
        "--preload",
        "off",
        "--backend-timeout",
        "5",
        env=s3_server.env,
    ):
        for image in ("images/diagram.png", "images/logo.png"):  # each not read before: not in any cache
            s3_server.stop()
            started = time.monotonic()
            try:
                (mnt / image).read_bytes()
                raise AssertionError("a read from a stopped S3 must fail")
            except OSError as exc:
                assert exc.errno == 5
            assert time.monotonic() - started < 15
            assert (mnt / "index.mdx").read_bytes() == (SAMPLE_SITE / "index.mdx").read_bytes()
            s3_server.start()  # a new, empty moto: put the object back
            s3 = s3_server.client()
            s3.create_bucket(Bucket="docs")
            data = (SAMPLE_SITE / image).read_bytes()
            s3.put_object(Bucket="docs", Key=f"acme/{hashlib.sha256(data).hexdigest()}", Body=data)
            assert (mnt / image).read_bytes() == data


def test_sigterm_during_heavy_reads_exits_zero(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    daemon = subprocess.Popen(
        [
            MOUNT,
            "--foreground",
            str(mnt),
            *sample_backend().args,
            "--cache-timeout",
            "0",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: is_mounted(mnt), 60, f"{mnt} mounted", 0.05)
        readers = [
            subprocess.Popen(["sh", "-c", f"for i in $(seq 50); do grep -rc e {mnt} >/dev/null 2>&1; done"])
            for _ in range(4)
        ]
        hold_for(1.0, "SIGTERM lands in the middle of the greps")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        for reader in readers:
            reader.wait(60)
        assert not is_mounted(mnt)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        unmount(mnt)


def test_hundred_megabyte_page(mnt: Path, tmp_path: Path) -> None:
    line = "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ " * 15
    chunk = "\n".join([line] * 2000)  # about 2 MB per chunk
    chunks = [chunk] * 52
    expected = "\n".join(chunks).encode()
    assert len(expected) > 100_000_000
    tree = {
        "big.txt": {
            "isPublic": True,
            "groups": [],
            "size": len(expected),
            "sha256": hashlib.sha256(expected).hexdigest(),
        }
    }
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=Settings(anonymized_telemetry=False))
    collection = client.create_collection("big", embedding_function=None)
    for i, text in enumerate(chunks):
        collection.add(
            ids=[f"big-{i}"],
            documents=[text],
            metadatas=[{"page_slug": "big.txt", "chunk_index": i}],
            embeddings=[[1.0, 0.0]],
        )
    collection.add(ids=["__path_tree__"], documents=[encode_tree_document(tree)], embeddings=[[0.0, 0.0]])
    del collection, client
    with mounted(mnt, "--site", "big", "--chroma-path", str(tmp_path / "chroma"), "--backend-timeout", "60"):
        digest = subprocess.run(["sha256sum", str(mnt / "big.txt")], capture_output=True, text=True, timeout=300)
        assert digest.stdout.split()[0] == hashlib.sha256(expected).hexdigest()
        assert os.stat(mnt / "big.txt").st_size == len(expected)


def test_tree_of_200000_paths_loads_in_seconds() -> None:
    tree = {
        f"section-{i % 97}/sub-{i % 13}/page-{i}.mdx": {
            "isPublic": i % 3 != 0,
            "groups": [] if i % 5 else ["x"],
            "size": 1000 + i,
            "sha256": "a" * 64,
        }
        for i in range(200_000)
    }
    document = encode_tree_document(tree)
    started = time.monotonic()
    parsed = parse_tree(document)
    table = InodeTable(visible_entries(parsed.entries, Principal.anonymous()))
    elapsed = time.monotonic() - started
    assert len(parsed.entries) == 200_000
    assert table.file_count == sum(1 for e in tree.values() if e["isPublic"])
    assert elapsed < 20, f"200,000-path tree took {elapsed:.1f}s"
    assert len(gzip.decompress(unpack(document))) == len(
        json.dumps(tree, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    )
