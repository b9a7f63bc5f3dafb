"""A real FUSE mount of the sample site, for each kind of reader: exactly the
visible files, byte for byte, and nothing of the hidden ones."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import SAMPLE_SITE, Backend, copy_subset, expected_visible, mounted, reader_args, run, tree_listing

READERS = {
    "anonymous": None,
    "authenticated": set(),
    "billing": {"billing"},
    "admin": {"admin"},
}

REFERENCE_TABLE = {
    # path: readers who may see it
    "auth/oauth.mdx": {"anonymous", "authenticated", "billing", "admin"},
    "internal/billing.mdx": {"billing", "admin"},
    "api-reference/payments.mdx": {"billing"},
}


def mount_args(chroma: Path, reader: str, token_file: Callable[..., Path], secret: Path) -> list[str]:
    groups = READERS[reader]
    token = None if groups is None else token_file(sorted(groups))
    return [*Backend("acme", chroma).args, *reader_args(token, secret)]


def directories_of(files: set[str]) -> set[str]:
    dirs = set()
    for f in files:
        parts = f.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return dirs


@pytest.mark.parametrize("default", ["public", "authenticated"])
@pytest.mark.parametrize("reader", list(READERS))
def test_reader_sees_exactly_the_visible_files(
    default: str,
    reader: str,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    mnt: Path,
    tmp_path: Path,
) -> None:
    visible = expected_visible(SAMPLE_SITE, default, READERS[reader])
    everything = expected_visible(SAMPLE_SITE, default, {"admin", "billing"})
    hidden = everything - visible
    assert visible and (reader == "admin" or hidden), "the sample site must exercise both sides"
    copy = copy_subset(SAMPLE_SITE, visible, tmp_path / "expected")

    with mounted(mnt, *mount_args(sample_chroma(default), reader, token_file, secret_file)):
        diff = run(["diff", "-r", str(copy), str(mnt)])
        assert diff.returncode == 0, diff.stdout + diff.stderr

        listing = tree_listing(mnt)
        assert listing == visible | directories_of(visible)
        ls_r = run(["ls", "-R", str(mnt)]).stdout
        grep = run(["grep", "-rl", "", str(mnt)]).stdout
        rg = run(["rg", "--files", "--hidden", str(mnt)]).stdout
        for rel in hidden:
            name = rel.rsplit("/", 1)[-1]
            assert f"/{rel}" not in grep and f"/{rel}" not in rg
            with pytest.raises(FileNotFoundError):
                os.stat(mnt / rel)
            if not any(v.rsplit("/", 1)[-1] == name for v in visible):
                assert name not in ls_r
        for path, readers in REFERENCE_TABLE.items():
            allowed = reader in readers or (default == "public" and False)
            assert (mnt / path).exists() == allowed, path
            if allowed:
                assert (mnt / path).read_bytes() == (SAMPLE_SITE / path).read_bytes()


def test_directory_of_only_hidden_pages_does_not_exist(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, mnt: Path
) -> None:
    with mounted(mnt, *mount_args(sample_chroma("public"), "billing", token_file, secret_file)):
        assert "secret-project" not in os.listdir(mnt / "internal")
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / "internal" / "secret-project")
        with pytest.raises(FileNotFoundError):
            os.listdir(mnt / "internal" / "secret-project")
        # hidden and never-existing names fail the same way
        for probe in ["internal/secret-project", "internal/no-such-dir", "admin/audit-log.mdx", "admin/nope.mdx"]:
            with pytest.raises(OSError) as info:
                os.lstat(mnt / probe)
            assert info.value.errno == errno.ENOENT


def test_tools_work_and_stat_is_exact(sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path) -> None:
    copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", None), tmp_path / "expected")
    with mounted(mnt, *sample_backend().args):
        for cmd in (
            ["grep", "-rn", "refresh token", "."],
            ["grep", "-rlE", "refresh|Bearer [a-z]+", "."],
            ["rg", "-n", "--sort", "path", "oauth", "."],
        ):
            on_mount = run(cmd, cwd=mnt)
            on_copy = run(cmd, cwd=copy)
            assert on_mount.returncode == on_copy.returncode == 0, cmd
            assert sorted(on_mount.stdout.splitlines()) == sorted(on_copy.stdout.splitlines()), cmd
        assert "./auth/oauth.mdx:29:" in run(["grep", "-rn", "refresh token", "."], cwd=mnt).stdout
        rg = run(["rg", "-l", "oauth", str(mnt)])
        assert f"{mnt}/auth/oauth.mdx" in rg.stdout.split("\n")
        find = run(["find", str(mnt), "-name", "*.mdx"]).stdout.split()
        assert f"{mnt}/auth/oauth.mdx" in find
        for rel in [
            "auth/oauth.mdx",
            "guides/getting started.mdx",
            "日本語/はじめに.md",
            "images/logo.png",
            "openapi/openapi.json",
            "guides/windows-notes.md",
            "guides/über uns.md",
        ]:
            st = os.stat(mnt / rel)
            assert st.st_size == (SAMPLE_SITE / rel).stat().st_size
            assert st.st_mode & 0o777 == 0o444
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()
        assert os.stat(mnt / "guides").st_mode & 0o777 == 0o555

        # SEMANTICS.md "Inode numbers" for a mount of its own: the root is 1, a directory the hash of
        # "0:" + path, a file with a sha256 of "0:" + path + NUL + sha256 (no site in front: a session's)
        def rule(identity: str) -> int:
            digest = hashlib.blake2b(identity.encode(), digest_size=8).digest()
            return int.from_bytes(digest, "little") & ((1 << 63) - 1)

        oauth = hashlib.sha256((SAMPLE_SITE / "auth/oauth.mdx").read_bytes()).hexdigest()
        assert os.stat(mnt).st_ino == 1
        assert os.stat(mnt / "guides").st_ino == rule("0:guides")
        assert os.stat(mnt / "auth/oauth.mdx").st_ino == rule(f"0:auth/oauth.mdx\0{oauth}")
        # stable inode numbers: the same across lookups and across mounts
        first = os.stat(mnt / "auth/oauth.mdx").st_ino
    with mounted(mnt, *sample_backend().args):
        assert os.stat(mnt / "auth/oauth.mdx").st_ino == first
        wc = subprocess.run(
            f"find {mnt} -type f -exec cat {{}} + | wc -c", shell=True, capture_output=True, text=True, check=True
        )
        visible = expected_visible(SAMPLE_SITE, "public", None)
        assert int(wc.stdout) == sum((SAMPLE_SITE / f).stat().st_size for f in visible)


def test_statfs_counts_only_visible(sample_backend: Callable[..., Backend], mnt: Path, tmp_path: Path) -> None:
    with mounted(mnt, *sample_backend().args):
        anonymous = os.statvfs(mnt)
        visible = expected_visible(SAMPLE_SITE, "public", None)
        assert anonymous.f_files == len(visible) + len(directories_of(visible)) + 1
        assert anonymous.f_blocks * anonymous.f_frsize >= sum((SAMPLE_SITE / f).stat().st_size for f in visible)
