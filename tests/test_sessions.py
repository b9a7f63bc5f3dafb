"""Sessions end when their token does: a per-session daemon unmounts itself at the token's `exp`."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from helpers import is_mounted, mounted
from infra import BIN

EXPIRY_BOUND_S = 5.0


def statuses() -> list[dict]:
    out = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_a_session_mount_ends_when_its_token_expires(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, mnt: Path
) -> None:
    expires_at = int(time.time()) + 6
    token = ["--token-file", str(token_file(["billing"], exp=expires_at)), "--jwt-secret-file", str(secret_file)]
    with mounted(mnt, "--site", "acme", "--chroma-path", str(sample_chroma("public")), *token):
        assert (mnt / "quickstart.mdx").read_bytes()
        mine = next(s for s in statuses() if s["mountpoint"] == str(mnt))
        assert mine["expires_at"] == expires_at and "user=tester" in mine["reader"]
        while time.time() < expires_at - 0.5:
            assert is_mounted(mnt)  # serving until the token expires
            time.sleep(0.25)
        while is_mounted(mnt):
            assert time.time() < expires_at + EXPIRY_BOUND_S, "still mounted 5 s after the token expired"
            time.sleep(0.1)
    assert "the token expired" in (mnt.parent / "mnt.log").read_text()
