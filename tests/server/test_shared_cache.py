"""Redis as the shared cache: boot from a cached tree, no leaks across groups, survive outages."""

from __future__ import annotations

import errno
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.backends.redis_cache import RETRY_AFTER_S
from infra import (
    SAMPLE_SITE,
    Backend,
    ChromaServer,
    RedisMonitor,
    RedisServer,
    expected_visible,
    hold_for,
    ingest,
    mounted,
    reader_args,
    run,
)


def test_second_mount_boots_from_redis_with_chroma_down(
    redis_server: RedisServer, mnt: Path, tmp_path: Path, fresh_chroma_server: Callable[..., ChromaServer]
) -> None:
    chroma = fresh_chroma_server()  # stopped on purpose
    ingest(
        SAMPLE_SITE,
        "--site",
        "acme",
        "--chroma-url",
        chroma.url,
        "--blob-store",
        (tmp_path / "blobs").as_uri(),
        "--redis-url",
        redis_server.url,
        "--quiet",
    )
    args = ["--site", "acme", "--chroma-url", chroma.url, "--redis-url", redis_server.url, "--preload", "on"]
    with mounted(mnt, *args):
        run(["grep", "-rq", "never-matches-anything", str(mnt)])  # every visible page read once
    chroma.stop()
    # Chroma is gone: the tree and every page the first mount read come from Redis
    second = tmp_path / "second"
    with mounted(second, *args, "--backend-timeout", "3"):
        visible = expected_visible(SAMPLE_SITE, "public", None)
        for rel in visible:
            assert (second / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes(), rel
        log = (tmp_path / "second.log").read_text()
        assert "loaded from Redis" in log


def test_public_mount_never_touches_hidden_keys(
    redis_server: RedisServer,
    sample_backend: Callable[..., Backend],
    mnt: Path,
    tmp_path: Path,
    token_file: Callable[..., Path],
    secret_file: Path,
) -> None:
    backend = sample_backend().args
    base = [*backend, "--redis-url", redis_server.url, "--preload", "on"]
    admin = reader_args(token_file(["admin", "billing"]), secret_file)
    with mounted(tmp_path / "admin", *base, *admin):
        run(["grep", "-rq", "never-matches-anything", str(tmp_path / "admin")])
    keys = redis_server.cli("--scan").split()
    everything = expected_visible(SAMPLE_SITE, "public", {"admin", "billing"})
    visible = expected_visible(SAMPLE_SITE, "public", None)
    hidden = everything - visible
    assert any(k.endswith(":page:internal/billing.mdx") for k in keys), "admin mount should have filled Redis"

    with RedisMonitor(redis_server) as monitor:
        with mounted(mnt, *base):
            run(["grep", "-rq", "never-matches-anything", str(mnt)])
            run(["cat", *[str(mnt / h) for h in hidden]])
            run(["find", str(mnt)])
        seen = monitor.seen()
    assert '"MGET"' in seen or '"GET"' in seen, "the public mount should use the shared cache"
    for rel in hidden:
        assert rel not in seen, f"public mount asked Redis about hidden page {rel}"
    for command in ('"KEYS"', '"SCAN"'):
        assert command not in seen


@pytest.mark.expect_log(r"WARNING .*: Redis .* (unavailable, reading from the backend instead|is reachable again)")
def test_reads_survive_redis_outage_and_use_it_again(
    redis_server: RedisServer, sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path
) -> None:
    args = [
        *sample_backend().args,
        "--redis-url",
        redis_server.url,
        "--preload",
        "off",
        "--readahead-pages",
        "0",  # one page per read: read-ahead would load the whole sample site at the first read
    ]
    pages = sorted(expected_visible(SAMPLE_SITE, "public", None))
    with mounted(mnt, *args):
        assert (mnt / pages[0]).read_bytes() == (SAMPLE_SITE / pages[0]).read_bytes()
        redis_server.stop()
        started = time.monotonic()
        for rel in pages[1:10]:
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()
        assert time.monotonic() - started < 10
        redis_server.start()  # same port
        hold_for(RETRY_AFTER_S + 0.5, "the mount tries Redis again RETRY_AFTER_S after a failure, not before")
        for rel in pages[10:]:
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()
        assert any(k.endswith(f":page:{pages[-1]}") for k in redis_server.cli("--scan").split())
    log = (tmp_path / "mnt.log").read_text()
    assert log.count("unavailable, reading from the backend instead") == 1
    assert log.count("is reachable again") == 1


@pytest.mark.expect_log(r"WARNING .*: ignoring the shared cache.s copy of")
def test_wrong_bytes_in_redis_are_never_served(redis_server: RedisServer, mnt: Path, tmp_path: Path) -> None:
    """A page in the shared cache that does not match the tree's size and sha256 is ignored with a
    warning: the mount reads the page from Chroma."""
    backend = Backend("acme", tmp_path / "chroma", redis_url=redis_server.url).args
    ingest(SAMPLE_SITE, *backend, "--quiet")
    args = [*backend, "--preload", "off"]
    page = "quickstart.mdx"
    with mounted(mnt, *args):
        assert (mnt / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()
    (key,) = redis_server.cli("--scan", "--pattern", f"*:page:{page}").split()
    forged = (SAMPLE_SITE / page).read_bytes().replace(b"a", b"4")
    assert redis_server.cli("set", key, forged.decode()).strip() == "OK"
    with mounted(mnt, *args):
        assert (mnt / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()
    assert "ignoring the shared cache's copy of quickstart.mdx" in (mnt.parent / "mnt.log").read_text()


@pytest.mark.expect_log(r"ERROR .*: chroma: no Chroma database at")
def test_a_reingest_keeps_unchanged_pages_in_the_shared_cache(
    redis_server: RedisServer, mnt: Path, tmp_path: Path
) -> None:
    """Pages are cached in Redis under their sha256, not the tree's version: after a re-ingest
    that changes one page, every other page is still served from Redis (here with Chroma gone),
    and only the changed one has to come from Chroma."""
    site = tmp_path / "site"
    shutil.copytree(SAMPLE_SITE, site)
    chroma = tmp_path / "chroma"
    backend = ["--site", "acme", "--chroma-path", str(chroma), "--redis-url", redis_server.url]
    ingest(site, *backend, "--quiet")
    visible = [rel for rel in expected_visible(site, "public", None) if rel.endswith((".md", ".mdx"))]
    with mounted(mnt, *backend, "--preload", "off"):
        for rel in visible:
            assert (mnt / rel).read_bytes() == (site / rel).read_bytes(), rel
    changed = "quickstart.mdx"
    (site / changed).write_bytes((site / changed).read_bytes() + b"\nOne more line.\n")
    ingest(site, *backend, "--quiet")
    chroma.rename(tmp_path / "chroma-away")  # the new tree is in Redis; Chroma cannot answer
    with mounted(mnt, *backend, "--preload", "off", "--readahead-pages", "0", "--backend-timeout", "3"):
        for rel in visible:
            if rel != changed:
                assert (mnt / rel).read_bytes() == (site / rel).read_bytes(), rel
        with pytest.raises(OSError) as info:
            (mnt / changed).read_bytes()
        assert info.value.errno == errno.EIO
