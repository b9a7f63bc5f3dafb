"""Mount lifecycle: argument order, clear failures, signals, stale mounts."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import MOUNT, SAMPLE_SITE, Backend, free_port, is_mounted, mounted, try_mount, unmount, wait_gone


def test_mountpoint_may_come_last(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    proc = subprocess.run(
        [MOUNT, *sample_backend().args, str(mnt)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        assert (mnt / "auth" / "oauth.mdx").is_file()
    finally:
        unmount(mnt)


def test_missing_site_fails_with_one_line(sample_chroma: Callable[[str], Path], mnt: Path) -> None:
    proc = try_mount(mnt, "--site", "nosuchsite", "--chroma-path", str(sample_chroma("public")))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "nosuchsite" in proc.stderr
    assert not is_mounted(mnt)


def test_unreachable_chroma_server_fails_fast(mnt: Path) -> None:
    started = time.monotonic()
    proc = try_mount(mnt, "--site", "acme", "--chroma-url", f"http://127.0.0.1:{free_port()}", "--backend-timeout", "3")
    assert proc.returncode == 1
    assert proc.stderr.startswith("chromafs-mount: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert time.monotonic() - started < 30
    assert not is_mounted(mnt)


def test_not_a_directory_and_already_mounted(sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path) -> None:
    backend = sample_backend().args
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = try_mount(a_file, *backend)
    assert proc.returncode == 1 and "not a directory" in proc.stderr
    with mounted(mnt, *backend):
        again = try_mount(mnt, *backend)
        assert again.returncode == 1 and "already mounted" in again.stderr
        assert (mnt / "index.mdx").is_file()


def test_sigterm_and_sigint_unmount_cleanly(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        with mounted(mnt, *sample_backend().args):
            pid = int((mnt.parent / "mnt.pid").read_text())
            reader = subprocess.Popen(
                ["grep", "-rc", "e", str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            os.kill(pid, signum)
            assert wait_gone(pid), "daemon did not exit"
            reader.wait(timeout=30)
            assert not is_mounted(mnt)
        assert "unmounted" in (mnt.parent / "mnt.log").read_text()


def test_killed_daemon_leaves_stale_mount_that_the_next_mount_cleans(
    sample_backend: Callable[..., Backend], mnt: Path
) -> None:
    backend = sample_backend().args
    with mounted(mnt, *backend):
        pid = int((mnt.parent / "mnt.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid)
        try:
            os.statvfs(mnt)  # always reaches the daemon (a listing may come from the kernel's cache)
            raise AssertionError("expected a stale mount")
        except OSError as exc:
            # ENOTCONN: "Transport endpoint is not connected"; ECONNABORTED when the daemon's
            # watchdog aborted the connection before the kernel released it.
            assert exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        proc = try_mount(mnt, *backend)
        assert proc.returncode == 0, proc.stderr
        assert (mnt / "index.mdx").is_file()


def test_an_aborted_connection_is_cleaned_by_the_next_mount(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    """What a watchdog leaves behind: a mount whose connection was aborted through fusectl."""
    from chromafs_fuse.serving.watchdog import FUSECTL, connection_of

    backend = sample_backend().args
    with mounted(mnt, *backend, "--no-push-pages"):
        connection = connection_of(str(mnt))
        assert connection is not None
        if not os.path.isdir(os.path.join(FUSECTL, str(connection))):
            subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], check=True)
        with open(os.path.join(FUSECTL, str(connection), "abort"), "w") as f:
            f.write("1")
        with pytest.raises(OSError) as info:
            os.statvfs(mnt)
        # ECONNABORTED for a request the abort caught in flight, ENOTCONN for any after it.
        assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        proc = try_mount(mnt, *backend)
        assert proc.returncode == 0, proc.stderr
        assert (mnt / "index.mdx").read_bytes() == (SAMPLE_SITE / "index.mdx").read_bytes()
