"""The "mountd" figure's fifth case: many sessions on one host (issue 46: 10,000 sessions over 200
classes). Its own chromafs-mountd with its defaults; `--mountd-sessions N` sessions (10,000 by
default) over 20 sites x 10 reader classes, opened by requests sent straight to the server's
socket from 8 threads of this process (serving/protocol.py's OpenSession, as `chromafs-mount`
sends it: the clients' own start-up, ~0.2 s of interpreter each, is not what is measured here).
The server's own time per request (its log line) is reported for the first and the last thousand.
Then, with all of them open:

- 40 more sessions, each a real `chromafs-mount --mountd` timed until an `ls` of it is done, one
  at a time: p50 / p90, and the server's own time for them;
- 20 sessions whose token's `exp` falls 4 s after they open: from `exp` until each is unmounted;
- the server's memory (PSS) and the host's mount count.

Every session is unmounted in this process at the end (umount2, not a process per mount).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_lib import measure
from bench_lib.density import pss_kb
from bench_lib.mount_server import Host, token
from chromafs_fuse.serving.binds import detach
from chromafs_fuse.serving.handshake import wait_for_answer
from chromafs_fuse.serving.mounttable import is_mounted
from chromafs_fuse.serving.protocol import OpenSession, encode

SITES = 20
CLASSES_PER_SITE = 10  # groups g0..g9
SENDERS = 8
LATER = 40
EXPIRING = 20
EXPIRY_AFTER_S = 4.0
EXPIRY_WAIT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
BARS = {"many_new_p90_s": 0.05, "many_server_p90_s": 0.01, "many_expiry_s": 1.5}
SESSION_LINE = re.compile(r"session on (?P<mountpoint>\S+): .*\((?P<ms>[0-9.]+) ms\)$")


def _ask(socket_path: str, request: OpenSession) -> str | None:
    """One session straight from this process; None once bound, else why not."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(REQUEST_TIMEOUT_S)
        conn.connect(socket_path)
        conn.sendall(encode(request))
        conn.shutdown(socket.SHUT_WR)
        ok, reason, _kind = wait_for_answer(conn.fileno(), REQUEST_TIMEOUT_S)
    return None if ok else reason


def _server_ms(log: Path) -> dict[str, float]:
    """Mountpoint -> the server's own milliseconds for its session (its log line)."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        match = SESSION_LINE.search(line)
        if match:
            found[match["mountpoint"]] = float(match["ms"])
    return found


def _quantiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p90": None, "n": 0}
    return {"p50": measure.percentile(values, 50), "p90": measure.percentile(values, 90), "n": len(values)}


def many_sessions(run: Any, root: Path, sites: list[str], backend: list[str], count: int) -> dict[str, Any]:
    host = Host(root / "many")
    out: dict[str, Any] = {"sessions": count, "classes": SITES * CLASSES_PER_SITE}
    mountpoints: list[Path] = []
    try:
        host.start()
        socket_path = str(host.server.socket)
        options: dict[str, object] = {"--jwt-secret-file": str(host.secret), "--refresh-interval": "0"}
        options |= dict(zip(backend[::2], backend[1::2], strict=True))
        requests = []
        for n in range(count):
            site = sites[n % SITES]
            groups = [f"g{(n // SITES) % CLASSES_PER_SITE}"]
            mountpoint = host.sessions / f"m{n:05d}"
            mountpoint.mkdir()
            mountpoints.append(mountpoint)
            signed = token(site, groups, time.time() + 12 * 3600)
            requests.append(OpenSession(str(mountpoint), {"--site": site, **options}, signed))
        started = time.perf_counter()
        errors: list[str] = []
        done = [0]
        lock = threading.Lock()

        def one(request: OpenSession) -> None:
            why = _ask(socket_path, request)
            with lock:
                done[0] += 1
                if why is not None:
                    errors.append(why)
                if done[0] % 1000 == 0:
                    run.say(f"mountd: many sessions: {done[0]} open ({time.perf_counter() - started:.0f} s)")

        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(one, requests))
        out["open_all_s"] = round(time.perf_counter() - started, 1)
        out["open_errors"] = len(errors)
        out["first_error"] = errors[0] if errors else None
        own = _server_ms(host.server.log)
        in_order = [own[str(m)] / 1000 for m in mountpoints if str(m) in own]
        out["server_first_1000"] = _quantiles(in_order[:1000])
        out["server_last_1000"] = _quantiles(in_order[-1000:])
        with open("/proc/self/mountinfo", "rb") as f:
            out["host_mounts"] = sum(1 for _ in f)
        # later sessions through the real client, one at a time
        later = []
        for n in range(LATER):
            # a class of the bulk's (the same settings: --refresh-interval 0), never a new one
            group = [f"g{n % CLASSES_PER_SITE}"]
            opened = host.open(sites[n % SITES], backend, groups=group, flags=("--refresh-interval", "0"))
            later.append(opened)
            if opened.mountpoint not in mountpoints:
                mountpoints.append(opened.mountpoint)
        own = _server_ms(host.server.log)
        out["later"] = _quantiles([o.seconds for o in later if o.seconds is not None])
        out["later_errors"] = [o.error for o in later if not o.ok][:3]
        out["later_server"] = _quantiles([own[str(o.mountpoint)] / 1000 for o in later if str(o.mountpoint) in own])
        # expiry among them all
        expiring: list[tuple[Path, float]] = []
        for n in range(EXPIRING):
            exp = float(int(time.time() + EXPIRY_AFTER_S) + 1)
            mountpoint = host.sessions / f"x{n:03d}"
            mountpoint.mkdir()
            mountpoints.append(mountpoint)
            request = OpenSession(
                str(mountpoint), {"--site": sites[n % SITES], **options}, token(sites[n % SITES], ["g0"], exp)
            )
            if _ask(socket_path, request) is None:
                expiring.append((mountpoint, exp))
        gone: dict[Path, float] = {}
        deadline = max(exp for _, exp in expiring) + EXPIRY_WAIT_S if expiring else time.time()
        while len(gone) < len(expiring) and time.time() < deadline:
            for mountpoint, exp in expiring:
                if mountpoint not in gone and time.time() >= exp and not is_mounted(mountpoint):
                    gone[mountpoint] = time.time() - exp
            time.sleep(0.02)
        out["expiry"] = {
            "sessions": len(expiring),
            "gone": len(gone),
            "max_s": round(max(gone.values()), 3) if gone else None,
        }
        pid = host.pid
        out["server_pss_mib"] = round(pss_kb([pid]) / 1024, 1) if pid else None
    finally:
        started = time.perf_counter()
        for mountpoint in reversed(mountpoints):
            while detach(str(mountpoint)):
                pass
        out["unmount_s"] = round(time.perf_counter() - started, 1)
        host.close()
    new_p90, server_p90 = out["later"]["p90"], out["later_server"]["p90"]
    expiry = out["expiry"]
    out["bars"] = {
        "many_new_p90": new_p90 is not None and new_p90 <= BARS["many_new_p90_s"],
        "many_server_p90": server_p90 is not None and server_p90 <= BARS["many_server_p90_s"],
        "many_expiry": bool(expiry["sessions"])
        and expiry["gone"] == expiry["sessions"]
        and (expiry["max_s"] or 0) <= BARS["many_expiry_s"],
        "many_no_errors": out["open_errors"] == 0 and not out["later_errors"],
    }
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.1f} ms"


def lines(result: dict[str, Any]) -> list[str]:
    if "error" in result:
        return [f"  5 many sessions: {result['error']}"]
    bars = result["bars"]
    first, last = result["server_first_1000"], result["server_last_1000"]
    later, own, expiry = result["later"], result["later_server"], result["expiry"]
    verdict = {True: "PASS", False: "FAIL"}
    return [
        f"  5 many sessions: {result['sessions']} over {result['classes']} classes, opened in "
        f"{result['open_all_s']} s from {SENDERS} threads, {result['open_errors']} errors; host mounts "
        f"{result['host_mounts']}; server PSS {result['server_pss_mib']} MiB",
        f"    server's own per session: first 1,000 p50 {_ms(first['p50'])} / p90 {_ms(first['p90'])}; "
        f"last 1,000 p50 {_ms(last['p50'])} / p90 {_ms(last['p90'])}",
        f"    {'a later session (chromafs-mount + ls), p50 / p90':50} {_ms(later['p50'])} / {_ms(later['p90'])}"
        f"  bar p90 <= 50 ms  {verdict[bars['many_new_p90']]}",
        f"    {'  its server-side time, p50 / p90':50} {_ms(own['p50'])} / {_ms(own['p90'])}"
        f"  bar p90 <= 10 ms  {verdict[bars['many_server_p90']]}",
        f"    {'`exp` to unmounted, max':50} {_ms(expiry['max_s'])} ({expiry['gone']}/{expiry['sessions']})"
        f"  bar <= 1.5 s  {verdict[bars['many_expiry']]}",
        f"    unmounting every session took {result['unmount_s']} s",
    ]
