"""The shared class mode (chromafs-mountd --class-mode shared, issue 30): every reader class of
every site is a directory of ONE mount served by ONE process, and a session is a read-only bind
of its class's directory. Each session sees exactly its class's tree, and nothing it can observe
depends on the other classes or sites."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_probes import HIDDEN_FOR_ANON, _errno, _probes, _variants

from infra import (
    SAMPLE_SITE,
    ChromaServer,
    MountServer,
    SharedServer,
    copy_subset,
    expected_visible,
    free_port,
    fresh_status,
    hold_for,
    in_child_as,
    ingest,
    mounts_under,
    run,
    running_shared_server,
    tree_listing,
    try_mount,
    unmount,
    wait_until,
)

IDLE_S = 1.0
NO_WARM = ["--warm-max-bytes", "1"]  # every site is over it: no view is warmed (shared_warm.py)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SharedServer]:
    with running_shared_server(tmp_path / "server", tmp_path, class_idle_s=IDLE_S) as server:
        yield server


def session_args(chroma: Path, server: MountServer, token: Path | None, secret_file: Path, site: str = "acme") -> list:
    args = ["--site", site, "--chroma-path", str(chroma), "--mountd", str(server.socket), "--refresh-interval", "0"]
    return [*args, "--token-file", str(token), "--jwt-secret-file", str(secret_file)] if token else args


def open_session(mountpoint: Path, args: list[str]) -> float:
    """Opens the session; the seconds it took."""
    mountpoint.mkdir(exist_ok=True)
    started = time.perf_counter()
    done = try_mount(mountpoint, *args)
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started


def find_list(root: Path) -> list[str]:
    out = run(["find", str(root), "-printf", "%P %y %n %s\n"])
    assert out.returncode == 0, out.stderr
    return sorted(out.stdout.splitlines())


def shared_processes(server: SharedServer) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"chromafs-serving {server.class_root}$"], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


def control(server: SharedServer, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(server.class_root / "serving.sock"))
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            answer += sock.recv(65536)
    return json.loads(answer)


def test_two_classes_of_one_site_are_views_of_one_mount(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    chroma = sample_chroma("public")
    anon, billing = tmp_path / "anon", tmp_path / "billing"
    open_session(anon, session_args(chroma, server, None, secret_file))
    before = {"anon": find_list(anon), "stat": os.stat(anon / "quickstart.mdx"), "statfs": os.statvfs(anon)}
    open_session(billing, session_args(chroma, server, token_file(["billing"]), secret_file))
    for mountpoint, groups in ((anon, None), (billing, {"billing"})):
        visible = expected_visible(SAMPLE_SITE, "public", groups)
        copy = copy_subset(SAMPLE_SITE, visible, tmp_path / f"expected-{mountpoint.name}")
        diff = run(["diff", "-r", str(copy), str(mountpoint)])
        assert diff.returncode == 0, f"{mountpoint.name}: {diff.stdout[:1000]}"
    assert len(shared_processes(server)) == 1
    assert mounts_under(server.class_root) == [server.shared]  # one mount, whatever the classes
    assert os.stat(anon).st_dev == os.stat(billing).st_dev
    page_a, page_b = os.stat(anon / "quickstart.mdx"), os.stat(billing / "quickstart.mdx")
    assert page_a.st_ino == page_b.st_ino and page_a.st_nlink == page_b.st_nlink == 1
    # nothing the first session sees changed when the second class came
    assert find_list(anon) == before["anon"]
    assert os.stat(anon / "quickstart.mdx") == before["stat"] and os.statvfs(anon) == before["statfs"]
    billing_only = expected_visible(SAMPLE_SITE, "public", {"billing"}) - expected_visible(SAMPLE_SITE, "public", None)
    hidden = sorted(billing_only)
    assert hidden, "the sample site hides nothing from anonymous readers"
    for key in hidden:
        with pytest.raises(OSError) as info:
            os.stat(anon / key)
        assert info.value.errno == errno.ENOENT
    with pytest.raises(OSError) as info:
        (anon / "new.md").write_text("x")
    assert info.value.errno == errno.EROFS


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages of the file in the kernel's page cache, pages of the file): mincore(2) on a mapping of
    it, which faults nothing in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in vector.raw[:pages]), pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def test_a_second_site_and_the_page_cache_are_shared_without_leaking(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """Two classes of one site and a class of another site: one process, one mount; a page read
    through one class is in the kernel's page cache for the other (one inode); the other site's
    copy of the page is another inode; `..` at a session's root is the session's parent."""
    chroma = sample_chroma("public")
    other_chroma = tmp_path / "other-chroma"
    ingest(SAMPLE_SITE, "--site", "other", "--chroma-path", str(other_chroma), "--quiet")
    anon, admin, other = tmp_path / "anon", tmp_path / "admin", tmp_path / "other"
    open_session(anon, [*session_args(chroma, server, None, secret_file), *NO_WARM])
    seen = (find_list(anon), os.statvfs(anon), [os.stat(anon / p) for p in ("", "quickstart.mdx")])
    open_session(admin, [*session_args(chroma, server, token_file(["admin", "billing"]), secret_file), *NO_WARM])
    open_session(other, [*session_args(other_chroma, server, None, secret_file, site="other"), *NO_WARM])
    assert (find_list(anon), os.statvfs(anon), [os.stat(anon / p) for p in ("", "quickstart.mdx")]) == seen
    assert len(shared_processes(server)) == 1 and mounts_under(server.class_root) == [server.shared]
    assert os.stat(other / "quickstart.mdx").st_ino != os.stat(anon / "quickstart.mdx").st_ino
    assert find_list(other) == find_list(anon)  # the same pages, public alike
    page = max(anon.rglob("*.md*"), key=lambda p: p.stat().st_size).relative_to(anon)
    assert resident_pages(admin / page)[0] == 0  # nobody read it yet
    data = (anon / page).read_bytes()
    resident, pages = resident_pages(admin / page)
    assert resident == pages, f"{page}: {resident} of {pages} pages in the kernel for the other class"
    assert (admin / page).read_bytes() == data
    assert sorted(os.listdir(anon / "..")) == sorted(os.listdir(tmp_path))
    assert os.stat(anon / "..").st_ino == os.stat(tmp_path).st_ino


def warm_lines(server: SharedServer, count: int) -> list[str]:
    """The serving process's log lines of its first `count` warmed views, once there are as many."""
    log_file = server.class_root / "serving.log"

    def warmed() -> list[str]:
        lines = [line for line in log_file.read_text().splitlines() if " warm " in line and " read" in line]
        return lines if len(lines) >= count else []

    return wait_until(warmed, 30, f"{count} views warmed")


def test_a_class_is_read_into_the_kernel_once_in_the_background(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """A new class's pages are read through the mount after its first session is handed out, and
    the session's own directories are listed before it is: its first `grep -r` then makes no
    request at all (no-open mode: no open, release or listing either). A second class of the site
    reads only the pages the first one does not show (they are the same inodes)."""
    chroma = sample_chroma("public")
    anon, billing = tmp_path / "anon", tmp_path / "billing"
    open_session(anon, session_args(chroma, server, None, secret_file))
    warm_lines(server, 1)

    def requests() -> dict[str, int]:  # grep's statfs (a fixed answer) aside
        return {op: n for op, n in control(server, {"op": "describe"})["requests"].items() if op != "statfs"}

    before = requests()
    grep = run(["grep", "-r", "--count", "an-absent-word-7f3a", str(anon)])
    visible = expected_visible(SAMPLE_SITE, "public", None)
    assert grep.returncode == 1 and len(grep.stdout.splitlines()) == len(visible), grep.stderr
    assert requests() == before, "grep reached the serving process"
    for rel in visible:
        resident, pages = resident_pages(anon / rel)
        assert resident == pages, f"{rel}: {resident} of {pages} pages in the kernel"
    open_session(billing, session_args(chroma, server, token_file(["billing"]), secret_file))
    second = warm_lines(server, 2)[1]
    billing_only = expected_visible(SAMPLE_SITE, "public", {"billing"}) - visible
    assert f" {len(billing_only)} files (" in second, second
    for rel in sorted(billing_only):
        assert (billing / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()


@pytest.mark.expect_log(r"ERROR .*(fetching chunks of .* failed: no answer|reading .*: no answer within)")
def test_a_frozen_site_fails_its_reads_in_time_and_stalls_no_other_site(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    secret_file: Path,
    tmp_path: Path,
    fresh_chroma_server: Callable[..., ChromaServer],
) -> None:
    """One process serves both sites: while one site's `chroma run` is stopped (SIGSTOP), its
    reads fail with EIO within --backend-timeout, the other site's cold reads go on as before,
    and the frozen site reads again once its backend answers."""
    chroma = fresh_chroma_server()  # frozen on purpose
    ingest(SAMPLE_SITE, "--site", "slow", "--chroma-url", chroma.url, "--quiet")
    timeout = 3.0
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    slow_args = ["--site", "slow", "--chroma-url", chroma.url, "--mountd", str(server.socket)]
    open_session(slow, [*slow_args, "--refresh-interval", "0", "--backend-timeout", str(timeout), *NO_WARM])
    open_session(fast, [*session_args(sample_chroma("public"), server, None, secret_file), *NO_WARM])
    pages = sorted(p for p in expected_visible(SAMPLE_SITE, "public", None) if p.endswith((".md", ".mdx")))
    assert (slow / pages[0]).read_bytes() == (SAMPLE_SITE / pages[0]).read_bytes()
    assert chroma.proc is not None
    os.kill(chroma.proc.pid, signal.SIGSTOP)
    outcomes: list[tuple[str, int | None, float]] = []

    def read_frozen(page: str) -> None:
        started = time.monotonic()
        try:
            (slow / page).read_bytes()
            outcomes.append((page, None, time.monotonic() - started))
        except OSError as exc:
            outcomes.append((page, exc.errno, time.monotonic() - started))

    try:
        readers = [threading.Thread(target=read_frozen, args=(page,)) for page in pages[-4:]]
        for reader in readers:
            reader.start()
        hold_for(0.3, "the frozen site's reads are under way when the other site's start")
        for page in pages:
            started = time.monotonic()
            assert (fast / page).read_bytes() == (SAMPLE_SITE / page).read_bytes()
            took = time.monotonic() - started
            assert took < 1.0, f"{page} of the other site took {took:.1f}s while one site was frozen"
        for reader in readers:
            reader.join(timeout + 5)
    finally:
        os.kill(chroma.proc.pid, signal.SIGCONT)
    assert len(outcomes) == 4 and all(code == errno.EIO and took < timeout + 1.0 for _, code, took in outcomes), (
        outcomes
    )
    recovered = wait_until((slow / pages[-1]).read_bytes, 30, "the frozen site's recovery", 0.5, (OSError,))
    assert recovered == (SAMPLE_SITE / pages[-1]).read_bytes()


def test_a_reingest_is_seen_by_every_class_of_the_site(
    server: SharedServer, token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    site, chroma = tmp_path / "site", tmp_path / "chroma"
    shutil.copytree(SAMPLE_SITE, site)
    ingest(site, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    anon, billing = tmp_path / "anon", tmp_path / "billing"
    refresh = ["--refresh-interval", "0.5"]
    open_session(anon, [*session_args(chroma, server, None, secret_file), *refresh])
    open_session(billing, [*session_args(chroma, server, token_file(["billing"]), secret_file), *refresh])
    old = (anon / "quickstart.mdx").read_bytes()
    assert (billing / "quickstart.mdx").read_bytes() == old
    changed = old + b"\nA line the re-ingest added.\n"
    (site / "quickstart.mdx").write_bytes(changed)
    (site / "new-page.md").write_bytes(b"# New\n")
    ingest(site, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    wait_until(lambda: all((m / "new-page.md").exists() for m in (anon, billing)), 30, "the new page on both", 0.2)
    for mountpoint in (anon, billing):
        assert (mountpoint / "quickstart.mdx").read_bytes() == changed
        assert (mountpoint / "new-page.md").read_bytes() == b"# New\n"
    assert os.stat(anon / "quickstart.mdx").st_ino == os.stat(billing / "quickstart.mdx").st_ino


def test_the_process_outlives_a_server_restart_and_ends_once_unused(
    server: SharedServer, sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    chroma = sample_chroma("public")
    anon, billing = tmp_path / "anon", tmp_path / "billing"
    open_session(anon, session_args(chroma, server, None, secret_file))
    [pid] = shared_processes(server)
    server.kill()
    assert (anon / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    server.start()
    open_session(billing, session_args(chroma, server, token_file(["billing"]), secret_file))
    assert shared_processes(server) == [pid]  # the restarted server found it
    views = control(server, {"op": "describe"})["views"]
    assert sorted(v["reader"] for v in views.values()) == ["anonymous", "user=? groups=billing"]
    server.stop()
    unmount(anon)
    unmount(billing)
    wait_until(
        lambda: not shared_processes(server) and server.shared not in mounts_under(server.class_root),
        IDLE_S + 5.0 + 30.0,  # --class-idle, the grace, a loaded machine
        "the serving process ended once its last session was gone",
        0.2,
    )


def test_the_leak_probes_find_nothing_through_a_shared_session(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """test_probes.py's probes on an anonymous session while an admin class of the site is served
    by the same mount: a hidden page answers every call exactly as a missing one; listings,
    counts and xattrs reveal nothing; statfs counts the session's own nodes, as a mount of its own."""
    chroma = sample_chroma("public")
    anon, admin = tmp_path / "anon", tmp_path / "admin"
    open_session(admin, session_args(chroma, server, token_file(["admin", "billing"]), secret_file))
    open_session(anon, session_args(chroma, server, None, secret_file))
    for rel in HIDDEN_FOR_ANON:
        assert (admin / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes()
    cwd = os.getcwd()
    try:
        for rel in HIDDEN_FOR_ANON:
            missing = rel.rsplit("/", 1)[0] + "/no-such-page-" + str(len(rel)) + ".mdx"
            for variant in _variants(rel):
                for name, probe in _probes(anon / variant).items():
                    hidden_errno, missing_errno = _errno(probe), _errno(_probes(anon / missing)[name])
                    assert hidden_errno == missing_errno != 0, (variant, name, hidden_errno, missing_errno)
    finally:
        os.chdir(cwd)
    visible = expected_visible(SAMPLE_SITE, "public", None)
    listing = tree_listing(anon)
    assert not set(HIDDEN_FOR_ANON) & set(listing) and "internal/secret-project" not in listing
    for directory in {r.rsplit("/", 1)[0] for r in visible if "/" in r} | {"."}:
        names = os.listdir(anon / directory)
        subdirs = sum(1 for n in names if (anon / directory / n).is_dir())
        st = os.stat(anon / directory)
        assert st.st_nlink == 2 + subdirs and st.st_size == 0
    for rel in visible:
        with pytest.raises(OSError) as no_xattrs:
            os.listxattr(anon / rel)
        assert no_xattrs.value.errno == errno.EOPNOTSUPP
    nodes = 1 + sum(len(dirs) + len(files) for _, dirs, files in os.walk(anon))  # the root, and all it holds
    assert os.statvfs(anon).f_files == nodes < os.statvfs(admin).f_files


class PooledServer(SharedServer):
    """chromafs-mountd --class-mode shared --shared-processes 2."""

    def argv(self) -> list[str]:
        return [*MountServer.argv(self), "--serving-processes", "2"]


def test_sites_are_spread_over_a_pool_and_a_site_stays_in_its_process(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    """With --shared-processes 2: the first two sites go to different processes (each its own
    mount), every class of a site to its site's process (one inode per page), also for a class
    that comes after the server restarted."""
    (tmp_path / "server").mkdir()
    server = PooledServer(tmp_path / "server", class_idle_s=IDLE_S)
    chroma = sample_chroma("public")
    other_chroma = tmp_path / "other-chroma"
    ingest(SAMPLE_SITE, "--site", "other", "--chroma-path", str(other_chroma), "--quiet")
    first, second = server.class_root / "serving", server.class_root / "serving-1"
    try:
        with server:
            other, anon = tmp_path / "other", tmp_path / "anon"
            open_session(other, [*session_args(other_chroma, server, None, secret_file, site="other"), *NO_WARM])
            open_session(anon, [*session_args(chroma, server, None, secret_file), *NO_WARM])
            assert mounts_under(server.class_root) == [first, second]
            assert (os.stat(other).st_dev, os.stat(anon).st_dev) == (os.stat(first).st_dev, os.stat(second).st_dev)
            for pattern in (f"chromafs-serving {server.class_root}$", f"chromafs-serving {server.class_root} 1$"):
                assert len(run(["pgrep", "-f", pattern]).stdout.split()) == 1, pattern
            server.kill()
            server.start()
            billing = tmp_path / "billing"
            open_session(billing, [*session_args(chroma, server, token_file(["billing"]), secret_file), *NO_WARM])
            assert os.stat(billing).st_dev == os.stat(second).st_dev, "a class left its site's process"
            page_a, page_b = os.stat(anon / "quickstart.mdx"), os.stat(billing / "quickstart.mdx")
            assert page_a.st_ino == page_b.st_ino
            for mountpoint in (anon, other, billing):
                assert (mountpoint / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
    finally:
        for path in mounts_under(tmp_path):
            if path not in (first, second):
                unmount(path)
        unmount(first)
        unmount(second)


def test_the_server_reports_each_class_of_the_shared_mount(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path, tmp_path: Path
) -> None:
    from test_sessions import _scrape

    port = free_port()
    chroma = sample_chroma("public")
    with running_shared_server(tmp_path / "server", tmp_path, class_idle_s=IDLE_S, metrics_port=port) as server:
        anon, billing = tmp_path / "anon", tmp_path / "billing"
        # not warmed: the warm-up's reads count as requests of its view
        open_session(anon, [*session_args(chroma, server, None, secret_file), *NO_WARM])
        open_session(billing, [*session_args(chroma, server, token_file(["billing"]), secret_file), *NO_WARM])
        assert run(["grep", "-rl", "token", str(anon)]).returncode == 0
        assert run(["ls", str(billing)]).returncode == 0
        read_at = time.time()
        for pid in shared_processes(server):
            fresh_status(pid, read_at)  # its status counts those reads
        metrics = _scrape(port)
        assert metrics[("chromafs_mountd_classes", ())] == 2
        readers = {dict(labels)["class"]: dict(labels)["reader"] for (name, labels) in metrics
                   if name == "chromafs_class_sessions"}  # fmt: skip
        files = {readers[dict(labels)["class"]]: value for (name, labels), value in metrics.items()
                 if name == "chromafs_class_visible_files"}  # fmt: skip
        assert files == {
            "anonymous": len(expected_visible(SAMPLE_SITE, "public", None)),
            "user=? groups=billing": len(expected_visible(SAMPLE_SITE, "public", {"billing"})),
        }
        served = {readers[dict(labels)["class"]]: value for (name, labels), value in metrics.items()
                  if name == "chromafs_class_requests_total"}  # fmt: skip
        assert served["anonymous"] > served["user=? groups=billing"] > 0


@pytest.mark.expect_log(r"(ERROR|WARNING) .*page broken\.md (is corrupt|failed its checks)")
def test_a_tree_without_sizes_reads_whole_and_a_broken_page_fails_with_eio(
    server: SharedServer, secret_file: Path, tmp_path: Path
) -> None:
    """A collection written by another tool: its tree gives no sizes. The serving mount runs in
    no-open mode, where the kernel clamps reads to the size it holds, so a size is learned when
    the kernel asks for it: every page reads whole, `stat` gives its real size, and a page that
    cannot be put together fails with EIO (stat and read), never as an empty file."""
    from test_backends import PAGES, _minimal_collection

    tree = {key: {"isPublic": not key.startswith("secret"), "groups": []} for key in PAGES}
    tree["broken.md"] = {"isPublic": True, "groups": []}
    records = [(key, i, text) for key, chunks in PAGES.items() for i, text in enumerate(chunks)]
    records += [("broken.md", 0, "first"), ("broken.md", 2, "third")]  # chunk 1 is missing
    _minimal_collection(tmp_path / "chroma", "minimal", json.dumps(tree), records)
    session = tmp_path / "session"
    open_session(session, [*session_args(tmp_path / "chroma", server, None, secret_file, site="minimal"), *NO_WARM])
    assert control(server, {"op": "describe"})["kernel_open"] == "skipped"  # chromafs's pyfuse3 build
    grep = run(["grep", "-rn", "Verify", str(session)])  # a page nobody read yet: every byte
    assert f"{session}/guide/setup.mdx:7:## Verify" in grep.stdout, grep.stdout + grep.stderr
    for key, chunks in PAGES.items():
        if key.startswith("secret"):
            assert not (session / key).exists()
            continue
        expected = "\n".join(chunks).encode()
        assert os.stat(session / key).st_size == len(expected), key
        assert (session / key).read_bytes() == expected
        assert run(["cat", str(session / key)]).stdout.encode() == expected
    for attempt in (os.stat, Path.read_bytes):
        with pytest.raises(OSError) as info:
            attempt(session / "broken.md")  # type: ignore[operator]
        assert info.value.errno == errno.EIO
    assert (session / "intro.md").read_bytes().startswith(b"# Intro")  # the mount is still fine


def test_the_shared_mounts_top_listings_follow_classes_coming_and_going(
    server: SharedServer,
    sample_chroma: Callable[[str], Path],
    token_file: Callable[..., Path],
    secret_file: Path,
    tmp_path: Path,
) -> None:
    """In no-open mode the kernel caches every listing, the top two levels of the serving mount
    (root only) included: they are dropped as classes come and go."""
    chroma = sample_chroma("public")
    anon, billing = tmp_path / "anon", tmp_path / "billing"
    open_session(anon, [*session_args(chroma, server, None, secret_file), *NO_WARM])
    [site] = os.listdir(server.shared)
    assert len(os.listdir(server.shared / site)) == 1
    open_session(billing, [*session_args(chroma, server, token_file(["billing"]), secret_file), *NO_WARM])
    assert os.listdir(server.shared) == [site] and len(os.listdir(server.shared / site)) == 2
    unmount(billing)
    wait_until(lambda: len(os.listdir(server.shared / site)) == 1, 30, "the class's view removed from the listing")
    unmount(anon)
    wait_until(lambda: not os.path.exists(server.shared) or not os.listdir(server.shared), 30, "an empty root")


NOBODY = 65534


def control_as(uid: int, server: SharedServer, request: dict) -> tuple[bytes, str]:
    """`request` sent to the serving process's control socket from a child running as `uid` (and
    group `uid`, no others), which reaches the socket through the class root as its working
    directory: (every byte it was answered, how the connection ended: "closed" when the
    process closed it, "timeout" when it stayed open)."""

    def job() -> tuple[int, bytes]:
        answer = b""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect("serving.sock")
            try:
                sock.sendall(json.dumps(request).encode() + b"\n")
                while chunk := sock.recv(65536):
                    answer += chunk
                ended = b"closed"
            except (BrokenPipeError, ConnectionResetError):  # closed with our request unread
                ended = b"closed"
            except TimeoutError:
                ended = b"timeout"
        return 0, ended + b" " + answer

    code, outcome = in_child_as(uid, uid, server.class_root, job)
    assert code == 0, outcome.decode(errors="replace")
    ended, _, answer = outcome.partition(b" ")
    return answer, ended.decode()


@pytest.mark.expect_log(r"WARNING .*refused a control connection from uid")
def test_the_control_socket_answers_no_other_user(
    server: SharedServer, sample_chroma: Callable[[str], Path], secret_file: Path, tmp_path: Path
) -> None:
    """The control socket is root's alone (0600 in a 0700 class root); opened to everyone here,
    so that the serving process's own check of the peer's uid is what a connection from nobody
    meets: closed without an answer, and logged. Root is still answered afterwards."""
    anon = tmp_path / "anon"
    open_session(anon, [*session_args(sample_chroma("public"), server, None, secret_file), *NO_WARM])
    sock = server.class_root / "serving.sock"
    assert sock.stat().st_mode & 0o777 == 0o600
    server.class_root.chmod(0o711)
    sock.chmod(0o666)
    answer, ended = control_as(NOBODY, server, {"op": "describe"})
    assert (answer, ended) == (b"", "closed"), "the control socket answered uid 65534"
    log = server.class_root / "serving.log"
    wait_until(
        lambda: f"refused a control connection from uid {NOBODY}" in log.read_text(), 10, f"the refusal in {log}"
    )
    assert control(server, {"op": "describe"})["ok"] is True
    assert (anon / "quickstart.mdx").read_bytes() == (SAMPLE_SITE / "quickstart.mdx").read_bytes()
