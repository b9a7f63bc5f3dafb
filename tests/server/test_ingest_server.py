"""Ingest into a Chroma server (`chroma run`): never above its batch bound, and a slow or
stopped server costs a retry, not the ingest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import INGEST, ChromaServer, child_env, hold_for, mounted


def run_ingest(source: Path, url: str, *args: str, site: str = "acme") -> subprocess.CompletedProcess[str]:
    argv = [INGEST, str(source), "--site", site, "--chroma-url", url, "--quiet", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())


@pytest.fixture
def own_server(fresh_chroma_server: Callable[..., ChromaServer]) -> ChromaServer:
    """A server of this test's own: it is stopped (SIGSTOP) on purpose."""
    return fresh_chroma_server()


def test_a_page_with_more_chunks_than_the_server_takes_at_once(
    chroma_server: ChromaServer, tmp_path: Path, mnt: Path
) -> None:
    """Prefect's 1 MB schema.json: one page whose chunks alone overflow get_max_batch_size()."""
    import chromadb

    bound = chromadb.HttpClient(host="127.0.0.1", port=chroma_server.port).get_max_batch_size()
    site = tmp_path / "site"
    site.mkdir()
    lines = bound + 500
    big = "".join(f'  "field_{i:05d}": {{"type": "string"}},\n' for i in range(lines)).encode()
    (site / "schema.json").write_bytes(big)
    (site / "index.md").write_text("# Home\n")
    proc = run_ingest(site, chroma_server.url, "--max-chunk-chars", "48", site="batches")
    assert proc.returncode == 0, proc.stderr
    with mounted(mnt, "--site", "batches", "--chroma-url", chroma_server.url):
        assert (mnt / "schema.json").read_bytes() == big
        assert sorted(os.listdir(mnt)) == ["index.md", "schema.json"]


def pause(server: ChromaServer, seconds: float) -> threading.Thread:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)

    def resume() -> None:
        hold_for(seconds, "the server stays stopped this long")
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGCONT)

    thread = threading.Thread(target=resume)
    thread.start()
    return thread


def test_a_server_that_stops_answering_for_a_while_costs_retries_not_the_ingest(
    own_server: ChromaServer, tmp_path: Path, mnt: Path
) -> None:
    site = tmp_path / "site"
    (site / "guide").mkdir(parents=True)
    pages = {f"guide/page-{i:03d}.md": f"# Page {i}\n\n{'text ' * 200}\n".encode() for i in range(300)}
    for key, data in pages.items():
        (site / key).write_bytes(data)
    resumed = pause(own_server, 6.0)
    try:
        proc = run_ingest(site, own_server.url, "--backend-timeout", "1", "--retries", "6")
    finally:
        resumed.join()
    assert proc.returncode == 0, proc.stderr
    assert "trying again" in proc.stderr, proc.stderr
    with mounted(mnt, "--site", "acme", "--chroma-url", own_server.url):
        assert all((mnt / key).read_bytes() == data for key, data in pages.items())


def test_a_server_gone_for_good_fails_the_ingest_naming_the_call(own_server: ChromaServer, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.md").write_text("# Home\n")
    assert run_ingest(site, own_server.url).returncode == 0
    resumed = pause(own_server, 8.0)
    try:
        started = time.monotonic()
        proc = run_ingest(site, own_server.url, "--backend-timeout", "0.5", "--retries", "1")
        took = time.monotonic() - started
    finally:
        resumed.join()
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("chromafs-ingest: ") and "failed after 2 tries" in last, proc.stderr
    # chromadb's words (a new collection) or the REST client's (a re-ingest: chroma_http.py)
    assert any(words in last for words in ("did not answer within 0.5s", "timed out", "no answer within 0.5 s")), last
    assert took < 7.5, f"two tries of 0.5 s and one backoff took {took:.1f}s"


def test_a_rerun_writes_only_the_chunks_that_are_missing(
    chroma_server: ChromaServer, tmp_path: Path, mnt: Path
) -> None:
    """An ingest that stopped half way wrote some chunks and no tree: the next run writes the rest."""
    import chromadb

    site = tmp_path / "site"
    site.mkdir()
    pages = {f"p{i}.md": f"# P{i}\n\n{'word ' * 900}\n".encode() for i in range(20)}
    for key, data in pages.items():
        (site / key).write_bytes(data)
    report = tmp_path / "report.json"
    written: Callable[[], int] = lambda: json.loads(report.read_text())["chunks_written"]  # noqa: E731
    assert run_ingest(site, chroma_server.url, "--report", str(report), site="rerun").returncode == 0
    total = written()
    collection = chromadb.HttpClient(host="127.0.0.1", port=chroma_server.port).get_collection("rerun")
    lost = collection.get(where={"page_slug": {"$in": ["p3.md", "p7.md"]}}, include=[])["ids"]
    assert 0 < len(lost) < total
    collection.delete(ids=[*lost, "__path_tree__"])  # as if the run had stopped before them
    assert run_ingest(site, chroma_server.url, "--report", str(report), site="rerun").returncode == 0
    assert written() == len(lost)
    with mounted(mnt, "--site", "rerun", "--chroma-url", chroma_server.url):
        assert {key: (mnt / key).read_bytes() for key in pages} == pages


def test_no_upsert_carries_more_than_the_server_takes_in_one_request(
    chroma_server: ChromaServer, tmp_path: Path, mnt: Path
) -> None:
    """Chroma refuses a request of more than 40 MiB: 45 MB of Chinese and emoji text in chunks of
    4000 characters (fewer chunks than the server's batch bound) goes in several upserts."""
    import random

    site = tmp_path / "site"
    site.mkdir()
    words = ["文档", "搜索", "设置", "令牌", "页面", "目录", "文件", "读取", "😀", "🚀"]
    rng = random.Random(38)
    for i in range(45):
        lines = ["".join(rng.choice(words) for _ in range(400)) for _ in range(820)]
        (site / f"p{i:02d}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    total = sum(path.stat().st_size for path in site.iterdir())
    assert total > 42 * 1024 * 1024
    proc = run_ingest(site, chroma_server.url, "--max-chunk-chars", "4000", site="payload")
    assert proc.returncode == 0, proc.stderr
    with mounted(mnt, "--site", "payload", "--chroma-url", chroma_server.url):
        done = subprocess.run(["diff", "-r", str(site), str(mnt)], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:]
