"""chromafs-mountd: a resident mount server that forks ready mounts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import SAMPLE_SITE, copy_subset, expected_visible, ingest, is_mounted, run, try_mount
from infra import BIN, MountServer, RedisServer, unmount


@pytest.fixture
def mountd(tmp_path: Path) -> Iterator[Path]:
    with MountServer(tmp_path, isolated=True) as server:  # a daemon per mount (shared mounts: test_sessions)
        yield server.socket
    assert not server.socket.exists()


def test_mount_through_the_server(
    mountd: Path,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    chroma = str(sample_chroma("public"))
    mounts = [tmp_path / "anon", tmp_path / "billing"]
    for m in mounts:
        m.mkdir()
    try:
        assert try_mount(mounts[0], "--site", "acme", "--chroma-path", chroma, "--mountd", str(mountd)).returncode == 0
        billing = try_mount(
            mounts[1],
            "--site",
            "acme",
            "--chroma-path",
            chroma,
            "--mountd",
            str(mountd),
            "--token-file",
            str(token_file(["billing"])),
            "--jwt-secret-file",
            str(secret_file),
        )
        assert billing.returncode == 0, billing.stderr
        for m, groups in zip(mounts, (None, {"billing"}), strict=True):
            copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"exp-{m.name}")
            diff = run(["diff", "-r", str(copy), str(m)])
            assert diff.returncode == 0, diff.stdout
        bad = try_mount(tmp_path / "anon", "--site", "acme", "--chroma-path", chroma, "--mountd", str(mountd))
        assert bad.returncode == 1 and "already mounted" in bad.stderr
        (tmp_path / "bad").mkdir()
        expired = try_mount(
            tmp_path / "bad",
            "--site",
            "acme",
            "--chroma-path",
            chroma,
            "--mountd",
            str(mountd),
            "--token-file",
            str(token_file(["admin"], exp=int(time.time()) - 10)),
            "--jwt-secret-file",
            str(secret_file),
        )
        assert expired.returncode == 1 and expired.stderr.strip() == "chromafs-mount: token has expired"
        assert not is_mounted(tmp_path / "bad")
    finally:
        for m in mounts:
            unmount(m)


def test_mounts_outlive_the_server(mountd: Path, sample_chroma: Callable[[str], Path], mnt: Path) -> None:
    assert (
        try_mount(
            mnt, "--site", "acme", "--chroma-path", str(sample_chroma("public")), "--mountd", str(mountd)
        ).returncode
        == 0
    )
    try:
        # the server is stopped by the fixture after this test; here, kill -TERM it early
        pids = subprocess.run(["pgrep", "-f", f"chromafs-mountd --socket {mountd}"], capture_output=True, text=True)
        for pid in pids.stdout.split():
            os.kill(int(pid), signal.SIGTERM)
        time.sleep(0.5)
        assert (mnt / "auth" / "oauth.mdx").read_bytes() == (SAMPLE_SITE / "auth" / "oauth.mdx").read_bytes()
    finally:
        unmount(mnt)


def test_unreachable_server_fails_with_one_line(tmp_path: Path, mnt: Path) -> None:
    proc = try_mount(mnt, "--site", "acme", "--chroma-path", str(tmp_path), "--mountd", str(tmp_path / "nope.sock"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "chromafs-mountd" in proc.stderr


def test_server_hands_over_the_tree_from_redis_and_sees_a_reingest(
    mountd: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(SAMPLE_SITE, site)
    chroma = str(tmp_path / "chroma")
    ingest(site, "--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--quiet")
    args = ["--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--mountd", str(mountd)]
    for round_number in range(2):
        mnt = tmp_path / f"mnt{round_number}"
        mnt.mkdir()
        log = tmp_path / f"mnt{round_number}.log"
        try:
            proc = try_mount(mnt, *args, "--log-file", str(log))
            assert proc.returncode == 0, proc.stderr
            assert "handed over by the mount server" in log.read_text()
            assert (mnt / "quickstart.mdx").read_bytes() == (site / "quickstart.mdx").read_bytes()
        finally:
            unmount(mnt)
        (site / "quickstart.mdx").write_text("# Changed by a re-ingest\n")
        ingest(site, "--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--quiet")


def test_each_mount_from_a_shared_table_is_scoped_to_its_own_reader(
    mountd: Path, redis_server: RedisServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """Two readers with the same groups share the server's pruned table, but each forked mount
    serves (and reports) its own reader, from the token the server verified for it."""
    chroma = str(tmp_path / "chroma")
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--quiet")
    args = ["--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--mountd", str(mountd)]
    auth = ["--jwt-secret-file", str(secret_file)]
    readers = {"alice": tmp_path / "alice", "bob": tmp_path / "bob"}
    try:
        for subject, mnt in readers.items():
            mnt.mkdir()
            log = tmp_path / f"{subject}.log"
            token = token_file(["billing"], sub=subject)
            proc = try_mount(mnt, *args, *auth, "--token-file", str(token), "--log-file", str(log))
            assert proc.returncode == 0, proc.stderr
            assert "handed over by the mount server" in log.read_text()
        status = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
        reader_of = {s["mountpoint"]: s.get("reader") for s in json.loads(status.stdout)}
        expected = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", {"billing"}), tmp_path / "exp")
        for subject, mnt in readers.items():
            assert reader_of[str(mnt)] == f"user={subject} groups=billing"
            assert run(["diff", "-r", str(expected), str(mnt)]).returncode == 0
    finally:
        for mnt in readers.values():
            unmount(mnt)


def test_readers_of_different_groups_through_the_server_never_share_a_table(
    mountd: Path, redis_server: RedisServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """Anonymous, billing and admin readers mounted through one server with Redis, in an order that
    would hand a later reader an earlier reader's pruned table if the key left out the groups."""
    chroma = str(tmp_path / "chroma")
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--quiet")
    args = ["--site", "acme", "--chroma-path", chroma, "--redis-url", redis_server.url, "--mountd", str(mountd)]
    auth = ["--jwt-secret-file", str(secret_file)]
    readers: dict[str, tuple[list[str], set[str] | None]] = {
        "billing": (["--token-file", str(token_file(["billing"]))], {"billing"}),
        "admin": (["--token-file", str(token_file(["admin"]))], {"admin"}),
        "anonymous": ([], None),
        "billing2": (["--token-file", str(token_file(["billing"], sub="other"))], {"billing"}),
    }
    try:
        for name, (token_args, groups) in readers.items():
            mnt = tmp_path / name
            mnt.mkdir()
            proc = try_mount(mnt, *args, *(auth if token_args else []), *token_args)
            assert proc.returncode == 0, proc.stderr
            expected = copy_subset(
                SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"expected-{name}"
            )
            assert run(["diff", "-r", str(expected), str(mnt)]).returncode == 0, name
    finally:
        for name in readers:
            unmount(tmp_path / name)
