"""An ingest's memory is set by its window, not by the site (issue 47): in the production shape
with no blob store (`chroma run`, binary files kept in Chroma), a site with four times the binary
bytes costs the ingest no more memory than a few batches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from infra import INGEST, SAMPLE_SITE, ChromaServer, child_env

FILE_BYTES = 2 * 1024 * 1024
# peak RSS of one child, in kB (ru_maxrss of the wrapper's children: the ingest alone)
PEAK_OF_CHILD = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(done.stderr)\n"
)


def site_with_binaries(folder: Path, mib: int) -> Path:
    shutil.copytree(SAMPLE_SITE, folder)
    images = folder / "images"
    images.mkdir(exist_ok=True)
    for n in range(mib * 1024 * 1024 // FILE_BYTES):
        (images / f"figure-{n:03d}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(FILE_BYTES))
    return folder


def peak_kb(source: Path, site: str, chroma: ChromaServer) -> int:
    argv = [sys.executable, "-c", PEAK_OF_CHILD, INGEST, str(source), "--site", site, "--chroma-url", chroma.url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())
    status, peak = done.stdout.split()
    assert status == "0", done.stderr
    return int(peak)


def test_the_ingests_memory_does_not_grow_with_the_sites_binary_files(
    fresh_chroma_server: Callable[..., ChromaServer], tmp_path: Path
) -> None:
    chroma = fresh_chroma_server("chroma")
    small = peak_kb(site_with_binaries(tmp_path / "small", 48), "small", chroma)
    large = peak_kb(site_with_binaries(tmp_path / "large", 192), "large", chroma)
    # 144 MiB more binary files; the whole site in memory (before issue 47) grew the peak by more
    # than that
    assert large - small < 48 * 1024, f"peak {small} kB with 48 MiB of binary files, {large} kB with 192 MiB"
