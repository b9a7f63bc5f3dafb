"""Collections written by the oldest chromadb the package allows (pyproject: chromadb>=1.0),
embedded and behind its own `chroma run`, read by chromafs on the newest it allows (the one
installed). The old chromadb is installed from the package registry into a directory of its
own and put first on PYTHONPATH of the commands that write."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra import INGEST, SAMPLE_SITE, ChromaServer, expected_visible, mounted

OLDEST = "1.0.0"
# What chromadb 1.0.0 imports that later releases (the venv's) no longer pull in.
OLD_EXTRAS = ["posthog==3.25.0", "backoff", "monotonic", "distro"]


@pytest.fixture(scope="module")
def oldest_chromadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    target = tmp_path_factory.mktemp("chromadb-oldest")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    proc = subprocess.run(
        [*pip, "--target", str(target), f"chromadb=={OLDEST}", *OLD_EXTRAS], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    check = subprocess.run(
        [sys.executable, "-c", "import chromadb; print(chromadb.__version__)"], env=env, capture_output=True, text=True
    )
    assert check.stdout.strip() == OLDEST, check.stderr
    yield env


def ingest_with(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run(
        [INGEST, str(SAMPLE_SITE), "--site", "old", "--default-access", "public", "--quiet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr


def assert_reads_the_site(mnt: Path) -> None:
    visible = expected_visible(SAMPLE_SITE, "public", None)
    shown = {str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.is_file()}
    assert shown == visible
    for key in visible:
        assert (mnt / key).read_bytes() == (SAMPLE_SITE / key).read_bytes(), key


def test_an_embedded_collection_written_by_the_oldest_chromadb(
    oldest_chromadb: dict[str, str], tmp_path: Path, mnt: Path
) -> None:
    chroma = tmp_path / "chroma"
    ingest_with(oldest_chromadb, "--chroma-path", str(chroma))
    with mounted(mnt, "--site", "old", "--chroma-path", str(chroma), "--preload", "off"):
        assert_reads_the_site(mnt)


def test_a_server_of_the_oldest_chromadb(
    oldest_chromadb: dict[str, str],
    tmp_path: Path,
    mnt: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_chroma_server: Callable[..., ChromaServer],
) -> None:
    monkeypatch.setenv("PYTHONPATH", oldest_chromadb["PYTHONPATH"])  # the server runs the old release
    server = fresh_chroma_server("data")  # of its own: the old release, not the session's
    monkeypatch.delenv("PYTHONPATH")
    blobs = f"file://{tmp_path / 'blobs'}"  # binary files: embedded Chroma keeps them beside its data
    ingest_with(oldest_chromadb, "--chroma-url", server.url, "--blob-store", blobs)
    with mounted(mnt, "--site", "old", "--chroma-url", server.url, "--preload", "off"):
        assert_reads_the_site(mnt)
