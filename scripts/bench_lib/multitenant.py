"""The "mountd" figure: chromafs-mountd as a multi-tenant host, run with its own defaults (its pool
of serving processes, one per core, unless `scripts/bench --serving-processes N`). Sites are the bundled sample site
under other names; every session is a real `chromafs-mount --mountd` request, timed until an
`ls` of it is done. Four cases, each on a server of its own:

1. Head-of-line: sites alpha and beta, each in a `chroma run` of its own (alpha without Redis, so
   nothing of it can come from there; beta with Redis), sessions with `--backend-timeout 5`. One
   session of each site first; then alpha's Chroma is frozen (SIGSTOP) and a session of alpha on
   a new class is asked for in the background (other groups, and one mount setting of its own,
   --cache-timeout, so that in any design it loads the site's tree from Chroma, and hangs there).
   While it hangs: (a) a session of beta's running class, (b) a session of a new class of beta,
   (c) a session opened just before the freeze whose token's `exp` falls ~2 s after it: the time
   from `exp` until its mountpoint is no longer mounted. Alpha's Chroma is resumed (SIGCONT)
   whatever happens, and what then became of alpha's pending session is reported.
2. Burst: 20 sites (one real ingest, its records copied under 20 names on one `chroma run`, its
   tree published to Redis: site_copies.py) x 2 reader classes (anonymous, signed in): 40
   sessions of 40 new classes from 20 clients at once, then 40 more of the same classes.
3. Kill: with the burst's sessions, every serving process (the processes under the server titled
   `chromafs-serving <class root>` or `chromafs-mount <class root>/...`) is SIGKILLed; per session,
   the time until a listing of its own mountpoint and a read of one known file succeed again;
   then whether each session's mountpoint is in /proc/self/mountinfo exactly once (nothing
   stacked, nothing lost).
4. Processes: the processes under chromafs-mountd with 2 sites x 2 classes, then 12 x 2.
5. Many sessions (many_sessions.py): `--mountd-sessions` (10,000) over 200 classes, then a later
   session's time, its server-side time and expiry among them all.

Every wait is bounded: a figure the code does not reach is printed as such, and the run goes on.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_lib import measure
from bench_lib.corpus import SAMPLE
from bench_lib.many_sessions import lines as many_lines
from bench_lib.many_sessions import many_sessions
from bench_lib.mount_server import Host, Opened, cmdline, mount_counts
from bench_lib.procs import run_timed
from bench_lib.site_copies import SiteCopier
from chromafs_fuse.serving.mounttable import is_mounted
from harness.processes import ingest
from harness.servers import ChromaServer, RedisServer, Server

KNOWN_FILE = "quickstart.mdx"  # public (docs.json navigation): every class sees it
CLASSES: dict[str, list[str] | None] = {"anonymous": None, "signed-in": []}
HOL_FLAGS = ("--backend-timeout", "5")
NEW_SETTING = ("--cache-timeout", "3599")  # alpha's pending class: a mount setting of its own
HOL_TIMEOUT_S = 15.0  # each of (a) and (b)
HOL_SETTLE_S = 1.0  # after asking for alpha's session, before timing beta's
EXPIRY_WAIT_S = 10.0  # after exp
PENDING_WAIT_S = 90.0  # alpha's pending session, from its request (its client waits 5 * 3 + 60 s)
BURST_SITES = 20
BURST_CLIENTS = 20
BURST_TIMEOUT_S = 60.0
RECOVERY_TIMEOUT_S = 20.0
RECOVERY_BOUND_S = 5.0
PROCESS_STEPS = (2, 12)  # sites, each with 2 classes
SETTLE_S = 2.0

BARS = {
    "hol_running_class_s": 0.1,
    "hol_new_class_s": 1.0,
    "hol_expiry_s": 1.5,
    "burst_new_p90_s": 0.3,
    "burst_same_p90_s": 0.05,
    "extra_processes": 2,
}


def measure_mountd(run: Any) -> dict[str, Any]:
    root = run.tmp / "mountd-figure"
    root.mkdir()
    out: dict[str, Any] = {"serving_processes": run.args.serving_processes or "the server's default (one per core)"}
    servers: list[Server] = []
    alpha_chroma: ChromaServer | None = None
    try:
        redis = RedisServer(root / "redis")
        servers.append(redis)
        redis.start()
        shared_chroma = ChromaServer(root / "chroma-shared")
        servers.append(shared_chroma)
        shared_chroma.start()
        alpha_chroma = ChromaServer(root / "chroma-alpha")
        servers.append(alpha_chroma)
        alpha_chroma.start()
        started = time.perf_counter()
        ingest(SAMPLE, "--site", "alpha", "--chroma-url", alpha_chroma.url, "--quiet")
        beta_backend = ["--chroma-url", shared_chroma.url, "--redis-url", redis.url]
        ingest(SAMPLE, "--site", "beta", *beta_backend, "--quiet")
        ingest(SAMPLE, "--site", "tenant", *beta_backend, "--quiet")
        copier = SiteCopier(shared_chroma.url, "tenant", redis.url)
        sites = [f"tenant-{i:02d}" for i in range(max(BURST_SITES, PROCESS_STEPS[-1]))]
        for site in sites:
            copier.copy(site)
        out["setup_s"] = round(time.perf_counter() - started, 1)
        run.say(f"mountd: alpha, beta and {len(sites)} tenant sites ingested in {out['setup_s']} s")
        alpha_backend = ["--chroma-url", alpha_chroma.url]
        cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("head_of_line", lambda: head_of_line(run, root, alpha_chroma, alpha_backend, beta_backend)),
            ("burst_and_kill", lambda: burst_and_kill(run, root, sites[:BURST_SITES], beta_backend)),
            ("processes", lambda: processes(run, root, sites, beta_backend)),
        ]
        if run.args.mountd_sessions:
            count = run.args.mountd_sessions
            cases.append(("many_sessions", lambda: many_sessions(run, root, sites[:BURST_SITES], beta_backend, count)))
        for name, case in cases:
            try:
                out[name] = case()
            except Exception as exc:  # a case that cannot run says so; the others still run
                out[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
                run.problems.append(f"mountd {name}: {out[name]['error']}")
            for line in case_lines(name, out[name]):
                run.say(f"mountd:{line}")
    finally:
        if alpha_chroma is not None and alpha_chroma.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(alpha_chroma.proc.pid, signal.SIGCONT)
        for server in reversed(servers):
            server.stop()
    return out


# -- 1. head-of-line ------------------------------------------------------------------------------


class GoneWatcher(threading.Thread):
    """Polls whether `path` is still mounted until `deadline` (wall clock); when it went."""

    def __init__(self, path: Path, deadline: float) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.deadline = deadline
        self.gone_at: float | None = None

    def run(self) -> None:
        while time.time() < self.deadline:
            if not is_mounted(self.path):
                self.gone_at = time.time()
                return
            time.sleep(0.02)


def head_of_line(run: Any, root: Path, alpha_chroma: ChromaServer, alpha: list[str], beta: list[str]) -> dict[str, Any]:
    alpha, beta = [*alpha, *HOL_FLAGS], [*beta, *HOL_FLAGS]
    host = Host(root / "head-of-line", run.args.serving_processes)
    out: dict[str, Any] = {}
    assert alpha_chroma.proc is not None
    chroma_pid = alpha_chroma.proc.pid
    try:
        host.start()
        firsts = {
            "alpha anonymous": host.open("alpha", alpha),
            "beta anonymous": host.open("beta", beta),
            "beta signed-in": host.open("beta", beta, groups=[]),
        }
        out["first_sessions_s"] = {name: opened.seconds for name, opened in firsts.items()}
        failed = {name: opened.error for name, opened in firsts.items() if not opened.ok}
        if failed:
            raise RuntimeError(f"first sessions failed: {failed}")
        # (c)'s session, of a running class of beta: its exp 2-3 s after the freeze below
        exp = int(time.time()) + 3
        expiring = host.open("beta", beta, groups=[], exp=exp)
        if not expiring.ok:
            raise RuntimeError(f"the expiring session failed: {expiring.error}")
        watcher = GoneWatcher(expiring.mountpoint, exp + EXPIRY_WAIT_S)
        watcher.start()
        pending_point, pending = None, None
        os.kill(chroma_pid, signal.SIGSTOP)
        try:
            frozen_at = time.time()
            out["exp_after_freeze_s"] = round(exp - frozen_at, 2)
            pending_point, pending = host.open_in_background("alpha", alpha, ["admin"], NEW_SETTING)
            pending_started = time.monotonic()
            time.sleep(HOL_SETTLE_S)
            out["alpha_pending_when_timed"] = pending.poll() is None
            # (a) and (b) asked at once, so both are asked while alpha's request hangs
            with ThreadPoolExecutor(2) as pool:
                asked_a = pool.submit(host.open, "beta", beta, timeout_s=HOL_TIMEOUT_S)
                asked_b = pool.submit(host.open, "beta", beta, groups=["billing"], timeout_s=HOL_TIMEOUT_S)
                a, b = asked_a.result(), asked_b.result()
            out["alpha_still_pending_after"] = pending.poll() is None
            watcher.join(max(0.0, watcher.deadline - time.time()) + 1)
            out["frozen_s"] = round(time.time() - frozen_at, 1)
        finally:
            os.kill(chroma_pid, signal.SIGCONT)
            out["alpha_ended_while_frozen"] = pending is not None and pending.poll() is not None
        out["running_class_s"], out["running_class_error"] = a.seconds, a.error
        out["new_class_s"], out["new_class_error"] = b.seconds, b.error
        out["expiry_s"] = None if watcher.gone_at is None else round(watcher.gone_at - exp, 3)
        out["expiry_waited_s"] = EXPIRY_WAIT_S
        out["alpha_pending"] = _pending_outcome(host, pending_point, pending, pending_started)
    finally:
        host.close()
    out["bars"] = {
        "running_class_le_100ms": _le(out.get("running_class_s"), BARS["hol_running_class_s"]),
        "new_class_le_1s": _le(out.get("new_class_s"), BARS["hol_new_class_s"]),
        "expiry_le_1.5s": _le(out.get("expiry_s"), BARS["hol_expiry_s"]),
    }
    return out


def _pending_outcome(
    host: Host, mountpoint: Path | None, proc: subprocess.Popen[bytes] | None, started: float
) -> dict[str, Any]:
    """What became of alpha's pending session once its Chroma answered again."""
    assert mountpoint is not None and proc is not None
    try:
        _, err = proc.communicate(timeout=max(1.0, PENDING_WAIT_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        host.stop_client(proc)
        return {"outcome": f"no answer {PENDING_WAIT_S:.0f} s after its request (client killed)"}
    took = round(time.monotonic() - started, 1)
    message = err.decode(errors="replace").strip()
    if proc.returncode == 0:
        readable = _probe(mountpoint)
        return {"outcome": "succeeded" + ("" if readable else ", but its mount does not read"), "after_s": took}
    clean = not is_mounted(mountpoint) and len(message.splitlines()) == 1
    return {"outcome": "failed cleanly" if clean else "failed, not cleanly", "after_s": took, "message": message}


# -- 2. burst, 3. kill ------------------------------------------------------------------------------


def _burst(host: Host, requests: list[tuple[str, list[str] | None]], backend: list[str]) -> list[Opened]:
    """Every (site, groups) a session, from BURST_CLIENTS clients at once."""
    go = threading.Event()

    def one(request: tuple[str, list[str] | None]) -> Opened:
        go.wait()
        return host.open(request[0], backend, groups=request[1], timeout_s=BURST_TIMEOUT_S)

    with ThreadPoolExecutor(BURST_CLIENTS) as pool:
        futures = [pool.submit(one, request) for request in requests]
        go.set()
        return [future.result() for future in futures]


def _client_floor(count: int, folder: Path) -> dict[str, Any]:
    """What the clients alone cost on this machine: `count` runs of the venv's Python doing
    nothing, then an `ls` of a plain folder, BURST_CLIENTS at once (no server involved)."""
    go = threading.Event()

    def one(_: int) -> Opened:
        go.wait()
        started = time.perf_counter()
        run_timed([sys.executable, "-c", "pass"])
        run_timed(["ls", str(folder)])
        return Opened(folder, time.perf_counter() - started)

    with ThreadPoolExecutor(BURST_CLIENTS) as pool:
        futures = [pool.submit(one, n) for n in range(count)]
        go.set()
        return _summary([future.result() for future in futures])


def _summary(opened: list[Opened]) -> dict[str, Any]:
    times = [o.seconds for o in opened if o.seconds is not None]
    errors = [o.error for o in opened if o.error is not None]
    out: dict[str, Any] = {"sessions": len(opened), "errors": len(errors), "error_samples": sorted(set(errors))[:3]}
    if times:
        out.update(p50_s=measure.percentile(times, 50), p90_s=measure.percentile(times, 90), max_s=max(times))
    return out


_fresh_names = itertools.count()


SESSION_LINE = re.compile(r"session on (?P<mountpoint>\S+): .*\((?P<ms>[0-9.]+) ms\)$")


def _server_times(host: Host, opened: list[Opened]) -> dict[str, Any]:
    """The server's own time per session (its log line's "(N ms)": from the request read to the
    bind done), without the client process's start-up, which 20 at once on this machine's cores
    cost more than the server does."""
    wanted = {str(o.mountpoint) for o in opened if o.ok}
    times = []
    for line in host.server.log.read_text().splitlines():
        found = SESSION_LINE.search(line)
        if found and found["mountpoint"] in wanted:
            times.append(float(found["ms"]) / 1000)
    if not times:
        return {}
    return {"sessions": len(times), "p50_s": measure.percentile(times, 50), "p90_s": measure.percentile(times, 90)}


def _probe(mountpoint: Path) -> bool:
    """A serving process answers at the session's mountpoint: a lookup of a name never asked
    before answers ENOENT (the kernel's caches cannot answer it: they would serve a listing and a
    read of a dead mount), a listing names the known file, and the file reads whole."""
    try:
        os.stat(mountpoint / f".bench-probe-{next(_fresh_names)}")
        return False  # no such file exists
    except FileNotFoundError:
        pass
    except OSError:
        return False  # ENOTCONN: nobody serves the mount
    try:
        return KNOWN_FILE in os.listdir(mountpoint) and (mountpoint / KNOWN_FILE).read_bytes() == _known()
    except OSError:
        return False


def _known() -> bytes:
    return (SAMPLE / KNOWN_FILE).read_bytes()


def burst_and_kill(run: Any, root: Path, sites: list[str], backend: list[str]) -> dict[str, Any]:
    host = Host(root / "burst", run.args.serving_processes)
    requests = [(site, groups) for groups in CLASSES.values() for site in sites]  # 20 sites' first class first
    out: dict[str, Any] = {"sites": len(sites), "classes": len(requests), "clients": BURST_CLIENTS}
    try:
        host.start()
        first = _burst(host, requests, backend)
        out["new_classes"] = _summary(first)
        out["new_classes"]["server"] = _server_times(host, first)
        run.say(f"mountd: burst of new classes: {_burst_text(out['new_classes'])}")
        second = _burst(host, requests, backend)
        out["same_classes"] = _summary(second)
        out["same_classes"]["server"] = _server_times(host, second)
        run.say(f"mountd: burst of running classes: {_burst_text(out['same_classes'])}")
        out["client_floor"] = _client_floor(len(requests), root / "burst")
        out["kill"] = _kill(host, [o.mountpoint for o in first + second if o.ok])
    finally:
        host.close()
    new, same, kill = out["new_classes"], out["same_classes"], out["kill"]
    out["bars"] = {
        "new_classes_p90_le_300ms_0_errors": _le(new.get("p90_s"), BARS["burst_new_p90_s"]) and new["errors"] == 0,
        "same_classes_p90_le_50ms_0_errors": _le(same.get("p90_s"), BARS["burst_same_p90_s"]) and same["errors"] == 0,
        "kill_all_recover_within_5s": bool(kill.get("sessions")) and kill.get("within_bound") == kill.get("sessions"),
        "kill_each_mountpoint_once": bool(kill.get("sessions")) and kill.get("mounted_once") == kill.get("sessions"),
    }
    return out


def _kill(host: Host, sessions: list[Path]) -> dict[str, Any]:
    healthy = [mountpoint for mountpoint in sessions if _probe(mountpoint)]
    out: dict[str, Any] = {"sessions": len(healthy), "unhealthy_before_kill": len(sessions) - len(healthy)}
    victims = host.serving_children()
    out["killed"] = [title for _, title in victims]
    if not victims:
        out["error"] = "no serving process found under the server"
        return out
    for pid, _ in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    recovered: dict[Path, float] = {}

    def wait_for(mountpoint: Path) -> None:
        deadline = killed_at + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            if _probe(mountpoint):
                recovered[mountpoint] = time.monotonic() - killed_at
                return
            time.sleep(0.05)

    watchers = [threading.Thread(target=wait_for, args=(m,), daemon=True) for m in healthy]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:  # a probe stuck in a dead mount is left behind (a daemon thread)
        watcher.join(max(0.0, killed_at + RECOVERY_TIMEOUT_S + 2 - time.monotonic()))
    times = sorted(recovered.values())
    counts = mount_counts(healthy)
    out.update(
        recovered=len(times),
        within_bound=sum(t <= RECOVERY_BOUND_S for t in times),
        recovery_p50_s=measure.percentile(times, 50) if times else None,
        recovery_max_s=times[-1] if times else None,
        mounted_once=sum(n == 1 for n in counts.values()),
        mounted_never=sum(n == 0 for n in counts.values()),
        mounted_stacked=sum(n > 1 for n in counts.values()),
        serving_after=[title for _, title in host.serving_children()],
    )
    return out


# -- 4. processes -------------------------------------------------------------------------------------


def processes(run: Any, root: Path, sites: list[str], backend: list[str]) -> dict[str, Any]:
    host = Host(root / "processes", run.args.serving_processes)
    out: dict[str, Any] = {"steps": []}
    try:
        host.start()
        served = 0
        for target in PROCESS_STEPS:
            for site in sites[served:target]:
                for groups in CLASSES.values():
                    opened = host.open(site, backend, groups=groups)
                    if not opened.ok:
                        raise RuntimeError(f"a session of {site} failed: {opened.error}")
            served = target
            time.sleep(SETTLE_S)
            pids = host.serving_processes()
            titles = sorted({_short_title(pid) for pid in pids})
            out["steps"].append({"sites": target, "classes": target * len(CLASSES), "processes": len(pids)})
            out["steps"][-1]["kinds"] = titles
    finally:
        host.close()
    steps = out["steps"]
    out["extra_processes"] = (
        steps[-1]["processes"] - steps[0]["processes"] if len(steps) == len(PROCESS_STEPS) else None
    )
    out["bars"] = {"at_most_2_more_processes": _le(out["extra_processes"], BARS["extra_processes"])}
    return out


def _short_title(pid: int) -> str:
    words = cmdline(pid).split()
    return os.path.basename(words[0]) if words else "?"


# -- the text ------------------------------------------------------------------------------------------


def _le(value: float | None, bound: float) -> bool:
    return value is not None and value <= bound


def _ms(value: float | None, missing: str = "-") -> str:
    if value is None:
        return missing
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _yes(flag: object) -> str:
    return "yes" if flag else "NO"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _row(figure: str, value: str, bar: str, ok: bool) -> str:
    return f"    {figure:<50} {value:<40} {bar:<28} {_verdict(ok)}"


def _burst_text(summary: dict[str, Any]) -> str:
    server = summary.get("server") or {}
    own = f" (server's own p50 {_ms(server.get('p50_s'))} / p90 {_ms(server.get('p90_s'))})" if server else ""
    return (
        f"p50 {_ms(summary.get('p50_s'))} / p90 {_ms(summary.get('p90_s'))}, "
        f"{summary['errors']}/{summary['sessions']} errors{own}"
    )


def case_lines(name: str, result: dict[str, Any]) -> list[str]:
    if "error" in result and "bars" not in result:
        return [f"  {name}: could not run: {result['error']}"]
    if name == "many_sessions":
        return many_lines(result)
    bars = result["bars"]
    if name == "head_of_line":
        pending = result.get("alpha_pending", {})
        lines = [
            f"  1 head-of-line: alpha's chroma frozen {result.get('frozen_s', '?')} s; alpha's new-class session "
            f"pending when (a) and (b) were asked (at once): {_yes(result.get('alpha_pending_when_timed'))}",
            _row(
                "(a) beta session, running class",
                _ms(result.get("running_class_s"), result.get("running_class_error") or "-")[:40],
                "bar <= 100 ms",
                bars["running_class_le_100ms"],
            ),
            _row(
                "(b) beta session, new class",
                _ms(result.get("new_class_s"), result.get("new_class_error") or "-")[:40],
                "bar <= 1 s",
                bars["new_class_le_1s"],
            ),
            _row(
                f"(c) `exp` ({result.get('exp_after_freeze_s')} s after the freeze) to unmounted",
                _ms(result.get("expiry_s"), f"still mounted {result.get('expiry_waited_s'):.0f} s after"),
                "bar <= 1.5 s",
                bars["expiry_le_1.5s"],
            ),
            f"    alpha's pending session: {pending.get('outcome')}"
            + (f" {pending['after_s']} s after its request" if "after_s" in pending else "")
            + (" (while still frozen)" if result.get("alpha_ended_while_frozen") else " (after the resume)")
            + (f": {pending['message'][:160]}" if pending.get("message") else ""),
        ]
        return lines
    if name == "burst_and_kill":
        new, same, kill = result["new_classes"], result["same_classes"], result["kill"]
        lines = [
            f"  2 burst: {result['classes']} sessions of new classes ({result['sites']} sites x {len(CLASSES)}), "
            f"{result['clients']} clients at once; then as many of the same classes",
            _row(
                "new classes: p50 / p90, errors",
                _burst_text(new),
                "bar p90 <= 300 ms, 0 errors",
                bars["new_classes_p90_le_300ms_0_errors"],
            ),
            _row(
                "same classes: p50 / p90, errors",
                _burst_text(same),
                "bar p90 <= 50 ms, 0 errors",
                bars["same_classes_p90_le_50ms_0_errors"],
            ),
        ]
        if floor := result.get("client_floor"):
            lines.append(
                f"    (the clients alone, no server: python -c pass + ls, {result['clients']} at once: "
                f"p50 {_ms(floor.get('p50_s'))} / p90 {_ms(floor.get('p90_s'))})"
            )
        samples = new["error_samples"] + same["error_samples"]
        if samples:
            lines.append(f"    errors, e.g.: {samples[0][:200]}")
        killed = kill.get("killed", [])
        lines.append(
            f"  3 kill: {len(killed)} serving processes SIGKILLed "
            f"({', '.join(sorted({t.split()[0] for t in killed})) or 'none found'}), {kill['sessions']} sessions"
        )
        if "error" in kill:
            lines.append(f"    {kill['error']}")
        else:
            recovered = (
                f"{kill['within_bound']}/{kill['sessions']} (p50 {_ms(kill['recovery_p50_s'])}, "
                f"max {_ms(kill['recovery_max_s'])}; {kill['recovered']} within {RECOVERY_TIMEOUT_S:.0f} s)"
            )
            lines.append(
                _row("ls + read work again within 5 s", recovered, "bar all", bars["kill_all_recover_within_5s"])
            )
            once = (
                f"{kill['mounted_once']}/{kill['sessions']} ({kill['mounted_never']} gone, "
                f"{kill['mounted_stacked']} stacked)"
            )
            lines.append(
                _row("mountpoint in mountinfo exactly once", once, "bar all", bars["kill_each_mountpoint_once"])
            )
            lines.append(f"    serving processes after: {len(kill['serving_after'])}")
        return lines
    steps = result["steps"]
    counts = "; ".join(f"{s['sites']} sites x 2 classes: {s['processes']} ({', '.join(s['kinds'])})" for s in steps)
    extra = result.get("extra_processes")
    first, last = PROCESS_STEPS[0], PROCESS_STEPS[-1]
    return [
        f"  4 processes under chromafs-mountd (itself not counted): {counts}",
        _row(
            f"{last} sites x 2 classes against {first} x 2",
            "-" if extra is None else f"{extra:+d}",
            "bar <= +2",
            bars["at_most_2_more_processes"],
        ),
    ]


def text_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"  chromafs-mountd --serving-processes: {result.get('serving_processes', '?')}"]
    if "setup_s" not in result:
        return [*lines, "  did not get as far as its sites"]
    for name in ("head_of_line", "burst_and_kill", "processes", "many_sessions"):
        if name in result:
            lines += case_lines(name, result[name])
    return lines
