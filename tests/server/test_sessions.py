"""Sessions: binds of a serving mount per reader class (chromafs-mountd as root), or a daemon of
their own; either way a session ends when its token expires, and only that session."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from chromafs_fuse.serving.server.state_journal import StateJournal
from chromafs_fuse.serving.status import runtime_dir
from infra import (
    BIN,
    SAMPLE_SITE,
    Backend,
    MountServer,
    copy_subset,
    expected_visible,
    free_port,
    fresh_status,
    hold_for,
    is_mounted,
    mounted,
    mounts_under,
    reader_args,
    run,
    running_shared_server,
    try_mount,
    unmount,
    wait_until,
)

EXPIRY_BOUND_S = 5.0


def statuses() -> list[dict]:
    out = subprocess.run([str(BIN / "chromafs"), "status", "--json"], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def wait_unmounted(mountpoints: list[Path], by: float, what: str, interval_s: float = 0.1) -> None:
    """Until none of `mountpoints` is mounted any more, at the latest at the time `by` (time.time())."""
    wait_until(lambda: not any(is_mounted(m) for m in mountpoints), by - time.time(), what, interval_s)


@pytest.mark.expect_log(r"WARNING chromafs.mount: the token expired")
def test_a_session_mount_ends_when_its_token_expires(
    sample_backend: Callable[..., Backend], token_file: Callable[..., Path], secret_file: Path, mnt: Path
) -> None:
    backend = sample_backend()  # ingested first: the token's 6 s are the mount's, not the ingest's
    expires_at = int(time.time()) + 6
    token = reader_args(token_file(["billing"], exp=expires_at), secret_file)
    with mounted(mnt, *backend.args, *token):
        assert (mnt / "quickstart.mdx").read_bytes()
        mine = next(s for s in statuses() if s["mountpoint"] == str(mnt))
        assert mine["expires_at"] == expires_at and "user=tester" in mine["reader"]
        while time.time() < expires_at - 0.5:
            assert is_mounted(mnt)  # serving until the token expires
            hold_for(0.25, "the pace of the checks until the expiry")
        wait_unmounted([mnt], expires_at + EXPIRY_BOUND_S, "the mount ended within 5 s of its token's expiry")
    assert "the token expired" in (mnt.parent / "mnt.log").read_text()


# -- sessions of shared class mounts (chromafs-mountd as root) -------------------------------


@dataclass(frozen=True)
class Sessions:
    """Opens sessions of `server` on the site in `chroma`, each an anonymous reader's or a token's."""

    server: MountServer
    chroma: Path
    secret_file: Path

    def open(self, mountpoint: Path, token: Path | None = None, *more: str) -> None:
        """A session on `mountpoint` (made if missing) for `token` (None: anonymous); `more` flags last."""
        mountpoint.mkdir(exist_ok=True)
        args = [*Backend("acme", self.chroma).args, "--mountd", str(self.server.socket), "--refresh-interval", "0"]
        done = try_mount(mountpoint, *args, *reader_args(token, self.secret_file), *more)
        assert done.returncode == 0, done.stderr


OpenSession = Callable[..., None]


def mount_options(mountpoint: Path) -> set[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mountpoint):
            return set(fields[5].split(","))
    raise AssertionError(f"{mountpoint} is not mounted")


def class_mounts(server: MountServer) -> list[Path]:
    """The serving processes' mounts in the class root."""
    return mounts_under(server.class_root)


def classes(server: MountServer) -> dict[str, str]:
    """Class key -> its view's path, as the server's state has them."""
    return {
        key: mount.path for key, mount in StateJournal(str(server.class_root / "state.json")).load().classes.items()
    }


@pytest.fixture
def shared_server(start_mount_server: Callable[..., MountServer]) -> MountServer:
    return start_mount_server(class_idle_s=1.0)


@pytest.fixture
def open_session(shared_server: MountServer, sample_chroma: Callable[[str], Path], secret_file: Path) -> OpenSession:
    """Opens a session of `shared_server` on the sample site: open_session(mountpoint, token=None, *more)."""
    return Sessions(shared_server, sample_chroma("public"), secret_file).open


def test_sessions_of_one_reader_class_share_a_mount_and_see_exactly_their_pages(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    readers: dict[str, tuple[Path | None, set[str] | None]] = {
        "anon-1": (None, None),
        "anon-2": (None, None),
        "billing-1": (token_file(["billing"]), {"billing"}),
        "billing-2": (token_file(["billing"], sub="someone-else"), {"billing"}),
        "admin": (token_file(["admin", "billing"]), {"admin", "billing"}),
    }
    for name, (token, _) in readers.items():
        open_session(tmp_path / name, token)
    assert len(classes(shared_server)) == 3  # anonymous, billing, admin+billing
    for name, (_, groups) in readers.items():
        copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"exp-{name}")
        diff = run(["diff", "-r", str(copy), str(tmp_path / name)])
        assert diff.returncode == 0, f"{name}: {diff.stdout[:1000]}"
    # each session's directories are its own; a page is one inode in every session that shows it
    roots = {os.stat(tmp_path / name).st_ino for name in readers}
    assert len(roots) == len(readers)
    pages = {os.stat(tmp_path / name / "quickstart.mdx").st_ino for name in readers}
    assert len(pages) == 1
    assert {"ro", "nosuid", "nodev"} <= mount_options(tmp_path / "billing-2")
    with pytest.raises(OSError) as info:
        (tmp_path / "anon-1" / "new.md").write_text("x")
    assert info.value.errno == errno.EROFS
    ours = [s for s in statuses() if "session" in s and Path(s["mountpoint"]).parent == tmp_path]
    sessions = {Path(s["mountpoint"]).name: s for s in ours}  # (not another server's on this machine)
    assert set(sessions) == set(readers)
    assert sessions["billing-2"]["session"]["subject"] == "someone-else"
    assert sessions["billing-1"]["session"]["class"] == sessions["billing-2"]["session"]["class"]
    assert sessions["anon-1"]["expires_at"] is None and sessions["admin"]["expires_at"] > time.time()


def walked_files(root: Path) -> set[str]:
    """Every file under `root` (relative), as os.walk finds them."""
    return {os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root) for name in names}


@pytest.mark.parametrize("mode", ["default", "shared"])
def test_readers_of_other_groups_each_see_only_their_own_pages(
    mode: str,
    start_mount_server: Callable[..., MountServer],
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """A billing reader and an admin reader are two classes, whatever the class mode: each
    session's files are exactly its reader's pages (a class key, view or visibility key that
    left out the groups would hand the second reader the first one's view)."""
    readers: dict[str, tuple[list[str] | None, set[str] | None]] = {
        "billing": (["billing"], {"billing"}),
        "admin": (["admin"], {"admin"}),
        "anonymous": (None, None),
        "admin-again": (["admin"], {"admin"}),
    }
    with contextlib.ExitStack() as stack:
        if mode == "shared":
            server: MountServer = stack.enter_context(running_shared_server(tmp_path / "server", tmp_path))
        else:
            server = start_mount_server()
        open_session = Sessions(server, sample_chroma("public"), secret_file).open
        for name, (groups, _) in readers.items():
            open_session(tmp_path / name, None if groups is None else token_file(groups))
        seen = {name: walked_files(tmp_path / name) for name in readers}
    for name, (_, groups) in readers.items():
        expected = expected_visible(SAMPLE_SITE, "public", groups)
        assert seen[name] == expected, (
            f"{name}: not shown {sorted(expected - seen[name])}, shown too {sorted(seen[name] - expected)}"
        )


def test_a_restarted_server_stops_only_the_classes_left_without_a_session(
    start_mount_server: Callable[..., MountServer],
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """Killed (SIGKILL) and restarted, the server marks idle only the classes its state leaves
    without a session: once --class-idle has passed, the class whose session was unmounted
    while it was down is stopped, and the class with a live session still serves it."""
    server = start_mount_server(class_idle_s=3.0)
    open_session = Sessions(server, sample_chroma("public"), secret_file).open
    kept, left = tmp_path / "kept", tmp_path / "left"
    open_session(kept, token_file(["billing"]))
    open_session(left)
    state_path = server.class_root / "state.json"
    class_of = {Path(s.mountpoint).name: s.class_key for s in StateJournal(str(state_path)).load().sessions.values()}
    assert set(class_of) == {"kept", "left"} and class_of["kept"] != class_of["left"]
    server.kill()
    unmount(left)  # while no server runs: the restarted one finds its class without a session
    server.start()
    restarted = time.monotonic()

    def classes() -> list[str]:
        return list(StateJournal(str(state_path)).load().classes)

    wait_until(lambda: class_of["left"] not in classes(), server.class_idle_s + 30, "the idle class stopped", 0.2)
    assert time.monotonic() - restarted >= server.class_idle_s - 1.0, "stopped before --class-idle passed"
    # both classes were in the state the restarted server read: one pass stops every class it marked idle
    state = StateJournal(str(state_path)).load()
    assert list(state.classes) == [class_of["kept"]], "the class with a live session was stopped as idle"
    assert [Path(m) for m in state.sessions] == [kept]
    billing_only = expected_visible(SAMPLE_SITE, "public", {"billing"}) - expected_visible(SAMPLE_SITE, "public", None)
    billing_page = min(billing_only)  # hidden from the anonymous class that was stopped
    for rel in ("quickstart.mdx", billing_page):
        assert (kept / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()
    assert is_mounted(kept)


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_a_session_ends_at_its_expiry_or_unmount_and_the_others_go_on(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    expires_at = int(time.time()) + 6
    short, long_ = tmp_path / "short", tmp_path / "long"
    open_session(short, token_file(["billing"], exp=expires_at))
    open_session(long_, token_file(["billing"]))
    alone = tmp_path / "alone"
    open_session(alone)
    assert len(classes(shared_server)) == 2
    # the user unmounts one session: only its bind goes; its class, left without sessions, is
    # stopped after the idle time
    assert run(["fusermount3", "-u", str(alone)]).returncode == 0
    wait_until(lambda: len(classes(shared_server)) == 1, 10, "the idle class stopped", 0.2)
    page = long_ / "quickstart.mdx"
    while time.time() < expires_at - 0.5:
        assert (short / "quickstart.mdx").read_bytes() == page.read_bytes()
        hold_for(0.25, "the pace of the checks until the expiry")
    wait_unmounted([short], expires_at + EXPIRY_BOUND_S, "the expired session ended within 5 s of exp")
    assert page.read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()  # the other session goes on
    assert "expired" in shared_server.log.read_text()


def test_a_session_whose_mountpoint_now_holds_another_mount_has_ended(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    """Its user unmounts a session and mounts something else at its path at once: the server
    tells the session's bind from the other mount by its device, so the session ends (gone from
    `chromafs status` and the journal) and its expiry never detaches the other mount."""
    path = tmp_path / "reused"
    expires_at = int(time.time()) + 4
    open_session(path, token_file(["billing"], exp=expires_at))
    assert str(path) in {s["mountpoint"] for s in statuses()}
    swap = run(["sh", "-c", 'umount "$1" && mount -t tmpfs -o size=1m other "$1"', "sh", str(path)])
    assert swap.returncode == 0, swap.stderr
    try:
        (path / "mine").write_text("kept")
        journal = StateJournal(str(shared_server.class_root / "state.json"))
        wait_until(lambda: str(path) not in journal.load().sessions, 5, "the session ended", 0.1)
        assert str(path) not in {s["mountpoint"] for s in statuses()}
        hold_for(expires_at + 1.5 - time.time(), "past the ended session's expiry")
        assert (path / "mine").read_text() == "kept", "the other mount was detached"
    finally:
        unmount(path)


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_the_server_restarts_without_harm(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    """Killed under 8 live sessions, the server comes back, finds its class mounts and
    sessions, adds sessions to them without stacking anything, and still ends sessions whose
    tokens expire."""
    soon = int(time.time()) + 12
    tokens = [None, token_file(["billing"]), token_file(["billing"], exp=soon), token_file(["admin"])]
    sessions = [tmp_path / f"s{i}" for i in range(8)]
    for i, mountpoint in enumerate(sessions):
        open_session(mountpoint, tokens[i % 4])
    known = classes(shared_server)
    assert len(known) == 3
    mounts = class_mounts(shared_server)
    shared_server.kill()
    for mountpoint in sessions:
        assert (mountpoint / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    shared_server.start()
    late = [tmp_path / "late-anon", tmp_path / "late-billing"]
    for mountpoint, token in zip(late, tokens[:2], strict=True):
        open_session(mountpoint, token)
    assert classes(shared_server) == known  # the new sessions joined the classes it left
    assert class_mounts(shared_server) == mounts
    table = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert all(table.count(str(m)) == 1 for m in [*sessions, *late, *mounts]), "something is stacked"
    expiring = [sessions[2], sessions[6]]
    wait_unmounted(expiring, soon + EXPIRY_BOUND_S, "the restarted server ended the expired sessions", 0.2)
    for mountpoint in [*sessions, *late]:
        if mountpoint not in expiring:
            assert (mountpoint / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()


def running(pid: int) -> bool:
    """The process runs (an ended daemon whose parent died may stay a zombie where PID 1 reaps
    nothing, as in a container running the suite)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_serving_processes_end_by_themselves_once_unused_when_no_server_runs(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    """A stopped server leaves nothing running: a serving process goes on serving the sessions that
    stand, and ends (its mount with it) --class-idle plus a few seconds' grace after its last
    session's bind is gone."""
    anonymous, admin = tmp_path / "anonymous", tmp_path / "admin"
    open_session(anonymous)
    open_session(admin, token_file(["admin"]))
    state = StateJournal(str(shared_server.class_root / "state.json")).load()
    pids = {c.pid for c in state.classes.values()}
    assert len(state.classes) == 2 and pids and class_mounts(shared_server)
    shared_server.stop()
    unmount(anonymous)
    grace = shared_server.class_idle_s + 5.0
    hold_for(grace, "past the serving process's own idle time, it must go on: one session's bind still stands")
    assert (admin / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    unmount(admin)
    wait_until(
        lambda: not class_mounts(shared_server) and not any(running(pid) for pid in pids),
        grace + 30.0,  # a loaded machine: generous
        "the serving processes and their mounts ended",
        0.2,
    )


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def session_class(mountpoint: Path) -> str:
    return next(s["session"]["class"] for s in statuses() if s["mountpoint"] == str(mountpoint))


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_the_server_reports_its_classes_and_sessions_as_metrics(
    start_mount_server: Callable[..., MountServer],
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    port = free_port()
    server = start_mount_server(metrics_port=port)
    open_session = Sessions(server, sample_chroma("public"), secret_file).open
    expires_at = int(time.time()) + 8
    for name in ("anon-1", "anon-2"):
        open_session(tmp_path / name)
    billing = tmp_path / "billing"
    open_session(billing, token_file(["billing"], exp=expires_at))
    assert run(["grep", "-rl", "token", str(tmp_path / "anon-1")]).returncode == 0
    read_at = time.time()
    for pid in {mount.pid for mount in StateJournal(str(server.class_root / "state.json")).load().classes.values()}:
        fresh_status(pid, read_at)  # its status counts those reads
    metrics = _scrape(port)
    assert metrics[("chromafs_mountd_classes", ())] == 2
    assert metrics[("chromafs_mountd_sessions", ())] == 3
    assert metrics[("chromafs_mountd_sessions_opened_total", ())] == 3
    per_class = {dict(labels)["reader"]: value for (name, labels), value in metrics.items()
                 if name == "chromafs_class_sessions"}  # fmt: skip
    assert per_class == {"anonymous": 2, "user=? groups=billing": 1}
    expiries = {dict(labels)["mountpoint"]: value for (name, labels), value in metrics.items()
                if name == "chromafs_session_expiry_timestamp_seconds"}  # fmt: skip
    assert expiries == {str(billing): expires_at}
    served = {dict(labels)["class"]: value for (name, labels), value in metrics.items()
              if name == "chromafs_class_requests_total" and dict(labels)["op"] == "all"}  # fmt: skip
    assert len(served) == 2 and served[session_class(tmp_path / "anon-1")] > 0
    wait_unmounted([billing], expires_at + EXPIRY_BOUND_S, "the billing session ended at its token's expiry")
    metrics = _scrape(port)
    assert metrics[("chromafs_mountd_sessions_expired_total", ())] == 1
    assert metrics[("chromafs_mountd_sessions", ())] == 2
    server.stop()
    # the class mounts outlive the server, but none of them holds its metrics port
    assert class_mounts(server) and is_mounted(tmp_path / "anon-1")
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_status_no_state_names_is_removed_by_the_server(
    shared_server: MountServer, open_session: OpenSession, tmp_path: Path
) -> None:
    """The server, not the next `chromafs status`, removes the status files of its class root's
    sessions that its state does not name (here: a session unmounted while no server ran, and the
    state lost with it); other servers' files are left alone."""
    gone = tmp_path / "gone"
    open_session(gone)
    runtime = Path(runtime_dir())  # this run's own (tests/conftest.py), never the machine's

    def listed() -> set[str]:
        return {json.loads(p.read_text())["mountpoint"] for p in runtime.glob("session-*.json")}

    assert str(gone) in listed()
    others = listed() - {str(gone)}
    shared_server.kill()
    unmount(gone)
    (shared_server.class_root / "state.json").unlink()
    shared_server.start()
    assert str(gone) not in listed() and others <= listed()
    assert "ended while no server ran" in shared_server.log.read_text()
