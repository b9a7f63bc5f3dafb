"""scripts/rehearse-hosts, small: two mount hosts (chromafs-mountd) on one `chroma run`, a Redis Cluster
and moto S3, one session per class per host, over the sample site. Its bars hold, and the figures it
reports say what they should: the shared cache keeps Chroma's load flat as a host is added."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import REPO, SAMPLE_SITE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chromafs-mountd's class mounts need root")


def test_two_hosts_share_one_chroma_redis_cluster_and_s3(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    argv = [sys.executable, str(REPO / "scripts" / "rehearse-hosts"), str(SAMPLE_SITE), "--hosts", "2"]
    done = subprocess.run([*argv, "--sessions", "1", "--json", str(report_file)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_file.read_text())
    assert report["failures"] == []
    assert report["listings"] == {"sessions": 6, "leaks": 0, "missing": 0, "examples": []}
    assert report["master_kill"]["read_errors"] == 0 and report["master_kill"]["reads"] > 0
    assert {(c["redis_lost"], c["redis_back"]) for c in report["master_kill"]["class_mount_logs"].values()} == {(1, 1)}
    assert report["live_update"]["sessions_updated"] == 6 and report["live_update"]["max_delay_s"] <= 2.0
    assert report["mountd_kill"]["read_errors"] == 0 and report["mountd_kill"]["reads"] > 0
    one, two, without_redis = report["chroma_load"]
    assert (one["hosts"], two["hosts"], without_redis["redis"]) == (1, 2, False)
    assert two["chroma_requests"] <= one["chroma_requests"] * 1.25, "the second host read Chroma again"
    assert without_redis["chroma_requests"] > 1.5 * two["chroma_requests"]
