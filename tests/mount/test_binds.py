"""serving/binds.py against the kernel: a path's mount device read for that path alone
(`device_at`, what a mount server's request asks, whatever the number of mounts on the host)
says what the whole mount table says, and never waits on a FUSE daemon that does not answer."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from chromafs_fuse.serving.binds import bind_read_only, detach, device_at, mounted_devices
from infra import Backend, mounted


def test_a_paths_device_is_the_mount_tables(sample_backend: Callable[..., Backend], tmp_path: Path) -> None:
    mnt, bind, plain, tmpfs = (tmp_path / name for name in ("mnt", "bind", "plain", "tmpfs"))
    for path in (bind, plain, tmpfs):
        path.mkdir()
    with mounted(mnt, *sample_backend().args):
        bind_read_only(str(mnt / "guides"), str(bind))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", str(tmpfs)], check=True)
        try:
            table = mounted_devices()
            for path in (mnt, bind, tmpfs):
                assert device_at(str(path)) == table[str(path)] is not None, path
            assert device_at(str(bind)) == device_at(str(mnt))  # a bind shows its source's device
            for path in (plain, mnt / "guides", tmp_path / "missing", tmp_path):
                assert device_at(str(path)) is None, path
        finally:
            detach(str(bind))
            detach(str(tmpfs))
    assert device_at(str(mnt)) is None and device_at(str(bind)) is None


def test_a_hung_daemon_never_blocks_the_question(sample_backend: Callable[..., Backend], tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with mounted(mnt, *sample_backend().args, "--cache-timeout", "0"):
        expected = mounted_devices()[str(mnt)]
        pid = int((tmp_path / "mnt.pid").read_text())
        os.kill(pid, signal.SIGSTOP)  # the daemon hangs: a stat of its root would wait for it
        try:
            answers: list[str | None] = []
            asking = threading.Thread(target=lambda: answers.append(device_at(str(mnt))), daemon=True)
            asking.start()
            asking.join(5)
            assert answers == [expected], "device_at waited on the daemon"
        finally:
            os.kill(pid, signal.SIGCONT)
