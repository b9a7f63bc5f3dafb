"""Issue 30: what works for sessions in process class mode keeps working in shared class mode
(chromafs-mountd --class-mode shared): token expiry, a mount server restart, --isolated,
`chromafs shell` over a session, and a Redis Cluster with its live updates. (`chromafs mcp`
reads the site itself, through no mount or session: nothing of it depends on the class mode.)"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_sessions import EXPIRY_BOUND_S, statuses, wait_unmounted
from test_shared_mount import IDLE_S, NO_WARM, control, open_session, session_args, shared_processes
from test_shell import NO_SANDBOX, SHELLS, shell, shell_args

from infra import (
    SAMPLE_SITE,
    SharedServer,
    copy_subset,
    expected_visible,
    hold_for,
    ingest,
    is_mounted,
    mounts_under,
    run,
    running_shared_server,
    unmount,
    wait_gone,
    wait_until,
)
from redis_topologies import RedisClusterServers

PAGE = "quickstart.mdx"
BILLING_ONLY = expected_visible(SAMPLE_SITE, "public", {"billing"}) - expected_visible(SAMPLE_SITE, "public", None)
BILLING_PAGE = min(p for p in BILLING_ONLY if p.endswith((".md", ".mdx")))  # hidden from anonymous readers


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SharedServer]:
    with running_shared_server(tmp_path / "server", tmp_path, SHELLS, class_idle_s=IDLE_S) as server:
        yield server


@pytest.fixture
def opener(
    server: SharedServer, sample_chroma: Callable[[str], Path], secret_file: Path, tmp_path: Path
) -> Callable[..., Path]:
    """open(name, token=None, *more): a session of `server` on the sample site at tmp_path/name."""
    chroma = sample_chroma("public")

    def open_(name: str, token: Path | None = None, *more: str) -> Path:
        open_session(tmp_path / name, [*session_args(chroma, server, token, secret_file), *more])
        return tmp_path / name

    return open_


def same_as_source(mountpoint: Path, rel: str = PAGE) -> bool:
    return (mountpoint / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()


def classes_of(*mountpoints: Path) -> list[str]:
    """The reader class of each session, as `chromafs status` names it."""
    sessions = {s["mountpoint"]: s["session"]["class"] for s in statuses() if "session" in s}
    assert {str(m) for m in mountpoints} <= set(sessions), f"sessions gone: {sorted(sessions)}"
    return [sessions[str(m)] for m in mountpoints]


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_a_session_ends_at_its_expiry_and_its_class_and_the_others_read_on(
    server: SharedServer, opener: Callable[..., Path], token_file: Callable[..., Path]
) -> None:
    long_, anon = opener("long", token_file(["billing"])), opener("anon")
    expires_at = int(time.time()) + 6  # after the serving process started: its start-up is not counted
    short = opener("short", token_file(["billing"], exp=expires_at))
    short_class, long_class, anon_class = classes_of(short, long_, anon)
    assert short_class == long_class != anon_class  # one view for the two billing sessions
    assert len(control(server, {"op": "describe"})["views"]) == 2
    while time.time() < expires_at - 0.5:
        assert same_as_source(short, BILLING_PAGE)  # serving until the token expires
        hold_for(0.25, "the pace of the checks until the expiry")
    wait_unmounted([short], expires_at + EXPIRY_BOUND_S, "the expired session ended within 5 s of exp")
    with pytest.raises(OSError) as info:
        (short / PAGE).read_bytes()
    assert info.value.errno == errno.ENOENT  # the bare mountpoint
    assert same_as_source(long_, BILLING_PAGE) and same_as_source(long_) and same_as_source(anon)
    assert is_mounted(long_) and is_mounted(anon) and "expired" in server.log.read_text()


@pytest.mark.expect_log(r"WARNING .*session on .* expired")
def test_the_server_restarts_under_live_sessions_without_harm(
    server: SharedServer, opener: Callable[..., Path], token_file: Callable[..., Path]
) -> None:
    """Killed under 6 sessions of 3 classes, the server comes back, finds the serving process and
    its views, adds sessions to them without stacking anything, and still ends an expiring one."""
    tokens = [None, token_file(["billing"]), token_file(["admin"])]
    sessions = [opener(f"s{i}", tokens[i % 3]) for i in range(5)]
    soon = int(time.time()) + 8
    sessions.append(opener("expiring", token_file(["billing"], exp=soon)))
    [pid] = shared_processes(server)
    views = sorted(control(server, {"op": "describe"})["views"])
    assert len(views) == 3
    server.kill()
    assert all(same_as_source(m) for m in sessions)
    server.start()
    late = [opener("late-anon"), opener("late-admin", token_file(["admin"]))]
    assert all(same_as_source(m) for m in [*sessions[:-1], *late])
    assert shared_processes(server) == [pid] and mounts_under(server.class_root) == [server.shared]
    assert sorted(control(server, {"op": "describe"})["views"]) == views  # joined, no view added
    assert classes_of(*late) == classes_of(sessions[0], sessions[2])
    table = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    stacked = [m for m in [*sessions, *late, server.shared] if table.count(str(m)) > 1]
    assert not stacked, f"mounted more than once: {stacked}"
    wait_unmounted([sessions[-1]], soon + EXPIRY_BOUND_S, "the restarted server ended the expired session")
    assert all(same_as_source(m) for m in [*sessions[:-1], *late])


def test_an_isolated_session_gets_a_daemon_of_its_own(
    server: SharedServer, opener: Callable[..., Path], token_file: Callable[..., Path], tmp_path: Path
) -> None:
    anon = opener("anon")
    pid_file = tmp_path / "isolated.pid"
    isolated = opener("isolated", token_file(["billing"]), "--isolated", "--pid-file", str(pid_file))
    assert os.stat(isolated).st_dev not in (os.stat(server.shared).st_dev, os.stat(anon).st_dev)
    pid = int(pid_file.read_text())  # the daemon's, written by the daemon
    assert pid not in shared_processes(server)
    assert len(control(server, {"op": "describe"})["views"]) == 1  # the anonymous class only
    expected = copy_subset(SAMPLE_SITE, expected_visible(SAMPLE_SITE, "public", {"billing"}), tmp_path / "expected")
    diff = run(["diff", "-r", str(expected), str(isolated)])
    assert diff.returncode == 0, diff.stdout[:1000]
    assert run(["fusermount3", "-u", str(isolated)]).returncode == 0
    assert wait_gone(pid, 10), "the isolated daemon outlived its unmount"
    assert same_as_source(anon) and len(shared_processes(server)) == 1


def test_a_search_dir_session_gets_a_daemon_of_its_own(
    server: SharedServer,
    opener: Callable[..., Path],
    sample_chroma: Callable[[str], Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """`--search-dir` is not served by the pool (its query inodes are per mount): such a session
    gets a daemon of its own, as `--isolated` does, mounted at the session's path, beside the
    pool's classes; it ends with its unmount."""
    from test_search_dir import chromafs_search

    anon = opener("anon")
    pid_file = tmp_path / "searcher.pid"
    searcher = opener("searcher", None, "--search-dir", ".search", "--pid-file", str(pid_file))
    assert os.stat(searcher).st_dev not in (os.stat(server.shared).st_dev, os.stat(anon).st_dev)
    assert mounts_under(server.class_root) == [server.shared]  # no class of its own in the class root
    pid = int(pid_file.read_text())
    assert pid not in shared_processes(server)
    assert len(control(server, {"op": "describe"})["views"]) == 1  # the anonymous class only
    query = "Authorization header"
    args = ["--site", "acme", "--chroma-path", str(sample_chroma("public")), "--jwt-secret-file", str(secret_file)]
    answer = (searcher / ".search" / query).read_text()
    assert answer and answer == chromafs_search(args, query)
    assert same_as_source(searcher) and ".search" not in os.listdir(searcher)
    assert run(["fusermount3", "-u", str(searcher)]).returncode == 0
    assert wait_gone(pid, 10), "the search-dir daemon outlived its unmount"
    assert same_as_source(anon) and len(shared_processes(server)) == 1


SCRIPT = "cd /docs && stat -c %d . && ls -R && cat {page} && grep -rl --exclude=*.png Authorization . | sort"


@pytest.mark.skipif(NO_SANDBOX is not None, reason=str(NO_SANDBOX))
def test_a_shell_over_a_shared_session_sees_what_the_session_sees(
    server: SharedServer,
    opener: Callable[..., Path],
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
) -> None:
    token = token_file(["billing"])
    session = opener("billing", token)
    script = SCRIPT.format(page=BILLING_PAGE)
    done = shell(shell_args(sample_chroma("public"), token, secret_file, server), script)
    assert done.returncode == 0, done.stderr
    on_host = subprocess.run(["bash", "-c", script.replace("/docs", str(session))], capture_output=True, text=True)
    assert on_host.returncode == 0, on_host.stderr
    device, listing = done.stdout.split("\n", 1)
    assert int(device) == os.stat(server.shared).st_dev  # a view of the serving mount
    assert listing == on_host.stdout.split("\n", 1)[1]
    assert (SAMPLE_SITE / BILLING_PAGE).read_text() in listing
    assert mounts_under(SHELLS) == [], "the shell's session outlived its command"
    assert len(shared_processes(server)) == 1 and same_as_source(session, BILLING_PAGE)


@pytest.mark.expect_log(
    r"(ERROR redis\.cluster: Topology refresh failed|WARNING .*Redis \(cluster .*\) (unavailable|is reachable again))"
)
def test_a_redis_cluster_backed_session_reads_the_site_and_follows_a_reingest(
    server: SharedServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    site, chroma = shutil.copytree(SAMPLE_SITE, tmp_path / "site"), tmp_path / "chroma"
    with RedisClusterServers(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        backend = ["--site", "acme", "--chroma-path", str(chroma), "--redis-url", cluster.url]
        ingest(site, *backend, "--quiet")
        # not warmed: a warm-up reading pages while Chroma is away would make an empty one there
        more = ["--redis-url", cluster.url, "--refresh-interval", "0.5", *NO_WARM]
        anon, billing = tmp_path / "anon", tmp_path / "billing"
        chroma.rename(tmp_path / "away")  # the site's tree can only come from the cluster
        open_session(anon, [*session_args(chroma, server, None, secret_file), *more])
        open_session(billing, [*session_args(chroma, server, token_file(["billing"]), secret_file), *more])
        (tmp_path / "away").rename(chroma)  # pages are read through it, from Chroma
        assert same_as_source(anon) and same_as_source(billing, BILLING_PAGE)
        changed = (site / PAGE).read_bytes() + b"\nA line the re-ingest added.\n"
        (site / PAGE).write_bytes(changed)
        (site / "new-page.md").write_bytes(b"# New\n")
        ingest(site, *backend, "--quiet")
        wait_until(lambda: all((m / "new-page.md").exists() for m in (anon, billing)), 30, "the re-ingest seen")
        for mountpoint in (anon, billing):
            assert (mountpoint / PAGE).read_bytes() == changed
            assert (mountpoint / "new-page.md").read_bytes() == b"# New\n"
        for mountpoint in (anon, billing):
            unmount(mountpoint)  # before the cluster goes
