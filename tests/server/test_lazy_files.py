"""Large and binary files as lazy pointers into S3 (moto's server on loopback)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from infra import INGEST, SAMPLE_SITE, S3Server, mounted, run

SPEC = "openapi/openapi.json"


def _ingest_to_s3(s3: S3Server, chroma: Path) -> None:
    s3.client().create_bucket(Bucket="docs")
    env = {**os.environ, **s3.env}
    proc = subprocess.run(
        [
            INGEST,
            str(SAMPLE_SITE),
            "--site",
            "acme",
            "--chroma-path",
            str(chroma),
            "--blob-store",
            "s3://docs/acme",
            "--large-file-threshold",
            "100000",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lazy files (blob store): 3" in proc.stdout  # the spec and two images


def _moved(log: str) -> int:
    return sum(int(n) for n in re.findall(r"moved (\d+) bytes", log))


def test_ranged_reads_move_only_what_is_asked(s3_server: S3Server, mnt: Path, tmp_path: Path) -> None:
    _ingest_to_s3(s3_server, tmp_path / "chroma")
    spec_size = (SAMPLE_SITE / SPEC).stat().st_size
    with mounted(
        mnt,
        "--site",
        "acme",
        "--chroma-path",
        str(tmp_path / "chroma"),
        "--preload",
        "off",
        "--log-level",
        "debug",
        env=s3_server.env,
    ):
        assert os.stat(mnt / SPEC).st_size == spec_size  # size from the pointer, nothing fetched
        assert _moved((tmp_path / "mnt.log").read_text()) == 0
        head = run(["head", "-c", "100", str(mnt / SPEC)])
        assert head.stdout.encode() == (SAMPLE_SITE / SPEC).read_bytes()[:100]
        moved_by_head = _moved((tmp_path / "mnt.log").read_text())
        assert 0 < moved_by_head <= 256 * 1024 < spec_size
        for rel in (SPEC, "images/logo.png", "images/diagram.png"):
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes(), rel
        assert _moved((tmp_path / "mnt.log").read_text()) < 2 * spec_size


@pytest.mark.expect_log(r"ERROR .*reading images/diagram\.png: cannot read s3://")
def test_s3_down_fails_that_file_only(s3_server: S3Server, mnt: Path, tmp_path: Path) -> None:
    _ingest_to_s3(s3_server, tmp_path / "chroma")
    with mounted(
        mnt, "--site", "acme", "--chroma-path", str(tmp_path / "chroma"), "--preload", "off", env=s3_server.env
    ):
        assert (mnt / "images/logo.png").read_bytes() == (SAMPLE_SITE / "images/logo.png").read_bytes()
        s3_server.stop()
        started = time.monotonic()
        with pytest.raises(OSError) as info:
            (mnt / "images/diagram.png").read_bytes()
        assert info.value.errno == 5
        assert time.monotonic() - started < 15
        assert (mnt / "auth/oauth.mdx").read_bytes() == (SAMPLE_SITE / "auth/oauth.mdx").read_bytes()
        assert (mnt / "images/logo.png").read_bytes() == (SAMPLE_SITE / "images/logo.png").read_bytes()  # cached
