"""Pages pushed into the kernel's page cache ahead of reads (FUSE notify_store), and the
watchdog that keeps a killed daemon from hanging its mount."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.serving.kernel_push import KernelPusher
from chromafs_fuse.serving.watchdog import connection_of
from infra import (
    SAMPLE_SITE,
    Backend,
    expected_visible,
    free_port,
    hold_for,
    mounted,
    poll_until,
    run,
    wait_gone,
    wait_until,
)

REQUEST_LINE = re.compile(r'^chromafs_requests_total\{op="(\w+)"\} ([0-9.e+]+)$', re.M)
PUSHED_LINE = re.compile(r'^chromafs_pages_pushed_total\{outcome="(\w+)"\} ([0-9.e+]+)$', re.M)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _counts(pattern: re.Pattern[str], port: int) -> dict[str, int]:
    return {name: int(float(count)) for name, count in pattern.findall(_metrics(port))}


def _text_files() -> list[str]:
    return sorted(r for r in expected_visible(SAMPLE_SITE, "public", None) if not r.endswith(".png"))


@pytest.mark.parametrize("push", [True, False], ids=["push", "no-push"])
def test_the_first_read_in_a_directory_pushes_its_siblings(
    sample_backend: Callable[..., Backend], mnt: Path, push: bool
) -> None:
    """With every page loaded (preload) and the directory listed, reading one file of it hands
    the others to the kernel: reading them then sends no request, and their bytes are exact."""
    port = free_port()
    flag = "--push-pages" if push else "--no-push-pages"
    args = (*sample_backend().args, "--preload", "on", "--metrics-addr", f"127.0.0.1:{port}")
    with mounted(mnt, *args, flag):
        log = mnt.parent / "mnt.log"
        poll_until(lambda: "preloaded" in log.read_text(), 10, 0.05)
        names = sorted(os.listdir(mnt / "guides"))  # the kernel now holds every file's inode
        files = [n for n in names if (mnt / "guides" / n).is_file()]
        assert len(files) >= 5
        first, *siblings = files
        assert (mnt / "guides" / first).read_bytes() == (SAMPLE_SITE / "guides" / first).read_bytes()
        if push:
            wait_until(
                lambda: _counts(PUSHED_LINE, port).get("stored", 0) >= len(siblings), 5, "the siblings pushed", 0.05
            )
        reads = _counts(REQUEST_LINE, port).get("read", 0)
        for name in siblings:
            assert (mnt / "guides" / name).read_bytes() == (SAMPLE_SITE / "guides" / name).read_bytes(), name
        reads_after = _counts(REQUEST_LINE, port).get("read", 0)
        if push:
            assert _counts(PUSHED_LINE, port).get("stored", 0) >= len(siblings)
            assert reads_after == reads, f"{reads_after - reads} of {len(siblings)} pushed files still asked"
        else:
            assert _counts(PUSHED_LINE, port).get("stored", 0) == 0
            assert reads_after >= reads + len(siblings)
        # A whole pass, however each page reached the kernel, gives the source's bytes.
        assert run(["grep", "-rlI", "zzz-not-there", str(mnt)]).returncode == 1
        for relative in _text_files():
            assert (mnt / relative).read_bytes() == (SAMPLE_SITE / relative).read_bytes(), relative


def test_pushing_never_shows_a_hidden_page(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    backend = sample_backend().args
    visible = expected_visible(SAMPLE_SITE, "public", None)
    every = sorted(str(p.relative_to(SAMPLE_SITE)) for p in SAMPLE_SITE.rglob("*") if p.is_file())
    hidden = [r for r in every if r not in visible]
    assert hidden, "the sample site must have hidden pages"
    with mounted(mnt, *backend, "--preload", "on"):
        run(["grep", "-rl", "e", str(mnt)])  # every visible page pushed or read
        for relative in hidden:
            with pytest.raises(FileNotFoundError):
                os.stat(mnt / relative)
        listed = {str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file()}
        assert listed == visible


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_the_watchdog_lives_and_dies_with_its_mount(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    backend = sample_backend().args
    with mounted(mnt, *backend):
        daemon = int((mnt.parent / "mnt.pid").read_text())
        (watchdog,) = _children(daemon)
        processes = [watchdog, *_children(watchdog)]  # the shell and its sleep
        # None holds a descriptor of the FUSE device: that would keep a dead daemon's mount alive.
        for pid in processes:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                assert os.readlink(f"/proc/{pid}/fd/{fd}") != "/dev/fuse"
    for pid in processes:
        assert wait_gone(pid, 5), "the watchdog outlived a normal unmount"

    with mounted(mnt, *backend):
        (watchdog,) = _children(int((mnt.parent / "mnt.pid").read_text()))
        (sleeper,) = _children(watchdog)
        os.kill(watchdog, signal.SIGKILL)  # however the shell ends, its sleep must not linger
        assert wait_gone(watchdog, 5) and wait_gone(sleeper, 5), "the watchdog's sleep outlived it"

    with mounted(mnt, *backend, "--no-push-pages"):
        assert _children(int((mnt.parent / "mnt.pid").read_text())) == []  # nothing to watch for


def test_a_killed_daemon_never_leaves_a_hung_mount(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    """SIGKILL while a reader is going through the site: the daemon and its watchdog are gone in
    seconds, the reader gets an error or its output, and the next mount works."""
    backend = sample_backend().args
    for attempt in range(5):
        with mounted(mnt, *backend, "--preload", "off", "--readahead-pages", "4"):
            daemon = int((mnt.parent / "mnt.pid").read_text())
            (watchdog,) = _children(daemon)
            reader = subprocess.Popen(
                ["grep", "-rl", "e", str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            hold_for(0.002 * attempt, "the kill lands a little later in the reads each attempt")
            os.kill(daemon, signal.SIGKILL)
            assert wait_gone(daemon, 10), "the killed daemon is stuck"
            assert wait_gone(watchdog, 10)
            reader.wait(timeout=10)
            with pytest.raises(OSError) as info:
                os.statvfs(mnt)
            assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    with mounted(mnt, *backend):
        assert (mnt / "index.mdx").read_bytes() == (SAMPLE_SITE / "index.mdx").read_bytes()


# -- the pushing thread, without a kernel ---------------------------------------------------


def test_pusher_skips_pages_being_read_and_reports_refusals() -> None:
    stored: list[list[int]] = []
    drained = threading.Event()

    def store(pages: list[tuple[int, bytes]]) -> list[int]:
        stored.append([inode for inode, _ in pages])
        return [0 if inode % 2 == 0 else -errno.ENOENT for inode, _ in pages]

    pusher = KernelPusher(store, drained.set, tags=10)
    pusher.being_read[3] = 1
    for tag in range(6):
        pusher.offer(tag, 100 + tag, b"x")
    pusher.start()
    try:
        assert drained.wait(5)
        wait_until(lambda: len(pusher.outcomes) >= 6, 5, "six outcomes", 0.01)
        outcomes = dict(pusher.outcomes)
        assert outcomes == {0: True, 1: False, 2: True, 3: False, 4: True, 5: False}
        assert 103 not in [inode for batch in stored for inode in batch]  # being read: never stored
        assert (pusher.stored, pusher.refused, pusher.skipped) == (3, 2, 1)
    finally:
        pusher.stop()


def test_connection_of_reads_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /proc rw - proc proc rw\n"
        "90 22 0:47 / /srv/docs\\040site rw - fuse.chromafs chromafs:acme ro\n"
        "91 22 8:1 / /srv/other rw - ext4 /dev/sda1 rw\n"
        "95 90 0:52 / /srv/docs\\040site rw - fuse.chromafs chromafs:acme ro\n"
    )
    assert connection_of("/srv/docs site", str(info)) == 52  # the mount on top is the visible one
    assert connection_of("/srv/other", str(info)) is None  # not a FUSE (anonymous device) mount
    assert connection_of("/srv/none", str(info)) is None
