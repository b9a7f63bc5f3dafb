"""Every way to change the mount fails with EROFS; extended attributes are not supported."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import Backend, mounted


def mount_options() -> list[tuple[str, str]]:
    with open("/proc/self/mounts") as f:
        return [(fields[1], fields[3]) for fields in (line.split() for line in f)]


def _errno_of(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError) as info:
        fn()
    return info.value.errno or 0


@pytest.mark.parametrize("options", [[], ["-o", "rw"]], ids=["default", "asked-for-rw"])
def test_writes_fail_with_erofs(sample_backend: Callable[..., Backend], mnt: Path, options: list[str]) -> None:
    with mounted(mnt, *sample_backend().args, *options):
        (entry,) = [e for e in mount_options() if e[0] == str(mnt)]
        assert "ro" in entry[1].split(","), "the kernel must see a read-only mount"
        page = mnt / "auth" / "oauth.mdx"
        before = page.read_bytes()
        attempts: dict[str, Callable[[], object]] = {
            "open for write": lambda: os.open(page, os.O_RDWR),
            "open for append": lambda: os.open(page, os.O_WRONLY | os.O_APPEND),
            "truncate": lambda: os.truncate(page, 0),
            "create": lambda: os.open(mnt / "new.md", os.O_CREAT | os.O_WRONLY, 0o644),
            "mkdir": lambda: os.mkdir(mnt / "newdir"),
            "unlink": lambda: os.unlink(page),
            "rmdir": lambda: os.rmdir(mnt / "auth"),
            "rename": lambda: os.rename(page, mnt / "auth" / "moved.mdx"),
            "chmod": lambda: os.chmod(page, 0o644),
            "utime": lambda: os.utime(page, (0, 0)),
            "symlink": lambda: os.symlink("oauth.mdx", mnt / "auth" / "link"),
            "link": lambda: os.link(page, mnt / "auth" / "hard"),
            "setxattr": lambda: os.setxattr(page, "user.x", b"1"),
            "removexattr": lambda: os.removexattr(page, "user.x"),
            "mknod": lambda: os.mknod(mnt / "fifo", 0o600 | 0o010000),
        }
        for what, attempt in attempts.items():
            assert _errno_of(attempt) == errno.EROFS, what
        assert page.read_bytes() == before
        assert _errno_of(lambda: os.listxattr(page)) == errno.EOPNOTSUPP
        assert _errno_of(lambda: os.getxattr(page, "user.anything")) == errno.EOPNOTSUPP
        assert not os.access(page, os.W_OK)
        assert os.access(page, os.R_OK)
