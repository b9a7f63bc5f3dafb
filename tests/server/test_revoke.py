"""`chromafs revoke` (issue 48, item 2), with real processes: two mount servers sharing one Redis,
sessions of alice and bob on each, a shell inside one of alice's. After `chromafs revoke --subject
alice --redis-url R`, every session of alice stops reading within 1.5 s on both servers, the shell
included (by the path of an expiry: the bind detached, the kernel told to forget); a new session
of alice is refused with a line that says so; bob reads on. Without Redis, the mount server keeps
the revocation itself, and a restarted server still has it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra import BIN, SAMPLE_SITE, MountServer, RedisServer, mounted, try_mount, wait_until

PAGE = "guides/deployment.mdx"
WITHIN_S = 1.5


def chromafs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "chromafs"), *args], capture_output=True, text=True, timeout=60)


def open_session(
    server: MountServer, chroma: Path, secret_file: Path, mountpoint: Path, token: Path, *more: str
) -> subprocess.CompletedProcess[str]:
    mountpoint.mkdir(exist_ok=True)
    args = ["--site", "acme", "--chroma-path", str(chroma), "--mountd", str(server.socket), "--refresh-interval", "0"]
    return try_mount(mountpoint, *args, "--token-file", str(token), "--jwt-secret-file", str(secret_file), *more)


def reads(mountpoint: Path) -> bool:
    """Whether the session at `mountpoint` serves the page's bytes."""
    try:
        return (mountpoint / PAGE).read_bytes() == (SAMPLE_SITE / PAGE).read_bytes()
    except OSError:
        return False


def shell_inside(directory: Path) -> subprocess.Popen[str]:
    """A shell whose working directory is `directory`, which has listed it and read a page (the
    kernel caches them); on a line on its stdin it runs `ls .` and prints its status."""
    script = 'cd "$1" && ls . >/dev/null && cat deployment.mdx >/dev/null && echo ready && read go && '
    script += 'ls . >/dev/null 2>/tmp/.chromafs-revoke-ls-$$; echo "ls=$?"; cat /tmp/.chromafs-revoke-ls-$$; '
    script += "rm -f /tmp/.chromafs-revoke-ls-$$"
    shell = subprocess.Popen(
        ["bash", "-c", script, "shell", str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout is not None
    ready = shell.stdout.readline()
    assert ready.strip() == "ready", (ready, shell.stderr.read() if shell.stderr else "")
    return shell


@pytest.mark.expect_log(r"WARNING .*session on .* revoked")
def test_revoking_a_subject_in_redis_ends_its_sessions_on_every_server_and_refuses_new_ones(
    redis_server: RedisServer,  # first: stopped after the servers that read it
    start_mount_server: Callable[..., MountServer],
    sample_chroma: Callable[[str], Path],
    secret_file: Path,
    token_file: Callable[..., Path],
    tmp_path: Path,
) -> None:
    chroma = sample_chroma("public")
    folders = [tmp_path / "host-a", tmp_path / "host-b"]  # a socket and a class root each
    for folder in folders:
        folder.mkdir()
    servers = [start_mount_server(folder=folder) for folder in folders]
    issued = int(time.time()) - 5
    alice = token_file(["billing"], sub="alice", iat=issued, jti="alice-1")
    bob = token_file(["billing"], sub="bob", iat=issued, jti="bob-1")
    redis = ("--redis-url", redis_server.url)
    sessions: dict[tuple[str, int], Path] = {}
    for index, server in enumerate(servers):
        for name, token in (("alice", alice), ("bob", bob)):
            mountpoint = tmp_path / f"{name}-{index}"
            done = open_session(server, chroma, secret_file, mountpoint, token, *redis)
            assert done.returncode == 0, done.stderr
            assert reads(mountpoint)
            sessions[name, index] = mountpoint
    shell = shell_inside(sessions["alice", 0] / "guides")
    try:
        revoked = chromafs("revoke", "--subject", "alice", "--site", "acme", *redis)
        revoked_at = time.monotonic()
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked the tokens of subject 'alice' on site 'acme'" in revoked.stdout
        for index in range(len(servers)):
            mountpoint = sessions["alice", index]
            wait_until(lambda m=mountpoint: not reads(m), WITHIN_S - (time.monotonic() - revoked_at),  # type: ignore[misc]
                       f"alice's session on server {index} stopped reading", interval_s=0.02)  # fmt: skip
        assert time.monotonic() - revoked_at <= WITHIN_S
        out, err = shell.communicate("go\n", timeout=30)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait(10)
    status, *said = out.splitlines()
    assert status != "ls=0" and "Permission denied" in "".join(said), (out, err)  # refused, not an empty listing
    for index in range(len(servers)):
        assert reads(sessions["bob", index]), f"bob's session on server {index} reads on"
        wait_until(lambda m=sessions["alice", index]: not m.is_mount(), 5, "alice's bind detached")  # type: ignore[misc]
    for index, server in enumerate(servers):
        again = open_session(server, chroma, secret_file, tmp_path / f"alice-again-{index}", alice, *redis)
        assert again.returncode != 0
        assert "this token was revoked (subject 'alice'" in again.stderr, again.stderr
        assert not (tmp_path / f"alice-again-{index}").is_mount()
    key = "chromafs:{acme}:revoked:sub:alice"  # docs/DEPLOYMENT.md's layout, kept --for (a day)
    assert 86400 - 120 < int(redis_server.cli("ttl", key)) <= 86400
    shorter = chromafs("revoke", "--subject", "alice", "--site", "acme", "--for", "60", *redis)
    assert shorter.returncode == 0, shorter.stderr
    assert int(redis_server.cli("ttl", key)) > 86400 - 120  # a later revocation never shortens one
    # a token the provider issues after the revocation opens a session (the subject was not banned for good)
    fresh = token_file(["billing"], sub="alice", iat=int(time.time()) + 1)
    time.sleep(max(0.0, int(time.time()) + 1.05 - time.time()))
    done = open_session(servers[1], chroma, secret_file, tmp_path / "alice-fresh", fresh, *redis)
    assert done.returncode == 0, done.stderr
    assert reads(tmp_path / "alice-fresh")


@pytest.mark.expect_log(r"WARNING .*session on .* revoked", r"WARNING .*revoked the tokens of")
def test_revoking_a_token_without_redis_is_kept_by_the_mount_server_across_a_restart(
    start_mount_server: Callable[..., MountServer],
    sample_chroma: Callable[[str], Path],
    secret_file: Path,
    token_file: Callable[..., Path],
    tmp_path: Path,
) -> None:
    chroma = sample_chroma("public")
    server = start_mount_server()
    leaked = token_file(["billing"], sub="carol", jti="leaked-1")
    other = token_file(["billing"], sub="carol", jti="other-2")
    for name, token in (("leaked", leaked), ("other", other)):
        done = open_session(server, chroma, secret_file, tmp_path / name, token)
        assert done.returncode == 0, done.stderr
    revoked = chromafs("revoke", "--jti", "leaked-1", "--site", "acme", "--mountd", str(server.socket), "--for", "600")
    revoked_at = time.monotonic()
    assert revoked.returncode == 0, revoked.stderr
    assert "1 sessions ended" in revoked.stdout, revoked.stdout
    wait_until(lambda: not reads(tmp_path / "leaked"), WITHIN_S, "the leaked token's session stopped reading")
    assert time.monotonic() - revoked_at <= WITHIN_S
    assert reads(tmp_path / "other")  # the subject's other token reads on
    server.stop()
    server.start()
    again = open_session(server, chroma, secret_file, tmp_path / "again", leaked)
    assert again.returncode != 0 and "this token was revoked (token id 'leaked-1'" in again.stderr, again.stderr
    assert reads(tmp_path / "other")
    search = ["search", "deployment", "--site", "acme", "--chroma-path", str(chroma), "--mountd", str(server.socket)]
    searched = chromafs(*search, "--token-file", str(leaked), "--jwt-secret-file", str(secret_file))
    assert searched.returncode == 2 and "this token was revoked (token id 'leaked-1'" in searched.stderr, searched
    refused = chromafs("revoke", "--jti", "x", "--site", "acme", "--mountd", str(tmp_path / "nothing.sock"))
    assert refused.returncode == 2 and "cannot reach chromafs-mountd" in refused.stderr, refused.stderr


@pytest.mark.expect_log(r"WARNING .*the token was revoked \(subject 'dave'\)")
def test_a_standalone_mount_with_redis_ends_when_its_token_is_revoked(
    redis_server: RedisServer, sample_chroma: Callable[[str], Path], secret_file: Path, token_file: Callable[..., Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    token = token_file(["billing"], sub="dave")
    args = ["--site", "acme", "--chroma-path", str(sample_chroma("public")), "--no-mountd"]
    args += ["--redis-url", redis_server.url, "--token-file", str(token), "--jwt-secret-file", str(secret_file)]
    with mounted(tmp_path / "docs", *args) as mountpoint:
        assert reads(mountpoint)
        shell = shell_inside(mountpoint / "guides")
        try:
            revoked = chromafs("revoke", "--subject", "dave", "--site", "acme", "--redis-url", redis_server.url)
            revoked_at = time.monotonic()
            assert revoked.returncode == 0, revoked.stderr
            wait_until(lambda: not reads(mountpoint), WITHIN_S, "the mount stopped reading", interval_s=0.02)
            assert time.monotonic() - revoked_at <= WITHIN_S
            out, err = shell.communicate("go\n", timeout=30)
        finally:
            if shell.poll() is None:
                shell.kill()
                shell.wait(10)
        assert out.splitlines()[0] != "ls=0", (out, err)  # refused (EACCES), or unmounted under it (ENOTCONN)
        wait_until(lambda: not mountpoint.is_mount(), 10, "the revoked mount unmounted")
    again = try_mount(tmp_path / "docs", *args)
    assert again.returncode != 0 and "this token was revoked (subject 'dave'" in again.stderr, again.stderr
