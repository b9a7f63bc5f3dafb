"""chromafs-mountd: a resident mount server that forks ready mounts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chromafs_fuse.cli.mount_request import encode_request, quick_options, request_mount, request_options
from infra import (
    BIN,
    SAMPLE_SITE,
    Backend,
    MountServer,
    RedisServer,
    copy_subset,
    expected_visible,
    in_child_as,
    ingest,
    is_mounted,
    reader_args,
    run,
    running_mount_server,
    try_mount,
    unmount,
    wait_gone,
)


@pytest.fixture
def mountd(start_mount_server: Callable[..., MountServer]) -> Iterator[Path]:
    server = start_mount_server(isolated=True)  # a daemon per mount (shared mounts: test_sessions)
    yield server.socket
    server.stop()
    assert not server.socket.exists()


def test_mount_through_the_server(
    mountd: Path,
    sample_backend: Callable[..., Backend],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    backend = sample_backend().args
    mounts = [tmp_path / "anon", tmp_path / "billing"]
    for m in mounts:
        m.mkdir()
    try:
        assert try_mount(mounts[0], *backend, "--mountd", str(mountd)).returncode == 0
        billing = try_mount(
            mounts[1], *backend, "--mountd", str(mountd), *reader_args(token_file(["billing"]), secret_file)
        )
        assert billing.returncode == 0, billing.stderr
        for m, groups in zip(mounts, (None, {"billing"}), strict=True):
            copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"exp-{m.name}")
            diff = run(["diff", "-r", str(copy), str(m)])
            assert diff.returncode == 0, diff.stdout
        bad = try_mount(tmp_path / "anon", *backend, "--mountd", str(mountd))
        assert bad.returncode == 1 and "already mounted" in bad.stderr
        (tmp_path / "bad").mkdir()
        expired = try_mount(
            tmp_path / "bad",
            *backend,
            "--mountd",
            str(mountd),
            *reader_args(token_file(["admin"], exp=int(time.time()) - 10), secret_file),
        )
        assert expired.returncode == 1
        assert expired.stderr.strip() == "chromafs-mount: token has expired: ask for a new one"
        assert not is_mounted(tmp_path / "bad")
    finally:
        for m in mounts:
            unmount(m)


def test_mounts_outlive_the_server(mountd: Path, sample_backend: Callable[..., Backend], mnt: Path) -> None:
    assert try_mount(mnt, *sample_backend().args, "--mountd", str(mountd)).returncode == 0
    try:
        # the server is stopped by the fixture after this test; here, kill -TERM it early
        pids = subprocess.run(["pgrep", "-f", f"chromafs-mountd --socket {mountd}"], capture_output=True, text=True)
        for pid in pids.stdout.split():
            os.kill(int(pid), signal.SIGTERM)
        assert all(wait_gone(int(pid)) for pid in pids.stdout.split()), "the server outlived its SIGTERM"
        assert (mnt / "auth" / "oauth.mdx").read_bytes() == (SAMPLE_SITE / "auth" / "oauth.mdx").read_bytes()
    finally:
        unmount(mnt)


def test_unreachable_server_fails_with_one_line(tmp_path: Path, mnt: Path) -> None:
    proc = try_mount(mnt, "--site", "acme", "--chroma-path", str(tmp_path), "--mountd", str(tmp_path / "nope.sock"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "chromafs-mountd" in proc.stderr


def test_server_hands_over_the_tree_from_redis_and_sees_a_reingest(
    mountd: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(SAMPLE_SITE, site)
    backend = Backend("acme", tmp_path / "chroma", redis_url=redis_server.url).args
    ingest(site, *backend, "--quiet")
    args = [*backend, "--mountd", str(mountd)]
    for round_number in range(2):
        mnt = tmp_path / f"mnt{round_number}"
        mnt.mkdir()
        log = tmp_path / f"mnt{round_number}.log"
        try:
            proc = try_mount(mnt, *args, "--log-file", str(log))
            assert proc.returncode == 0, proc.stderr
            assert "loaded from Redis" in log.read_text()  # the isolated daemon's own load
            assert (mnt / "quickstart.mdx").read_bytes() == (site / "quickstart.mdx").read_bytes()
        finally:
            unmount(mnt)
        (site / "quickstart.mdx").write_text("# Changed by a re-ingest\n")
        ingest(site, *backend, "--quiet")


def test_each_mount_from_a_shared_table_is_scoped_to_its_own_reader(
    mountd: Path, redis_server: RedisServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """Two readers with the same groups, each an isolated daemon forked by the server: each serves
    (and reports) its own reader, from its own token, and sees exactly that reader's pages."""
    backend = Backend("acme", tmp_path / "chroma", redis_url=redis_server.url).args
    ingest(SAMPLE_SITE, *backend, "--quiet")
    args = [*backend, "--mountd", str(mountd)]
    auth = ["--jwt-secret-file", str(secret_file)]
    readers = {"alice": tmp_path / "alice", "bob": tmp_path / "bob"}
    try:
        for subject, mnt in readers.items():
            mnt.mkdir()
            log = tmp_path / f"{subject}.log"
            token = token_file(["billing"], sub=subject)
            proc = try_mount(mnt, *args, *auth, "--token-file", str(token), "--log-file", str(log))
            assert proc.returncode == 0, proc.stderr
            assert "loaded from Redis" in log.read_text()
        status = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
        reader_of = {s["mountpoint"]: s.get("reader") for s in json.loads(status.stdout)}
        expected = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", {"billing"}), tmp_path / "exp")
        for subject, mnt in readers.items():
            assert reader_of[str(mnt)] == f"user={subject} groups=billing"
            assert run(["diff", "-r", str(expected), str(mnt)]).returncode == 0
    finally:
        for mnt in readers.values():
            unmount(mnt)


def test_readers_of_different_groups_through_the_server_never_share_a_table(
    mountd: Path, redis_server: RedisServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """Anonymous, billing and admin readers mounted through one server with Redis, in an order that
    would hand a later reader an earlier reader's pruned table if the key left out the groups."""
    backend = Backend("acme", tmp_path / "chroma", redis_url=redis_server.url).args
    ingest(SAMPLE_SITE, *backend, "--quiet")
    args = [*backend, "--mountd", str(mountd)]
    auth = ["--jwt-secret-file", str(secret_file)]
    readers: dict[str, tuple[list[str], set[str] | None]] = {
        "billing": (["--token-file", str(token_file(["billing"]))], {"billing"}),
        "admin": (["--token-file", str(token_file(["admin"]))], {"admin"}),
        "anonymous": ([], None),
        "billing2": (["--token-file", str(token_file(["billing"], sub="other"))], {"billing"}),
    }
    try:
        for name, (token_args, groups) in readers.items():
            mnt = tmp_path / name
            mnt.mkdir()
            proc = try_mount(mnt, *args, *(auth if token_args else []), *token_args)
            assert proc.returncode == 0, proc.stderr
            expected = copy_subset(
                SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"expected-{name}"
            )
            assert run(["diff", "-r", str(expected), str(mnt)]).returncode == 0, name
    finally:
        for name in readers:
            unmount(tmp_path / name)


NOBODY = 65534


def request_line(argv: list[str]) -> bytes:
    """The line chromafs-mount sends for `argv` (anonymous)."""
    parsed = quick_options(argv)
    assert parsed is not None
    given, mountpoint = parsed
    return encode_request(mountpoint, request_options(given, {}), None)


def request_as(uid: int, socket_path: Path, argv: list[str], gid: int | None = None) -> tuple[int, str]:
    """chromafs-mount's own request for `argv`, sent to the server from a child running as `uid`
    and group `gid` (`uid` when None; no supplementary groups): its exit status and what it
    printed. The child reaches the socket through its folder as its working directory, so only
    that folder needs to be open to others."""

    def job() -> tuple[int, bytes]:
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            code = request_mount(socket_path.name, request_line(argv), argv[0], 30)
        return code, printed.getvalue().encode()

    code, printed = in_child_as(uid, uid if gid is None else gid, socket_path.parent, job)
    return code, printed.decode()


@pytest.mark.expect_log(r"WARNING chromafs.mountd: refused a mount request from uid")
def test_a_mount_request_from_another_user_is_refused(sample_backend: Callable[..., Backend], tmp_path: Path) -> None:
    """Only root or the server's own user may ask chromafs-mountd for a mount. Its socket is
    root's alone (0600); opened to everyone here, so that the server's own check of the peer's
    uid is what a request from nobody meets: refused with the server's answer, nothing mounted.
    The same request from root is served."""
    folder, mnt = tmp_path / "server", tmp_path / "mnt"
    folder.mkdir()
    mnt.mkdir()
    argv = [str(mnt), *sample_backend().args]
    with running_mount_server(folder, tmp_path) as server:
        assert server.socket.stat().st_mode & 0o777 == 0o600
        folder.chmod(0o711)
        server.socket.chmod(0o666)
        code, printed = request_as(NOBODY, server.socket, argv)
        assert (code, printed) == (1, "chromafs-mount: permission denied: only root or the server's user may mount\n")
        assert not is_mounted(mnt), "a mount made for uid 65534"
        assert f"refused a mount request from uid {NOBODY}" in server.log.read_text()
        served = try_mount(mnt, *argv[1:], "--mountd", str(server.socket))
        assert served.returncode == 0, served.stderr
        assert (mnt / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()


def exchange_as(uid: int, socket_path: Path, lines: list[bytes]) -> list[bytes]:
    """From a child running as `uid`: connect, and for each line send it and read one answer
    line (b"" once the server has closed the connection); the answers."""

    def job() -> tuple[int, bytes]:
        answers: list[str] = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(socket_path.name)
            replies = conn.makefile("rb")
            for line in lines:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.sendall(line)
                try:
                    answers.append(replies.readline().decode())
                except ConnectionResetError:
                    answers.append("")
        return 0, json.dumps(answers).encode()

    code, out = in_child_as(uid, uid, socket_path.parent, job)
    assert code == 0, out.decode()
    return [a.encode() for a in json.loads(out)]


@pytest.mark.expect_log(r"WARNING chromafs.mountd: refused a mount request from uid")
def test_a_refused_peer_gets_no_second_request_on_its_connection(
    sample_backend: Callable[..., Backend], tmp_path: Path
) -> None:
    """After the refusal, the connection is closed: a second request on it is never read, so it
    is never served without the check."""
    folder, mnt = tmp_path / "server", tmp_path / "mnt"
    folder.mkdir()
    mnt.mkdir()
    request = request_line([str(mnt), *sample_backend().args])
    with running_mount_server(folder, tmp_path) as server:
        folder.chmod(0o711)
        server.socket.chmod(0o666)  # the server's own uid check is what the requests meet
        first, second = exchange_as(NOBODY, server.socket, [request, request])
        assert b"permission denied" in first, first
        assert second == b"", second
        assert not is_mounted(mnt), "a second request on a refused connection was served"


@pytest.mark.expect_log(r"WARNING chromafs.mountd: refused a mount request from uid")
def test_the_server_checks_the_callers_uid_not_its_gid(sample_backend: Callable[..., Backend], tmp_path: Path) -> None:
    """The peer's credentials are (pid, uid, gid): a caller of uid 65534 in group 0 (root's) is
    refused as any other user, with nothing mounted; root in group 65534 is served."""
    folder, refused, served = tmp_path / "server", tmp_path / "refused", tmp_path / "served"
    for path in (folder, refused, served):
        path.mkdir()
    backend = sample_backend().args
    with running_mount_server(folder, tmp_path) as server:
        folder.chmod(0o711)
        server.socket.chmod(0o666)  # the server's own uid check is what the request meets
        code, printed = request_as(NOBODY, server.socket, [str(refused), *backend], gid=0)
        assert (code, printed) == (1, "chromafs-mount: permission denied: only root or the server's user may mount\n")
        assert not is_mounted(refused), "a mount made for uid 65534 (read as uid 0, its gid)"
        assert f"refused a mount request from uid {NOBODY}" in server.log.read_text()
        code, printed = request_as(0, server.socket, [str(served), *backend], gid=NOBODY)
        assert (code, printed) == (0, ""), "root in group 65534 was refused"
        assert (served / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
        assert "refused a mount request from uid 0" not in server.log.read_text()


@pytest.mark.parametrize("variable", ["CHROMAFS_TOKEN", "CHROMAFS_TOKEN_FILE"])
def test_a_request_without_a_token_never_reads_as_the_server(
    variable: str,
    sample_backend: Callable[..., Backend],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """The server's environment is not the caller's: a request that carries no token is read as
    an anonymous reader, even by a server that runs with an admin's token in its environment (the
    client reads the caller's CHROMAFS_TOKEN itself and sends it)."""
    folder, mnt = tmp_path / "server", tmp_path / "mnt"
    folder.mkdir()
    mnt.mkdir()
    admin = token_file(["admin", "billing"])
    server = MountServer(folder, isolated=True)
    server.extra_env = {variable: str(admin) if variable.endswith("_FILE") else admin.read_text()}
    with server:
        try:
            key = ["--jwt-secret-file", str(secret_file)]  # a key, as a deployment passes: a token would verify
            done = try_mount(mnt, *sample_backend().args, "--mountd", str(server.socket), *key)
            assert done.returncode == 0, done.stderr
            copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", None), tmp_path / "expected")
            diff = run(["diff", "-r", str(copy), str(mnt)])
            assert diff.returncode == 0, f"not the anonymous reader's pages: {diff.stdout[:1000]}"
        finally:
            unmount(mnt)


HOST_SERVER_SCRIPT = r"""
set -u
mount -t tmpfs -o mode=0755 chromafs-test /run/chromafs  # this namespace's own /run/chromafs
"$BIN/chromafs-mountd" --log-file "$WORK/mountd.log" --serving-processes 1 &
server=$!
for _ in $(seq 100); do [ -S /run/chromafs/mountd.sock ] && break; sleep 0.1; done
finish() {
    umount "$WORK/session" 2>/dev/null
    fusermount3 -u "$WORK/alone" 2>/dev/null
    kill "$server"; wait "$server"
    pkill -f "chromafs-serving /run/chromafs/classes"
    for _ in $(seq 100); do pgrep -f "chromafs-serving /run/chromafs/classes" >/dev/null || break; sleep 0.1; done
    umount -l /run/chromafs/classes/serving 2>/dev/null
    umount -l /run/chromafs
}
trap finish EXIT
"$BIN/chromafs-mount" "$WORK/session" --site acme --chroma-path "$CHROMA" || exit 1
grep -c "session on $WORK/session" "$WORK/mountd.log"
cmp "$WORK/session/quickstart.mdx" "$SITE/quickstart.mdx" && echo same-bytes
"$BIN/chromafs-mount" "$WORK/alone" --site acme --chroma-path "$CHROMA" --no-mountd || exit 1
grep -c "session on $WORK/alone" "$WORK/mountd.log"
cmp "$WORK/alone/quickstart.mdx" "$SITE/quickstart.mdx" && echo alone-same-bytes
"""


def test_chromafs_mount_uses_the_hosts_mount_server_by_default(
    sample_chroma: Callable[[str], Path], tmp_path: Path
) -> None:
    """On a host whose mount server listens on its default socket, a plain `chromafs-mount` is a
    session of it (as `docker` uses its daemon's socket); `--no-mountd` mounts alone. Run in a
    mount namespace of its own with its own /run/chromafs: a server the host runs is not touched."""
    for name in ("session", "alone"):
        (tmp_path / name).mkdir()
    Path("/run/chromafs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "BIN": str(BIN), "WORK": str(tmp_path), "CHROMA": str(sample_chroma("public"))}
    env["SITE"] = str(SAMPLE_SITE)
    env.pop("CHROMAFS_MOUNTD_SOCKET", None)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", HOST_SERVER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.stdout.split() == ["1", "same-bytes", "0", "alone-same-bytes"], done.stdout + done.stderr
