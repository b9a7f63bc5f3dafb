"""The "sessions" figure: sessions in production shape (chroma run, Redis, chromafs-mountd as root
with its own defaults: every reader class a view of one of its pool of serving processes), side by
side with tmpfs.

For one corpus: how long a later session of a served class takes (chromafs-mount --mountd, then
`ls`, p50/p90; and the server's own part, from its log); the PSS the server and its serving
processes add per extra session; a new class's first `grep -rl` with a warm Redis (racing its
view's background warm-up), and a later session's first `grep -rl` once another session of its
class grepped, each as a ratio to tmpfs; that sessions of four classes (anonymous, signed in, admin,
billing) see exactly their pages; that an expired session stops within 5 s while the others go
on; and that unmounting one session leaves the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt

from bench_lib import corpus as corpora
from bench_lib import measure
from bench_lib.mounts import _smaps_rollup
from bench_lib.procs import run_timed, subtree
from harness.processes import BIN, mounts_under, unmount, wait_gone
from harness.servers import MountServer

SECRET = "bench-secret-0123456789abcdef0123456789"
SESSIONS_FOR_MEMORY = 16
BOOT_RUNS = 20
SHELL_RUNS = 20
EXPIRY_BOUND_S = 5.0


def _token(site: str, groups: list[str] | None, exp: float) -> str:
    claims: dict[str, Any] = {"sub": "bench", "site": site, "exp": int(exp)}
    if groups is not None:
        claims["groups"] = groups
    return jwt.encode(claims, SECRET, algorithm="HS256")


class PoolServer(MountServer):
    """chromafs-mountd as harness.servers starts it (socket, log, class root, --class-idle), with the
    server's own pool of serving processes (one per core) unless `serving_processes` is given."""

    def __init__(self, folder: Path, class_idle_s: float, serving_processes: int | None = None) -> None:
        super().__init__(folder, class_idle_s=class_idle_s)
        self.serving_processes = serving_processes

    def argv(self) -> list[str]:
        pool = [] if self.serving_processes is None else ["--serving-processes", str(self.serving_processes)]
        return [*super().argv(), *pool]


def describe_pool(class_root: Path) -> list[dict[str, Any]]:
    """What each serving process of the pool says of itself (its control socket's "describe":
    views, requests answered by operation, pages cached)."""
    described = []
    for sock_path in sorted(class_root.glob("shared*.sock")):
        with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(sock_path))
            sock.sendall(b'{"op": "describe"}\n')
            answer = b""
            while not answer.endswith(b"\n") and (chunk := sock.recv(1 << 20)):
                answer += chunk
            described.append(json.loads(answer))
    return described


def stop_server(server: MountServer, folder: Path, sessions: Path) -> None:
    """Unmount the sessions under `sessions`, stop the server, unmount its serving processes'
    mounts and anything else under `folder`, and wait for every process that was under the server
    (its forker, the serving processes: they outlive it; SIGKILL to those left after 30 s)."""
    from chromafs_fuse.serving.process import process_start

    pid = server.proc.pid if server.proc is not None and server.proc.poll() is None else None
    daemons = {child: process_start(child) for child in subtree(pid)} if pid is not None else {}
    for path in mounts_under(sessions):
        unmount(path)
    server.stop()
    server.unmount_classes()
    for path in mounts_under(folder):  # anything a late request left
        unmount(path)
    _wait_daemons(daemons)


SESSION_LINE = re.compile(r"session on (?P<mountpoint>\S+): .*\((?P<ms>[0-9.]+) ms\)$")


class Sessions:
    """Sessions of one chromafs-mountd (its pool: the server's default unless `serving_processes`)
    at `workdir`/session-N."""

    def __init__(
        self,
        workdir: Path,
        site: str,
        backend: list[str],
        class_idle_s: float = 600,
        serving_processes: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.site = site
        self.server = PoolServer(workdir, class_idle_s, serving_processes)
        self.secret = workdir / "secret"
        self.secret.write_text(SECRET)
        self.backend = backend
        self.count = 0

    def open(
        self, groups: list[str] | None = None, exp: float | None = None, site: str = "", flags: tuple[str, ...] = ()
    ) -> tuple[Path, float]:
        """A new session (of `site`, default the one given at start; `flags`: more chromafs-mount flags);
        (mountpoint, seconds from starting chromafs-mount until `ls` is done)."""
        self.count += 1
        site = site or self.site
        mountpoint = self.workdir / f"session-{self.count}"
        mountpoint.mkdir()
        argv = [str(BIN / "chromafs-mount"), str(mountpoint), "--site", site, *self.backend, *flags]
        argv += ["--mountd", str(self.server.socket), "--jwt-secret-file", str(self.secret)]
        if groups is not None or exp is not None:
            token = self.workdir / f"token-{self.count}"
            token.write_text(_token(site, groups, exp or time.time() + 3600))
            argv += ["--token-file", str(token)]
        started = time.perf_counter()
        done = run_timed(argv)
        if done.returncode != 0:
            raise RuntimeError(f"session mount failed: {done.stderr.decode().strip()}")
        listed = run_timed(["ls", str(mountpoint)])
        took = time.perf_counter() - started
        if listed.returncode != 0:
            raise RuntimeError(f"ls of a new session failed: {listed.stderr.decode().strip()}")
        return mountpoint, took

    def shell_argv(self, script: str) -> list[str]:
        """`chromafs shell` for an anonymous reader, running `bash -c script`."""
        argv = [str(BIN / "chromafs"), "shell", "--site", self.site, *self.backend]
        argv += ["--mountd", str(self.server.socket), "--jwt-secret-file", str(self.secret)]
        return [*argv, "--", "bash", "-c", script]

    def serving_pids(self) -> list[int]:
        """The server and every process under it: its forker and the pool's serving processes."""
        if self.server.proc is None or self.server.proc.poll() is not None:
            return []
        return [self.server.proc.pid, *subtree(self.server.proc.pid)]

    def serving_pss_kb(self) -> int:
        """PSS of the server and every process under it."""
        total = 0
        for pid in self.serving_pids():
            with contextlib.suppress(OSError, KeyError):
                total += _smaps_rollup(pid)["pss"]
        return total

    def server_times(self, mountpoints: list[Path] | None = None) -> list[float]:
        """The server's own seconds per session (its log's "session on MOUNTPOINT: ... (N ms)":
        from the request read to the bind done), of `mountpoints` (default: every session)."""
        wanted = None if mountpoints is None else {str(m) for m in mountpoints}
        times = []
        for line in self.server.log.read_text(errors="replace").splitlines():
            found = SESSION_LINE.search(line)
            if found and (wanted is None or found["mountpoint"] in wanted):
                times.append(float(found["ms"]) / 1000)
        return times

    def close(self) -> None:
        """Unmount every session, stop the server and everything under it."""
        stop_server(self.server, self.workdir, self.workdir)


def _wait_daemons(daemons: dict[int, int | None], timeout_s: float = 30.0) -> None:
    """Wait for the daemons to exit, reaping those we adopted (a subreaper); SIGKILL the ones
    left, if still the same process (pid and start time)."""
    from chromafs_fuse.serving.process import process_start

    deadline = time.monotonic() + timeout_s
    left = dict(daemons)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if wait_gone(pid, 0):
                del left[pid]
        time.sleep(0.05)
    for pid, started in left.items():
        if started is not None and process_start(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def first_line_s(argv: list[str], pass_fds: tuple[int, ...] = ()) -> float:
    """Seconds from starting argv until its first line of output."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    took = time.perf_counter() - started
    _, err = proc.communicate()
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"{argv[0]} failed: {err.decode().strip()}")
    return took


def sandbox_over(folder: Path, script: str) -> list[float]:
    """The same bubblewrap sandbox `chromafs shell` makes, over a plain folder: its floor."""
    from chromafs_fuse.frontends.sandbox import Sandbox, seccomp_program, write_etc

    with tempfile.TemporaryDirectory() as etc:
        write_etc(etc, "agent", 1000)
        seccomp = os.memfd_create("seccomp", 0)
        try:
            os.write(seccomp, seccomp_program())
            times = []
            for _ in range(SHELL_RUNS):
                os.lseek(seccomp, 0, os.SEEK_SET)
                argv = Sandbox(str(folder), etc, ["bash", "-c", script], seccomp_fd=seccomp).bwrap_argv()
                times.append(first_line_s(argv, (seccomp,)))
            return times
        finally:
            os.close(seccomp)


def _visible_sets(chroma_dir: Path, site: str) -> dict[str, set[str]]:
    from chromafs_fuse.access import Principal, visible_entries
    from chromafs_fuse.tree import parse_tree

    entries = parse_tree(corpora.tree_document(chroma_dir, site)).entries
    readers = {
        "anonymous": Principal.anonymous(),
        "signed-in": Principal.of([]),
        "admin": Principal.of(["admin"]),
        "billing": Principal.of(["billing"]),
    }
    return {name: set(visible_entries(entries, p)) for name, p in readers.items()}


def measure_sessions(
    run: Any, corpus: corpora.Corpus, backend: list[str], chroma_dir: Path, tag: str = ""
) -> dict[str, Any]:
    workdir = run.tmp / f"{corpus.site}-sessions{tag}"
    workdir.mkdir()
    sessions = Sessions(workdir, corpus.site, backend, serving_processes=run.args.serving_processes)
    grep = measure.command_of("grep -rl")
    out: dict[str, Any] = {"serving_processes": run.args.serving_processes or "the server's default (one per core)"}
    assert corpus.tmpfs_copy is not None
    tmpfs_grep = min(measure.run_tool(grep, corpus.tmpfs_copy)[0] for _ in range(3))
    out["tmpfs_grep_s"] = tmpfs_grep
    try:
        sessions.server.start()
        # a class's first session (a serving process started, the class's view added and its
        # warm-up begun in the background), then that class's first grep, Redis warm (primed by
        # the other systems, else by this read), racing the warm-up
        first, out["first_session_s"] = sessions.open()
        out["class_first_grep_s"] = measure.run_tool(grep, first)[0]
        # a later session of that class, its first grep right after (the kernel holds the pages)
        second, _ = sessions.open()
        out["second_session_first_grep_s"] = measure.run_tool(grep, second)[0]
        out["class_first_grep_ratio"] = out["class_first_grep_s"] / tmpfs_grep
        out["second_session_grep_ratio"] = out["second_session_first_grep_s"] / tmpfs_grep
        booted = [sessions.open() for _ in range(BOOT_RUNS)]
        boots = [took for _, took in booted]
        out["new_session_p50_s"] = measure.percentile(boots, 50)
        out["new_session_p90_s"] = measure.percentile(boots, 90)
        own = sessions.server_times([mountpoint for mountpoint, _ in booted])
        if own:
            out["new_session_server_p50_s"] = measure.percentile(own, 50)
            out["new_session_server_p90_s"] = measure.percentile(own, 90)
        # chromafs shell: start to the first line of `ls /docs` in its sandbox, next to the same
        # sandbox over the tmpfs copy
        shells = [first_line_s(sessions.shell_argv("ls /docs")) for _ in range(SHELL_RUNS)]
        floor = sandbox_over(corpus.tmpfs_copy, "ls /docs")
        out["shell_p50_s"], out["shell_p90_s"] = measure.percentile(shells, 50), measure.percentile(shells, 90)
        out["tmpfs_sandbox_p90_s"] = measure.percentile(floor, 90)
        out["shell_ratio_p90"] = out["shell_p90_s"] / out["tmpfs_sandbox_p90_s"]
        before = sessions.serving_pss_kb()
        for _ in range(SESSIONS_FOR_MEMORY):
            mountpoint, _ = sessions.open()
            run_timed(["ls", "-R", str(mountpoint)])
        after = sessions.serving_pss_kb()
        out["pss_per_extra_session_kb"] = (after - before) / SESSIONS_FOR_MEMORY
        # 0 leaks: sessions of four classes each show exactly their pages
        expected = _visible_sets(chroma_dir, corpus.site)
        groups = {"anonymous": None, "signed-in": [], "admin": ["admin"], "billing": ["billing"]}
        leaks = 0
        new_classes = []  # a session of a class not served yet, of a site served already
        for name, wanted in expected.items():
            mountpoint, took = sessions.open(groups[name])
            if name != "anonymous":
                new_classes.append(took)
            shown = run_timed(["find", str(mountpoint), "-type", "f"]).stdout.decode().split("\n")
            got = {line[len(str(mountpoint)) + 1 :] for line in shown if line}
            leaks += len(got - wanted)
            if got != wanted:
                run.problems.append(f"sessions: {name} shows {len(got)} files, expected {len(wanted)}")
        out["leaks"] = leaks
        out["new_class_session_s"] = new_classes
        pool = describe_pool(sessions.server.class_root)
        out["serving_processes_running"] = len(pool)
        out["class_views"] = sum(len(p.get("views") or {}) for p in pool)
        # expiry: one session of the anonymous class expires; the others go on
        exp = int(time.time()) + 3
        expiring, _ = sessions.open([], exp=exp)
        keeper, _ = sessions.open([])
        while expiring in mounts_under(workdir):
            if time.time() > exp + 30:
                break
            time.sleep(0.05)
        out["expiry_stop_after_exp_s"] = round(time.time() - exp, 2)
        out["others_after_expiry_ok"] = run_timed(["ls", str(keeper)]).returncode == 0
        unmount(second)
        out["others_after_unmount_ok"] = run_timed(["ls", str(first)]).returncode == 0
        out["sessions_opened"] = sessions.count
    finally:
        sessions.close()
    out["bars"] = {
        "new_session_p90_le_50ms": out.get("new_session_p90_s", 1) <= 0.05,
        "shell_p90_le_100ms": out.get("shell_p90_s", 1) <= 0.1,
        "pss_per_session_le_2MiB": out.get("pss_per_extra_session_kb", 1e9) <= 2048,
        "later_session_grep_le_1.5x_tmpfs": out.get("second_session_grep_ratio", 1e9) <= 1.5,
        "class_first_grep_le_3x_tmpfs": out.get("class_first_grep_ratio", 1e9) <= 3,
        "no_leaks": out.get("leaks", 1) == 0,
        "new_class_session_le_0.5s": max(out.get("new_class_session_s") or [1e9]) <= 0.5,
        "expiry_le_5s": out.get("expiry_stop_after_exp_s", 1e9) <= EXPIRY_BOUND_S,
    }
    return out


def text_lines(result: dict[str, Any]) -> list[str]:
    if not result:
        return []
    own = (
        f" (the server's own: p50 {result['new_session_server_p50_s'] * 1000:.1f} ms, "
        f"p90 {result['new_session_server_p90_s'] * 1000:.1f} ms)"
        if "new_session_server_p50_s" in result
        else ""
    )
    tmpfs_ms = result["tmpfs_grep_s"] * 1000
    return [
        f"  chromafs-mountd --serving-processes: {result.get('serving_processes', '?')}; "
        f"{result.get('serving_processes_running', '?')} serving processes, "
        f"{result.get('class_views', '?')} class views",
        f"  later session (mount + ls): p50 {result['new_session_p50_s'] * 1000:.1f} ms, "
        f"p90 {result['new_session_p90_s'] * 1000:.1f} ms{own}; a class's first session (on a new server: "
        f"its serving process started): {result['first_session_s'] * 1000:.0f} ms",
        f"  chromafs shell to the first line of `ls /docs`: p50 {result['shell_p50_s'] * 1000:.1f} ms, "
        f"p90 {result['shell_p90_s'] * 1000:.1f} ms; the same sandbox over tmpfs: p90 "
        f"{result['tmpfs_sandbox_p90_s'] * 1000:.1f} ms ({result['shell_ratio_p90']:.1f}x)",
        f"  PSS per extra session: {result['pss_per_extra_session_kb']:.0f} kB",
        f"  grep -rl: tmpfs {tmpfs_ms:.0f} ms; a new class's first (warm Redis) "
        f"{result['class_first_grep_s'] * 1000:.0f} ms = {result['class_first_grep_ratio']:.2f}x tmpfs; "
        f"a later session's first {result['second_session_first_grep_s'] * 1000:.0f} ms = "
        f"{result['second_session_grep_ratio']:.2f}x tmpfs",
        "  a new class's first session (its site served): "
        + ", ".join(f"{took * 1000:.0f} ms" for took in result.get("new_class_session_s", [])),
        f"  leaks: {result['leaks']}; expired session gone {result['expiry_stop_after_exp_s']:.2f} s after exp; "
        f"others fine after expiry/unmount: {result['others_after_expiry_ok']}/{result['others_after_unmount_ok']}",
        "  bars: " + ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in result["bars"].items()),
    ]
