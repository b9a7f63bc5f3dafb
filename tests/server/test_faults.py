"""Faults with real processes: Chroma stopped and restarted under a mount, a dead daemon."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import (
    SAMPLE_SITE,
    Backend,
    ChromaServer,
    blocked_in_fuse,
    copy_subset,
    expected_visible,
    ingest,
    mounted,
    run,
    try_mount,
    wait_until,
)


@pytest.mark.expect_log(r"ERROR .*: chroma: fetching chunks of .* failed: no answer")
def test_chroma_down_then_back_without_remount(
    mnt: Path, tmp_path: Path, fresh_chroma_server: Callable[..., ChromaServer]
) -> None:
    chroma = fresh_chroma_server()  # stopped and restarted on purpose
    ingest(
        SAMPLE_SITE,
        "--site",
        "acme",
        "--chroma-url",
        chroma.url,
        "--blob-store",
        (tmp_path / "blobs").as_uri(),
        "--quiet",
    )
    pages = sorted(p for p in expected_visible(SAMPLE_SITE, "public", None) if not p.endswith(".png"))
    one_page_per_read = ["--preload", "off", "--readahead-pages", "0"]  # else one read loads the whole sample
    with mounted(mnt, "--site", "acme", "--chroma-url", chroma.url, *one_page_per_read, "--backend-timeout", "3"):
        cached = pages[0]
        assert (mnt / cached).read_bytes() == (SAMPLE_SITE / cached).read_bytes()
        chroma.stop()
        assert (mnt / cached).read_bytes() == (SAMPLE_SITE / cached).read_bytes()  # from the caches
        started = time.monotonic()
        with pytest.raises(OSError) as info:
            (mnt / pages[1]).read_bytes()
        assert info.value.errno == 5
        assert time.monotonic() - started < 10, "a dead backend must fail a read in seconds"
        chroma.start()  # same port, same data
        assert (mnt / pages[1]).read_bytes() == (SAMPLE_SITE / pages[1]).read_bytes()


def test_reader_of_a_dead_mount_gets_an_error_not_a_hang(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    backend = sample_backend().args
    with mounted(mnt, *backend, "--preload", "off"):
        pid = int((mnt.parent / "mnt.pid").read_text())
        os.kill(pid, signal.SIGSTOP)  # the daemon hangs: a reader now blocks in the kernel
        reader = subprocess.Popen(["cat", str(mnt / "changelog.md")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until(lambda: blocked_in_fuse(reader.pid), 10, "the reader blocked on the hung daemon", 0.02)
        assert reader.poll() is None
        os.kill(pid, signal.SIGKILL)  # the daemon dies with the request pending
        assert reader.wait(timeout=10) != 0, "the blocked reader must get an error once the daemon is gone"
        # What the kernel has cached (the root listing, attributes) may still be served; anything
        # that reaches the daemon fails, and statfs always does.
        for probe in (lambda: os.statvfs(mnt), lambda: os.listdir(mnt / "guides")):
            with pytest.raises(OSError) as info:
                probe()
            assert info.value.errno in (107, 103)  # ENOTCONN / ECONNABORTED
        again = try_mount(mnt, *backend)
        assert again.returncode == 0, again.stderr
        assert (mnt / "changelog.md").read_bytes() == (SAMPLE_SITE / "changelog.md").read_bytes()


def test_corrupt_tree_record_refuses_the_site(mnt: Path, tmp_path: Path) -> None:
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"), settings=Settings(anonymized_telemetry=False))
    cases = {"badgzip": "H4sIAAAAAAAA/wMAAAAAAAAAAAA=", "notjson": "{not json", "list": "[1, 2]", "empty": " "}
    for name, document in cases.items():
        collection = client.create_collection(f"site-{name}", embedding_function=None)
        collection.add(ids=["__path_tree__"], documents=[document], embeddings=[[0.0, 0.0]])
    del client
    for name in cases:
        proc = try_mount(mnt, "--site", f"site-{name}", "--chroma-path", str(tmp_path / "chroma"))
        assert proc.returncode == 1, name
        assert proc.stderr.startswith("chromafs-mount: ") and proc.stderr.count("\n") == 1, (name, proc.stderr)
        assert "path tree" in proc.stderr, proc.stderr
        assert not os.path.ismount(mnt)


@pytest.mark.expect_log(r"ERROR .*: (chroma: fetching chunks of .* failed: no answer|reading .*: no answer within)")
def test_frozen_chroma_fails_a_read_within_the_backend_timeout(
    mnt: Path, fresh_chroma_server: Callable[..., ChromaServer]
) -> None:
    """One deadline per read: waiting for a read-ahead batch that is stuck, then fetching the page
    itself, must not add up to twice --backend-timeout."""
    chroma = fresh_chroma_server()  # frozen on purpose
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-url", chroma.url, "--quiet")
    pages = sorted(p for p in expected_visible(SAMPLE_SITE, "public", None) if p.endswith((".md", ".mdx")))
    timeout = 3.0
    flags = ["--preload", "off", "--no-push-pages", "--backend-timeout", str(timeout)]
    with mounted(mnt, "--site", "acme", "--chroma-url", chroma.url, *flags):
        assert (mnt / pages[0]).read_bytes() == (SAMPLE_SITE / pages[0]).read_bytes()
        assert chroma.proc is not None
        os.kill(chroma.proc.pid, signal.SIGSTOP)
        try:
            for page in pages[1:3]:  # next to a delivered file: a read-ahead batch starts and hangs
                started = time.monotonic()
                with pytest.raises(OSError) as info:
                    (mnt / page).read_bytes()
                elapsed = time.monotonic() - started
                assert info.value.errno == errno.EIO
                assert elapsed < timeout + 1.0, f"{page}: failed after {elapsed:.1f}s"
        finally:
            os.kill(chroma.proc.pid, signal.SIGCONT)
        # back once the server answers again
        recovered = wait_until((mnt / pages[1]).read_bytes, 30, "the mount's recovery", 0.5, ignoring=(OSError,))
        assert recovered == (SAMPLE_SITE / pages[1]).read_bytes()


@pytest.mark.expect_log(r"WARNING .*: page .* failed its checks as read directly", r"ERROR .*: page .* is corrupt")
def test_tampered_chunk_gives_eio_never_wrong_bytes(mnt: Path, tmp_path: Path) -> None:
    """A chunk changed in Chroma after ingest (same length or not): that page fails with EIO and a
    log line, through the direct SQLite reader and through chromadb alike; other pages are served."""
    import chromadb
    from chromadb.config import Settings

    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, *Backend("acme", chroma).args, "--quiet")
    client = chromadb.PersistentClient(str(chroma), settings=Settings(anonymized_telemetry=False))
    collection = client.get_collection("acme", embedding_function=None)
    tampered = {"quickstart.mdx": None, "auth/oauth.mdx": None}
    for page in tampered:
        found = collection.get(where={"page_slug": page}, include=["documents", "metadatas", "embeddings"])
        first = next(i for i, m in enumerate(found["metadatas"]) if m["chunk_index"] == 0)
        original = found["documents"][first]
        same_length = original[:-1] + ("X" if original[-1] != "X" else "Y")
        forged = same_length if page == "quickstart.mdx" else original + " (edited)"
        collection.update(ids=[found["ids"][first]], documents=[forged], embeddings=[found["embeddings"][first]])
    with mounted(mnt, *Backend("acme", chroma).args, "--preload", "off"):
        for page in tampered:
            with pytest.raises(OSError) as info:
                (mnt / page).read_bytes()
            assert info.value.errno == errno.EIO
        assert (mnt / "index.mdx").read_bytes() == (SAMPLE_SITE / "index.mdx").read_bytes()
    log = (mnt.parent / "mnt.log").read_text()
    assert "quickstart.mdx" in log and "sha256" in log


@pytest.mark.expect_log(r"WARNING .*: page .* failed its checks as read directly", r"ERROR .*: page .* is corrupt")
def test_a_source_file_that_cannot_be_read_is_reported_and_the_rest_is_ingested(mnt: Path, tmp_path: Path) -> None:
    """The ingest's source folder is a chromafs mount whose quickstart.mdx fails every read with EIO
    (a chunk tampered with in its Chroma) while it lists and stats as any file. The ingest goes on:
    exit status 3, the report names the file with "cannot read", every other file is ingested."""
    import chromadb
    from chromadb.config import Settings

    source_chroma, chroma, broken = tmp_path / "source-chroma", tmp_path / "chroma", "quickstart.mdx"
    ingest(SAMPLE_SITE, *Backend("acme", source_chroma).args, "--quiet")
    client = chromadb.PersistentClient(str(source_chroma), settings=Settings(anonymized_telemetry=False))
    collection = client.get_collection("acme", embedding_function=None)
    found = collection.get(where={"page_slug": broken}, include=["documents", "embeddings"])
    collection.update(ids=found["ids"][:1], documents=[found["documents"][0] + "!"], embeddings=found["embeddings"][:1])
    report_path = tmp_path / "report.json"
    with mounted(mnt, *Backend("acme", source_chroma).args, "--preload", "off"):
        assert (mnt / broken).stat().st_size == (SAMPLE_SITE / broken).stat().st_size
        with pytest.raises(OSError) as info:
            (mnt / broken).read_bytes()
        assert info.value.errno == errno.EIO
        done = ingest(mnt, *Backend("acme", chroma).args, "--report", str(report_path), status=3)
    assert f"error: {broken}: cannot read: Input/output error (not ingested)" in done.stderr
    report = json.loads(report_path.read_text())
    assert (report["status"], report["exit_status"]) == ("finished with errors", 3)
    assert [p for p in report["problems"] if p["severity"] == "error"] == [
        {
            "path": broken,
            "reason": "cannot read: Input/output error",
            "outcome": "not ingested",
            "line": None,
            "severity": "error",
        }
    ]
    others = expected_visible(SAMPLE_SITE, "public", None) - {broken}
    with mounted(mnt, *Backend("acme", chroma).args):
        diff = run(["diff", "-r", str(copy_subset(SAMPLE_SITE, others, tmp_path / "expected")), str(mnt)])
        assert diff.returncode == 0, diff.stdout + diff.stderr
