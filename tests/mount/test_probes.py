"""Access control, attacked: every way a reader without a group might learn about
or read a hidden page. Each must find nothing."""

from __future__ import annotations

import errno
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra import SAMPLE_SITE, Backend, expected_visible, mounted, reader_args, tree_listing

HIDDEN_FOR_ANON = sorted(
    expected_visible(SAMPLE_SITE, "public", {"admin", "billing"}) - expected_visible(SAMPLE_SITE, "public", None)
)


def _errno(fn: Callable[[], object]) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno or 0
    return 0


def _probes(path: Path) -> dict[str, Callable[[], object]]:
    return {
        "stat": lambda: os.stat(path),
        "lstat": lambda: os.lstat(path),
        "open": lambda: os.close(os.open(path, os.O_RDONLY)),
        "listdir": lambda: os.listdir(path),
        "access": lambda: os.access(path, os.R_OK) or (_ for _ in ()).throw(FileNotFoundError(2, "x")),
        "getxattr": lambda: os.getxattr(path, "user.x"),
        "listxattr": lambda: os.listxattr(path),
        "readlink": lambda: os.readlink(path),
        "chdir": lambda: os.chdir(path),
    }


def _variants(rel: str) -> list[str]:
    out = [
        rel,
        rel.upper(),
        rel.swapcase(),
        rel + "/",
        rel.replace("/", "//"),
        "./" + rel,
        unicodedata.normalize("NFD", rel),
        rel.rsplit("/", 1)[0],
    ]
    return [
        v for v in out if v and v not in {r.rsplit("/", 1)[0] for r in expected_visible(SAMPLE_SITE, "public", None)}
    ]


def test_hidden_pages_answer_exactly_like_missing_ones(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    cwd = os.getcwd()
    with mounted(mnt, *sample_backend().args):
        try:
            for rel in HIDDEN_FOR_ANON:
                missing = rel.rsplit("/", 1)[0] + "/no-such-page-" + str(len(rel)) + ".mdx"
                for variant in _variants(rel):
                    for name, probe in _probes(mnt / variant).items():
                        hidden_errno = _errno(probe)
                        missing_errno = _errno(_probes(mnt / missing)[name])
                        assert hidden_errno == missing_errno != 0, (
                            variant,
                            name,
                            hidden_errno,
                            missing_errno,
                        )
        finally:
            os.chdir(cwd)
        # nothing hidden in any listing, and no directory made only of hidden pages
        listing = tree_listing(mnt)
        for rel in HIDDEN_FOR_ANON:
            assert rel not in listing
        assert "internal/secret-project" not in listing and "admin" not in listing


def test_listings_counts_inodes_and_xattrs_reveal_nothing(
    sample_backend: Callable[..., Backend], token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    backend = sample_backend().args
    anon, admin = tmp_path / "anon", tmp_path / "admin"
    admin_args = reader_args(token_file(["admin", "billing"]), secret_file)
    with (
        mounted(anon, *backend),
        mounted(admin, *backend, *admin_args),
    ):
        visible = expected_visible(SAMPLE_SITE, "public", None)
        for rel in visible:
            a, b = os.stat(anon / rel), os.stat(admin / rel)
            assert a.st_ino == b.st_ino, "inode numbers must not depend on what else is visible"
            assert (a.st_size, a.st_mode, a.st_mtime_ns) == (b.st_size, b.st_mode, b.st_mtime_ns)
            with pytest.raises(OSError) as no_xattrs:
                os.listxattr(anon / rel)
            assert no_xattrs.value.errno == errno.EOPNOTSUPP
        for directory in {r.rsplit("/", 1)[0] for r in visible if "/" in r} | {"."}:
            names = set(os.listdir(anon / directory))
            assert names == {p.name for p in (anon / directory).iterdir()}
            st = os.stat(anon / directory)
            subdirs = sum(1 for n in names if (anon / directory / n).is_dir())
            assert st.st_nlink == 2 + subdirs  # nlink does not count hidden subdirectories
        anon_fs, admin_fs = os.statvfs(anon), os.statvfs(admin)
        assert anon_fs.f_files < admin_fs.f_files and anon_fs.f_blocks <= admin_fs.f_blocks


def test_hidden_and_missing_lookups_take_the_same_time(sample_backend: Callable[..., Backend], mnt: Path) -> None:
    # --cache-timeout 0: every lookup reaches the daemon instead of the kernel's negative cache
    with mounted(mnt, *sample_backend().args, "--cache-timeout", "0"):
        hidden = [mnt / rel for rel in HIDDEN_FOR_ANON]
        missing = [mnt / (rel + ".nope") for rel in HIDDEN_FOR_ANON]

        def timed(paths: list[Path]) -> list[float]:
            out = []
            for path in paths:
                started = time.perf_counter_ns()
                _errno(lambda p=path: os.stat(p))
                out.append(time.perf_counter_ns() - started)
            return out

        hidden_times: list[float] = []
        missing_times: list[float] = []
        for _ in range(30):  # interleaved, so drift hits both alike
            hidden_times += timed(hidden)
            missing_times += timed(missing)
        ratio = statistics.median(hidden_times) / statistics.median(missing_times)
        assert 0.67 < ratio < 1.5, f"hidden/missing lookup time ratio {ratio:.2f}"


@pytest.fixture
def shared_mountpoint() -> Iterator[Path]:
    """A mountpoint other users can reach (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="chromafs-allow-other-"))
    base.chmod(0o755)
    (base / "mnt").mkdir()
    (base / "mnt").chmod(0o755)
    yield base / "mnt"
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("allow_other", [False, True])
def test_other_local_users(allow_other: bool, sample_backend: Callable[..., Backend], shared_mountpoint: Path) -> None:
    options = ["-o", "allow_other"] if allow_other else []
    with mounted(shared_mountpoint, *sample_backend().args, *options, "--log-file", "/dev/null"):
        page = shared_mountpoint / "auth" / "oauth.mdx"
        cat = _as_nobody("cat", str(page))
        write = _as_nobody("sh", "-c", f"echo x >> '{page}'")
        hidden = _as_nobody("stat", str(shared_mountpoint / "internal" / "billing.mdx"))
        if allow_other:
            assert cat.returncode == 0 and cat.stdout.encode() == page.read_bytes()
            assert write.returncode != 0 and "Read-only file system" in write.stderr
            assert hidden.returncode != 0 and "No such file or directory" in hidden.stderr
        else:
            assert cat.returncode != 0 and "Permission denied" in cat.stderr
            assert write.returncode != 0
