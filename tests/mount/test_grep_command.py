"""`chromafs grep`: the reference design's two-stage grep, as a command. Same
answers as real `grep -rn` on a mount of the same token, never a hidden page."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import BIN, SAMPLE_SITE, Backend, expected_visible, mounted, reader_args

PATTERNS = [
    ["refresh token"],
    ["-i", "OAUTH"],
    ["-F", "groups: [admin"],
    ["^## [A-Z]"],
    ["billing|invoice"],
    ["-F", "a.b*c"],
    ["-i", "-F", "Acme"],
]


def _grep_cli(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(BIN / "chromafs"), "grep", *args], capture_output=True, timeout=120)


@pytest.mark.parametrize("groups", [None, ["billing"]])
def test_same_lines_as_grep_on_the_mount(
    groups: list[str] | None,
    sample_backend: Callable[..., Backend],
    token_file: Callable[..., Path],
    secret_file: Path,
    mnt: Path,
) -> None:
    site = sample_backend().args
    token = [] if groups is None else reader_args(token_file(groups), secret_file)
    hidden = expected_visible(SAMPLE_SITE, "public", {"admin", "billing"}) - expected_visible(
        SAMPLE_SITE, "public", None if groups is None else set(groups)
    )
    with mounted(mnt, *site, *token):
        for pattern in PATTERNS:
            flags = [p for p in pattern if p.startswith("-")]
            text = pattern[-1]
            real = subprocess.run(
                ["grep", "-rn", "-I", *flags, "-E" if "-F" not in flags else "-F", text, "."],
                cwd=mnt,
                capture_output=True,
                timeout=120,
            )
            ours = _grep_cli([*flags, text, "--prefix", ".", *site, *token])
            assert ours.returncode == real.returncode, (pattern, ours.stderr)
            assert sorted(ours.stdout.splitlines()) == sorted(real.stdout.splitlines()), pattern
            for rel in hidden:
                assert rel.encode() not in ours.stdout
        scoped = _grep_cli(["refresh", "auth", *site, *token])
        assert scoped.returncode == 0 and all(line.startswith(b"auth/") for line in scoped.stdout.splitlines())


def test_hidden_path_is_like_a_missing_one(sample_backend: Callable[..., Backend]) -> None:
    site = sample_backend().args
    hidden = _grep_cli(["billing", "internal/billing.mdx", *site])
    missing = _grep_cli(["billing", "internal/no-such.mdx", *site])
    assert hidden.returncode == missing.returncode == 2
    assert hidden.stdout == missing.stdout == b""
    assert hidden.stderr.replace(b"billing.mdx", b"X") == missing.stderr.replace(b"no-such.mdx", b"X")
