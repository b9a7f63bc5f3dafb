"""Sessions: binds of a shared mount per reader class (chromafs-mountd as root), or a daemon of
their own; either way a session ends when its token expires, and only that session."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from chromafs_fuse.serving.state_journal import StateJournal
from infra import (
    BIN,
    SAMPLE_SITE,
    Backend,
    MountServer,
    copy_subset,
    expected_visible,
    free_port,
    ingest,
    is_mounted,
    mounted,
    mounts_under,
    reader_args,
    run,
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


def test_a_session_mount_ends_when_its_token_expires(
    sample_backend: Callable[..., Backend], token_file: Callable[..., Path], secret_file: Path, mnt: Path
) -> None:
    expires_at = int(time.time()) + 6
    token = reader_args(token_file(["billing"], exp=expires_at), secret_file)
    with mounted(mnt, *sample_backend().args, *token):
        assert (mnt / "quickstart.mdx").read_bytes()
        mine = next(s for s in statuses() if s["mountpoint"] == str(mnt))
        assert mine["expires_at"] == expires_at and "user=tester" in mine["reader"]
        while time.time() < expires_at - 0.5:
            assert is_mounted(mnt)  # serving until the token expires
            time.sleep(0.25)
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
    return mounts_under(server.class_root)


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
    assert len(class_mounts(shared_server)) == 3  # anonymous, billing, admin+billing
    for name, (_, groups) in readers.items():
        copy = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", groups), tmp_path / f"exp-{name}")
        diff = run(["diff", "-r", str(copy), str(tmp_path / name)])
        assert diff.returncode == 0, f"{name}: {diff.stdout[:1000]}"
    same = os.stat(tmp_path / "anon-1").st_dev
    assert os.stat(tmp_path / "anon-2").st_dev == same != os.stat(tmp_path / "billing-1").st_dev
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


def test_a_session_ends_at_its_expiry_or_unmount_and_the_others_go_on(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    expires_at = int(time.time()) + 6
    short, long_ = tmp_path / "short", tmp_path / "long"
    open_session(short, token_file(["billing"], exp=expires_at))
    open_session(long_, token_file(["billing"]))
    alone = tmp_path / "alone"
    open_session(alone)
    assert len(class_mounts(shared_server)) == 2
    # the user unmounts one session: only its bind goes; its class, left without sessions, is
    # unmounted after the idle time
    assert run(["fusermount3", "-u", str(alone)]).returncode == 0
    wait_until(lambda: len(class_mounts(shared_server)) == 1, 10, "the idle class mount unmounted", 0.2)
    page = long_ / "quickstart.mdx"
    while time.time() < expires_at - 0.5:
        assert (short / "quickstart.mdx").read_bytes() == page.read_bytes()
        time.sleep(0.25)
    wait_unmounted([short], expires_at + EXPIRY_BOUND_S, "the expired session ended within 5 s of exp")
    assert page.read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()  # the other session goes on
    assert "expired" in shared_server.log.read_text()


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
    classes = class_mounts(shared_server)
    assert len(classes) == 3
    shared_server.kill()
    for mountpoint in sessions:
        assert (mountpoint / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    shared_server.start()
    late = [tmp_path / "late-anon", tmp_path / "late-billing"]
    for mountpoint, token in zip(late, tokens[:2], strict=True):
        open_session(mountpoint, token)
    assert class_mounts(shared_server) == classes  # the new sessions joined the class mounts it left
    table = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert all(table.count(str(m)) == 1 for m in [*sessions, *late, *classes]), "something is stacked"
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


def test_class_mounts_end_by_themselves_once_idle_when_no_server_runs(
    shared_server: MountServer, open_session: OpenSession, token_file: Callable[..., Path], tmp_path: Path
) -> None:
    """A stopped server leaves no class mount behind after --class-idle (plus a few seconds'
    grace), nor its daemon or watchdog; a class mount whose session stands goes on serving."""
    anonymous, admin = tmp_path / "anonymous", tmp_path / "admin"
    open_session(anonymous)
    open_session(admin, token_file(["admin"]))
    state = StateJournal(str(shared_server.class_root / "state.json")).load()
    pids = {Path(c.path).name: c.pid for c in state.classes.values()}
    assert len(pids) == 2 and len(class_mounts(shared_server)) == 2
    shared_server.stop()
    unmount(anonymous)
    deadline = time.monotonic() + shared_server.class_idle_s + 5.0 + 30.0  # a loaded machine: generous
    wait_until(
        lambda: len(class_mounts(shared_server)) <= 1,
        deadline - time.monotonic(),
        "the idle class mount ending without its server",
        0.2,
    )
    assert (admin / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    unmount(admin)
    wait_until(
        lambda: not class_mounts(shared_server) and not any(running(pid) for pid in pids.values()),
        deadline + 10.0 - time.monotonic(),
        "the last class mount and every class daemon ended",
        0.2,
    )
    watchdogs = subprocess.run(
        ["pgrep", "-f", f"chromafs-watchdog ({'|'.join(map(str, pids.values()))}) "], capture_output=True, text=True
    )
    assert watchdogs.stdout == "", f"watchdogs left: {watchdogs.stdout}"


@pytest.mark.parametrize("memory", [[], ["--cache-bytes", "65536"]], ids=["default", "site-over-memory-cache"])
def test_a_class_mount_is_handed_out_warm(
    shared_server: MountServer, open_session: OpenSession, tmp_path: Path, memory: list
) -> None:
    """Its first session finds every listing and every page in the kernel: a `grep -r` right
    after the mount sends not a single read or listing to the class mount's daemon (the two
    images are lazy files in the blob store, read on demand: grep skips them here). A site
    larger than the daemon's memory cache is streamed through to the kernel all the same."""
    session = tmp_path / "first"
    open_session(session, None, *memory)
    [class_mount] = class_mounts(shared_server)
    log = Path(f"{class_mount}.log").read_text()
    assert log.index("warm in") < log.index("mounted on"), "the session was handed out before the warm-up ended"

    def class_status() -> dict:
        time.sleep(2.5)  # the daemon's status is written every 2 s
        return next(s for s in statuses() if s["mountpoint"] == str(class_mount))

    before = class_status()["requests"]
    found = run(["grep", "-rl", "--exclude=*.png", "Authorization", str(session)])
    assert found.returncode == 0 and found.stdout
    status = class_status()
    visible = expected_visible(SAMPLE_SITE, "public", None)
    assert status["pages_pushed"]["stored"] == len([key for key in visible if not key.endswith(".png")])
    sent = {op: n - before.get(op, 0) for op, n in status["requests"].items() if n != before.get(op, 0)}
    # (one `open` is how the kernel learns it need not send more; `statfs` is chromafs status.)
    # Cold pages and listings may be reclaimed by the kernel at any time, with memory free or not
    # (these machines run DAMON's proactive `pageout`): a stray read or readdir is the kernel's,
    # while a class mount handed out cold sends a read per page and a readdir per directory.
    assert not {"opendir", "lookup", "getattr"} & set(sent), f"the first grep sent {sent}"
    assert sent.get("read", 0) + sent.get("readdir", 0) <= 4, f"the first grep sent {sent}"
    if memory:
        assert status["cached_bytes"] <= int(memory[1]), "the pages handed to the kernel stayed in memory"
    diff = run(["diff", "-r", str(copy_subset(SAMPLE_SITE, visible, tmp_path / "expected")), str(session)])
    assert diff.returncode == 0, diff.stdout[:1000]


def test_a_class_mount_warms_the_pages_a_reingest_changed(
    shared_server: MountServer, secret_file: Path, tmp_path: Path
) -> None:
    """After a re-ingest, the changed page and the new one are in the kernel before anyone
    reads them: reading them sends no read to the class mount's daemon."""
    site = tmp_path / "site"
    shutil.copytree(SAMPLE_SITE, site)
    chroma = tmp_path / "chroma"
    ingest(site, *Backend("acme", chroma).args, "--quiet")
    session = tmp_path / "session"
    Sessions(shared_server, chroma, secret_file).open(session, None, "--refresh-interval", "0.5")
    [class_mount] = class_mounts(shared_server)
    log = Path(f"{class_mount}.log")
    changed = (site / "quickstart.mdx").read_bytes() + b"\nA line the re-ingest added.\n"
    (site / "quickstart.mdx").write_bytes(changed)
    (site / "new-page.md").write_bytes(b"# New\n\nA page the re-ingest added.\n")
    ingest(site, *Backend("acme", chroma).args, "--quiet")
    wait_until(lambda: log.read_text().count("warm in") >= 2, 30, f"a second warm-up after the switch ({log})", 0.2)
    time.sleep(2.5)  # the daemon's status is written every 2 s
    before = next(s for s in statuses() if s["mountpoint"] == str(class_mount))["requests"]
    assert (session / "quickstart.mdx").read_bytes() == changed
    assert (session / "new-page.md").read_bytes() == b"# New\n\nA page the re-ingest added.\n"
    time.sleep(2.5)
    after = next(s for s in statuses() if s["mountpoint"] == str(class_mount))["requests"]
    # (at most one stray read: the kernel may reclaim a cold page at any time, see above)
    assert after.get("read", 0) - before.get("read", 0) <= 1, (
        "the pages the re-ingest changed were read from the daemon"
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
    time.sleep(2.5)  # class mounts write their status every 2 s
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
    served = [value for (name, labels), value in metrics.items()
              if name == "chromafs_class_requests_total" and dict(labels)["op"] == "readdir"]  # fmt: skip
    assert len(served) == 2 and all(value > 0 for value in served)
    wait_unmounted([billing], expires_at + EXPIRY_BOUND_S, "the billing session ended at its token's expiry")
    metrics = _scrape(port)
    assert metrics[("chromafs_mountd_sessions_expired_total", ())] == 1
    assert metrics[("chromafs_mountd_sessions", ())] == 2
    server.stop()
    # the class mounts outlive the server, but none of them holds its metrics port
    assert class_mounts(server) and is_mounted(tmp_path / "anon-1")
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
