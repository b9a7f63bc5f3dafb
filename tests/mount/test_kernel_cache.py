"""No-open mode: once a mount has served a file or a directory, the kernel serves it
again without asking the daemon - the metrics endpoint shows no new request of any
kind for a second `grep -r`, `cat`, `find` and `ls -R` - and the bytes stay exact."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from infra import SAMPLE_SITE, expected_visible, free_port, kernel_open_mode, mounted, run

REQUEST_LINE = re.compile(r'^chromafs_requests_total\{op="(\w+)"\} ([0-9.e+]+)$', re.M)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _requests(port: int) -> dict[str, int]:
    text = _metrics(port)
    counts = {op: int(float(count)) for op, count in REQUEST_LINE.findall(text)}
    counts.pop("statfs", None)  # asked once per tool run (find checks the filesystem type), never per file
    return counts


def _tools(mnt: Path) -> dict[str, str]:
    outputs = {
        "grep": run(["grep", "-rl", "e", str(mnt)]).stdout,
        "cat": subprocess.run(
            ["sh", "-c", f"find {mnt} -type f | sort | xargs cat | sha256sum"], capture_output=True, text=True
        ).stdout,
        "find": run(["find", str(mnt), "-name", "*.mdx"]).stdout,
        "ls": run(["ls", "-laR", str(mnt)]).stdout,
        "rg": run(["rg", "-l", "--sort", "path", "token", str(mnt)]).stdout,
    }
    assert all(outputs.values()), outputs
    return outputs


def test_the_test_venv_has_the_inode_passing_pyfuse3() -> None:
    # scripts/setup builds it; without it every test below would pass in open mode unnoticed.
    assert importlib.util.find_spec("pyfuse3.chromafs_inode_fallback") is not None


def test_second_pass_of_every_tool_never_reaches_the_daemon(sample_chroma: Callable[[str], Path], mnt: Path) -> None:
    port = free_port()
    chroma = sample_chroma("public")
    with mounted(mnt, "--site", "acme", "--chroma-path", str(chroma), "--metrics-addr", f"127.0.0.1:{port}"):
        assert kernel_open_mode(mnt) == "skipped"
        first = _tools(mnt)
        after_first = _requests(port)
        second = _tools(mnt)
        after_second = _requests(port)
        assert second == first
        assert after_second == after_first, "a warm pass reached the daemon"
        assert after_first.get("open", 0) <= 1 and after_first.get("opendir", 0) <= 1
        assert after_first.get("release", 0) == 0 and after_first.get("releasedir", 0) == 0
        # The kernel holds every page read: the daemon keeps no copy of them, only the lazy
        # (blob) files' blocks, which it caches by block.
        cached = float(re.search(r"^chromafs_cached_bytes ([0-9.e+]+)$", _metrics(port), re.M).group(1))  # type: ignore[union-attr]
        visible = expected_visible(SAMPLE_SITE, "public", None)
        blob_bytes = sum((SAMPLE_SITE / r).stat().st_size for r in visible if r.endswith(".png"))
        assert blob_bytes > 0 and cached <= blob_bytes, f"{cached} bytes still cached after the kernel read them"
        for relative in expected_visible(SAMPLE_SITE, "public", None):
            source = SAMPLE_SITE / relative
            if source.is_file():
                assert (mnt / relative).read_bytes() == source.read_bytes(), relative


def test_a_warm_kernel_mount_reads_no_page_through_the_daemon(sample_chroma: Callable[[str], Path], mnt: Path) -> None:
    """--warm-kernel: once the mount answers ready (its --warm-wait), every page is in the kernel,
    so reading every page for the first time reaches the daemon with no read at all (the
    images are blobs, read by range when read)."""
    port = free_port()
    chroma = sample_chroma("public")
    args = ["--site", "acme", "--chroma-path", str(chroma), "--metrics-addr", f"127.0.0.1:{port}"]
    with mounted(mnt, *args, "--warm-kernel", "--warm-wait", "60"):
        assert kernel_open_mode(mnt) == "skipped"
        before = _requests(port)
        files = sorted(path for path in mnt.rglob("*") if path.is_file() and path.suffix != ".png")
        assert files
        for path in files:
            assert path.read_bytes() == (SAMPLE_SITE / path.relative_to(mnt)).read_bytes(), path
        after = _requests(port)
        assert after.get("read", 0) == before.get("read", 0), "a page was not in the kernel"
