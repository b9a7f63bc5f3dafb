"""A session of the mount server is as strict as a mount of its own (issue 45), checked from the
attacker's side with real processes: another local user is refused unless the session asked
`-o allow_other`; once a token expires, a process whose working directory is inside the session,
and a bind copy of it in another mount namespace (as a container runtime makes one), are refused
every path, with the kernel's caches warm."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_sessions import OpenSession, Sessions, classes

from infra import REPO, SAMPLE_SITE, MountServer, hold_for, mounts_under, unmount, wait_until

INSIDE = REPO / "scripts" / "harness" / "inside.py"
pytestmark = pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")


@pytest.fixture
def shared_server(start_mount_server: Callable[..., MountServer]) -> MountServer:
    return start_mount_server(class_idle_s=1.0)


@pytest.fixture
def open_session(shared_server: MountServer, sample_chroma: Callable[[str], Path], secret_file: Path) -> OpenSession:
    return Sessions(shared_server, sample_chroma("public"), secret_file).open


@pytest.fixture
def world_reachable() -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="chromafs-strict-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for path in mounts_under(base):  # its sessions: outside tmp_path, so not the server fixture's
            unmount(path)
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_another_user_is_refused_a_session_unless_it_asked_allow_other(
    shared_server: MountServer, open_session: OpenSession, world_reachable: Path
) -> None:
    private, shared = world_reachable / "private", world_reachable / "shared"
    for mountpoint in (private, shared):
        mountpoint.mkdir()
        mountpoint.chmod(0o755)
    open_session(private)
    open_session(shared, None, "-o", "allow_other")
    assert len(classes(shared_server)) == 1  # who else may read is the session's, not its class's
    page = "auth/oauth.mdx"
    for command in (["cat", str(private / page)], ["ls", str(private)], ["stat", str(private / "auth")]):
        refused = as_nobody(*command)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (command, refused)
    assert (private / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()  # its owner reads it
    allowed = as_nobody("cat", str(shared / page))
    assert allowed.returncode == 0 and allowed.stdout.encode() == (SAMPLE_SITE / page).read_bytes(), allowed
    hidden = as_nobody("stat", str(shared / "internal" / "billing.mdx"))
    assert hidden.returncode != 0 and "No such file or directory" in hidden.stderr


def probe(directory: Path, at: float, namespace: bool) -> subprocess.Popen[str]:
    """A process inside `directory` (in a mount namespace of its own holding a private copy of
    the host's mounts, as a container's, when `namespace`), which tries a shell's four things at `at`."""
    command = [sys.executable, str(INSIDE), str(directory), "--read", "deployment.mdx"]
    command += ["--unread", "migration.mdx", "--subdir", "advanced", "--at", str(at)]
    if namespace:
        command = ["unshare", "--mount", "--propagation", "private", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready = process.stdout.readline()
    assert ready.strip() == "ready", (ready, process.stderr.read() if process.poll() is not None else "")
    return process


def outcome(process: subprocess.Popen[str]) -> dict[str, int]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out)


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_expiry_refuses_a_process_inside_and_a_bind_copy_with_warm_caches(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    expires_at = int(time.time()) + 8
    session, other = tmp_path / "session", tmp_path / "other"
    open_session(session, token_file(["billing"], exp=expires_at))
    open_session(other, token_file(["billing"]))  # the same class, no expiry soon
    inside = session / "guides"
    before = [probe(inside, expires_at - 2.5, namespace) for namespace in (False, True)]
    after = [probe(inside, expires_at + 1.5, namespace) for namespace in (False, True)]
    for process in before:  # the same checks work while the session lives: they can fail
        assert outcome(process) == {"ls": 0, "cat_read": 0, "cat_unread": 0, "cd": 0}
    refused = {"ls": errno.EACCES, "cat_read": errno.EACCES, "cat_unread": errno.EACCES, "cd": errno.EACCES}
    for process, where in zip(after, ("working directory inside", "bind copy in another namespace"), strict=True):
        assert outcome(process) == refused, where
    wait_until(lambda: not session.is_mount(), 5, "the expired session's bind detached")
    page = other / "guides" / "deployment.mdx"  # the class's other session reads on
    assert page.read_bytes() == (SAMPLE_SITE / "guides" / "deployment.mdx").read_bytes()
    hold_for(0.1, "nothing else to wait for")
