"""The readiness handshake between a serving process and whoever waits for it: `READY\n` once
the mount answers, else one line saying why not; and the wait for the mount server's answer on
its socket (serving/protocol.py: `{"ok": true}`, or the failure's kind and message); `ask_line`,
one request line and its answer over a Unix socket. Standard library only: the mount client and
`chromafs search` import it on their fast paths (json only for an error)."""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

READY = b"READY\n"
OK_LINE = b'{"ok": true}\n'


def tell_ready(ready_fd: int | None) -> None:
    """READY to whoever waits on `ready_fd` (None: nobody), once; it may have gone."""
    if ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, READY)
            os.close(ready_fd)


def wait_for_answer(fd: int, wait_s: float) -> tuple[bool, str, str]:
    """Read the mount server's answer from `fd`: (True, "", "") for OK_LINE, else (False, why,
    the failure's kind as errors.py names it)."""
    data = _read_until(fd, wait_s, lambda data: data.endswith(b"\n"))
    if data is None:
        return False, "the mount server did not answer in time", "unavailable"
    if data == OK_LINE:
        return True, "", ""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return False, "the mount server closed the connection", "unavailable"
    import json

    try:
        answer = json.loads(text)
        ok = bool(answer.get("ok"))
        return ok, "" if ok else str(answer.get("error") or ""), "" if ok else str(answer.get("kind") or "internal")
    except (ValueError, AttributeError):
        return False, text, "internal"


def wait_for_ready(fd: int, wait_s: float) -> tuple[bool, str]:
    """Read a daemon's or server's report from `fd`: (True, "") once it says READY, or
    (False, reason) when it reports a failure, closes, or the deadline passes."""
    ok, reason, _kind = ready_report(fd, wait_s)
    return ok, reason


def ready_report(fd: int, wait_s: float) -> tuple[bool, str, str]:
    """As wait_for_ready, with the failure's kind (errors.py): a daemon reports one as a JSON
    line (serving/failures.py)."""
    data = _read_until(fd, wait_s, lambda data: data.startswith(READY))
    if data is None:
        return False, "the daemon did not become ready in time", "unavailable"
    if data.startswith(READY):
        return True, "", ""
    text = data.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        import json

        try:
            report = json.loads(text)
            return False, str(report.get("error") or ""), str(report.get("kind") or "internal")
        except (ValueError, AttributeError):
            pass
    return False, text, "internal"


def _read_until(fd: int, wait_s: float, done: Callable[[bytes], bool]) -> bytes | None:
    """What `fd` gives until `done` says so or it closes; None when `wait_s` passes first."""
    data = b""
    deadline = time.monotonic() + wait_s
    while not done(data):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def ask_line(socket_path: str, request: bytes, answer_s: float, connect_s: float | None = None) -> bytes:
    """One request line over a Unix socket, its answer line back: what the other side wrote
    before its newline or its close (b"" if it closed unanswered); OSError as raised (ENOENT,
    ECONNREFUSED, EACCES: the socket could not be connected to within `connect_s`, default
    `answer_s`)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(answer_s if connect_s is None else connect_s)
        conn.connect(socket_path)
        conn.settimeout(answer_s)
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer
